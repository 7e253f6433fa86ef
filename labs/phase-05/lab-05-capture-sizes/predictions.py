"""Your predictions for Phase 05, lab 05: fill each in BEFORE you write the step it is for.

Each name is a question of the README (the "Predict first" part of steps 1, 3 and 4 gives
the scenario). Replace None with your answer: a whole number, a share as a float
(0.25 for a quarter), or True / False. Then
`pytest labs/phase-05/lab-05-capture-sizes -m step1 -k predictions` (step3, step4 likewise)
grades that step's answers against the reference, and `python explore.py` prints what
your own code gives beside each answer once it runs. When a prediction was off, keep the
first one in a comment and write down why.
"""

# -- before step 1: the default ladder (max_num_batched_tokens=8192 unless said) -------------
S1_NUM_SIZES_256_SEQS = None  # int: how many sizes the ladder of max_num_seqs=256 holds
S1_TOP_RUNG_130_SEQS = None  # int: the largest size of the ladder of max_num_seqs=130
S1_TOP_RUNG_BUDGET_20 = None  # int: the largest size for max_num_seqs=256, a budget of 20

# -- before step 3: the rung lookup ------------------------------------------------------------
S3_RUNG_OF_33 = None  # int: the rung of a batch of 33 on the ladder of max_num_seqs=256
S3_RUNG_OF_257 = None  # int: the rung of a batch of 257 on that ladder
S3_258_HAS_A_GRAPH_AT_130_SEQS = None  # True or False: on the ladder of max_num_seqs=130

# -- before step 4: padding --------------------------------------------------------------------
S4_PADDING_DEFAULT_LADDER = None  # int: padding tokens of trace Q on the default ladder
S4_PADDING_POWERS_OF_TWO = None  # int: padding tokens of trace Q on [1, 2, 4, 8, 16, 32]
S4_WASTE_OF_33 = None  # float: the waste of a one-step trace [33] on the default ladder
