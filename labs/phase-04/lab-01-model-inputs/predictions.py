"""Your predictions for Phase 04, lab 01: fill each in BEFORE you write the step it is for.

Each name is a question of the README; its scenario (steps S1 to S4) is in the README's
section "The scenario". Replace None with your answer: a list of integers, an integer,
or True / False. Then `pytest labs/phase-04/lab-01-model-inputs -m step2 -k predictions`
(step3 likewise) grades that step's answers against the reference, and
`python explore.py` prints what your own code gives beside each answer once it runs.
When a prediction was off, keep the first one in a comment and write down why.
"""

# -- before step 2: the flat inputs ----------------------------------------------------------
S2_POSITIONS = None  # list: the positions of S2's tokens, in flat order
S2_SLOT_MAPPING = None  # list: the slots of S2's tokens
S3_LOGITS_INDICES = None  # list: S3's logits indices
S3_UNIFORM_DECODE = None  # True or False: is S3 a uniform decode?
S4_SLOT_MAPPING = None  # list: the slots of S4's tokens

# -- before step 3: the padding --------------------------------------------------------------
S3_PADDED_NUM_REQS = None  # int: rows of S3 padded to 4 tokens
S4_PADDED_NUM_REQS = None  # int: rows of S4 padded to 4 tokens
S4_PADDED_SEQ_LENS = None  # list: the sequence lengths of S4 padded to 4 tokens
