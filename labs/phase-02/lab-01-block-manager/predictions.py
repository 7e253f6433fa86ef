"""Your predictions for Phase 02, lab 01: fill each in BEFORE you write the step it is for.

Each name is a question of the README (its scenario is in the step's "Predict first").
Replace None with your answer: an integer, True / False, or a list of integers. Then
`pytest labs/phase-02/lab-01-block-manager -m step3 -k predictions` (step5 likewise)
grades that step's answers against the reference, and `python explore.py` prints what
your own code gives beside each answer once it runs. When a prediction was off, keep the
first one in a comment and write down why.
"""

# -- before step 3: growing a table ------------------------------------------------------------
S3_BLOCKS_AT_8 = None  # int: blocks in a's table once 8 of its tokens are computed
S3_CAN_FINISH_PROMPT = None  # True or False: can a then compute its last 2 prompt tokens?
S3_FIRST_REFUSED_POSITION = None  # int: the first position a's decode cannot get a slot for

# -- before step 5: prefix caching -------------------------------------------------------------
S5_B_CACHED_TOKENS = None  # int: num_cached_tokens of b = [1, 2, 3, 4, 1, 2, 3, 4, 0]
S5_EIGHT_TOKENS_CACHED = None  # int: num_cached_tokens of [1, 2, 3, 4, 5, 6, 7, 8]
S5_X_TABLE = None  # list: x's block table
S5_A2_CACHED_TOKENS = None  # int: num_cached_tokens of a2 = list(range(13)) after x
