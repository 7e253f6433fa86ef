"""Your predictions for Phase 02, lab 01: fill each in BEFORE you write the step it is for.

Each name is a question of the README (its scenario is in the step's "Predict first").
Replace None with your answer: an integer, True / False, or a list of integers. Then
`pytest labs/phase-02/lab-01-block-manager -m step3 -k predictions` (step5 likewise)
grades that step's answers against the reference, and `python explore.py` prints what
your own code gives beside each answer once it runs. When a prediction was off, keep the
first one in a comment and write down why.
"""

# -- before step 3: growing a table ------------------------------------------------------------
S3_BLOCKS_AFTER_PROMPT = None  # int: blocks a holds once its prompt step sampled a token
S3_BOTH_DECODE = None  # True or False: can a and b both compute their sampled token next step?
S3_TOKENS_SAMPLED = None  # int: tokens a has sampled in all when can_append(a, 1) first says no

# -- before step 5: prefix caching -------------------------------------------------------------
S5_EIGHT_TOKENS_CACHED = None  # int: num_cached_tokens of [1, 2, 3, 4, 5, 6, 7, 8] after a
S5_B_TABLE = None  # list: b's block table
S5_FREE_AFTER_B = None  # int: num_free_blocks once b is admitted
S5_AFTER_DECODE_CACHED = None  # int: num_cached_tokens of [1, 2, ..., 8, 9] after d's decode
