"""The course's answers to labs/phase-07/lab-01-sharded-layers/predictions.py.

The lab's tests read this file in place of the student's with `--impl=ref`, and check it
against what the reference computes (labs/labpredict.py). Each comment says why.
"""

# -- before step 2: the README's layers C and R, float32 ------------------------------------
# Each output of C is one dot product over all 96 inputs on either side: the same sum.
COLUMN_TP2_BITWISE_EQUAL = True
# Two partial sums of 48 terms added at the end: another order of the same 96 additions.
ROW_TP2_BITWISE_EQUAL = False
ROW_TP2_WITHIN_1E_4 = True  # the rounding differences are a few units in the last place

# -- before step 4 --------------------------------------------------------------------------
# 2 query heads + 1 k head + 1 v head (the one KV head is replicated, not halved), 16 rows
# each: 64 rows of 64 float32 = 16384 bytes, two thirds of the whole layer, not a half.
QKV_BYTES_PER_RANK = 16384
KV_HEAD_OF_RANK_3 = 1  # rank 3's query heads are 6 and 7; a group is 4 heads: 6 // 4 = 1
