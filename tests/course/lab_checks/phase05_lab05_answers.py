"""The course's answers to labs/phase-05/lab-05-capture-sizes/predictions.py.

The lab's tests read this file in place of the student's with `--impl=ref`, and check it
against what the reference computes (labs/labpredict.py). Each comment says why.
"""

# -- before step 1: the default ladder (max_num_batched_tokens=8192 unless said) -------------
S1_NUM_SIZES_256_SEQS = 51  # largest 512: 1, 2, 4 (3), 8 to 248 by 8 (31), 256 to 512 by 16 (17)
S1_TOP_RUNG_130_SEQS = 256  # largest is 260, off the grid of 16s: 272 is past it, 256 the last
S1_TOP_RUNG_BUDGET_20 = 16  # largest is min(512, 512, 20) = 20; 16 is the last size below it

# -- before step 3: the rung lookup ------------------------------------------------------------
S3_RUNG_OF_33 = 40  # the ladder steps by 8 there: the next size at or above 33 is 40
S3_RUNG_OF_257 = 272  # one past 256, where the ladder steps by 16: 15 padding rows
S3_258_HAS_A_GRAPH_AT_130_SEQS = False  # that ladder stops at 256: 258 runs eagerly

# -- before step 4: padding --------------------------------------------------------------------
S4_PADDING_DEFAULT_LADDER = 310  # 3->4, 5->8, 9->16, 12->16: 40*1 + 30*3 + 20*7 + 10*4
S4_PADDING_POWERS_OF_TWO = 310  # below 16 the default ladder is 1, 2, 4, 8, 16: the same rungs
S4_WASTE_OF_33 = 0.2121  # 7 padding tokens over the 33 real ones (7/40 is the share of rows)
