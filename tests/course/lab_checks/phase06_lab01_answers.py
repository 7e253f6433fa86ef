"""The course's answers to labs/phase-06/lab-01-capture-ladder/predictions.py.

The lab's tests read this file in place of the student's with `--impl=ref`, and check it
against what the reference computes (labs/labpredict.py). Each comment says why.
"""

# -- before step 2: scoring a ladder on G ------------------------------------------------------
S2_HIT_RATE_8_16 = 0.6667  # 18 of 27 steps are at most 16; the 18s and 20s run eagerly
S2_PADDING_8_16 = 33  # 3 * 6 + 3 * 5 (the 2s and 3s up to 8); the eager steps add none
S2_PADDING_8_16_20 = 41  # 33 + 4 * 2 (the 18s up to 20): a higher top only adds padding

# -- before step 3: G served with the ladder [4, 8, 18] and max_num_seqs 8 -------------------
S3_FULL_STEPS = 9  # the 2s and 3s (to 4) and the 8s (to 8): rungs that fit 8 decode rows
S3_PIECEWISE_STEPS = 13  # the 16s and 18s, padded to 18: no FULL graph above 8 rows
S3_PADDED_SIZE_OF_20 = 20  # above the top rung: eager, and an eager step is not padded
S3_ENGINE_HIT_RATE = 0.8148  # 22 / 27: FULL and PIECEWISE replays both count

# -- before step 4: choosing a ladder for G ---------------------------------------------------
S4_BEST_3_AT_100 = [3, 16, 20]  # not greedy's [8, 16, 20]
S4_BEST_PADDING_3_AT_100 = 35  # 3 * 1 + 3 * 8 + 4 * 2, against greedy's 41
S4_TOP_RUNG_AT_80 = 18  # 80% of 27 is 21.6 steps: 18 at or below 16, 22 at or below 18
S4_BEST_3_AT_80 = [3, 8, 18]  # 3 + 9 * 2 = 21 tokens; the five 20s run eagerly
