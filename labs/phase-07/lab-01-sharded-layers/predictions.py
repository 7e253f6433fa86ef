"""Your predictions for Phase 07, lab 01: fill each in BEFORE you write the step it is for.

Each name is a question of the README (its "Predict first" paragraphs give the scenario).
Replace None with your answer: True / False, or a whole number. Then
`pytest labs/phase-07/lab-01-sharded-layers -m step2 -k predictions` (step4 likewise)
grades them against the reference, and `python explore.py` prints what your own code
gives beside each answer once it runs. When a prediction was off, keep the first one in a
comment and write down why.
"""

# -- before step 2: the README's layers C and R, float32 ------------------------------------
COLUMN_TP2_BITWISE_EQUAL = None  # True or False: C's rank slices equal the whole's, bit for bit
ROW_TP2_BITWISE_EQUAL = None  # True or False: R on two ranks equals R on one, bit for bit
ROW_TP2_WITHIN_1E_4 = None  # True or False: ... within an absolute 1e-4 everywhere

# -- before step 4 --------------------------------------------------------------------------
# bytes of rank 1's QKV weight: hidden 64, heads of 16, 4 heads, 1 KV head, 2 ranks, float32
QKV_BYTES_PER_RANK = None
KV_HEAD_OF_RANK_3 = None  # which KV head (0, 1, ...) rank 3 holds: 8 heads, 2 KV heads, 4 ranks
