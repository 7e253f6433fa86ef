"""The course's answers to labs/phase-06/lab-02-serving-metrics/predictions.py.

The lab's tests read this file in place of the student's with `--impl=ref`, and check it
against what the reference computes (labs/labpredict.py). Each comment says why.
"""

# -- before step 1: the README's record R ----------------------------------------------------
R_TPOT_MS = 87.5  # (0.6 - 0.25) s over the 4 tokens after the first
R_MEETS_TPOT_90 = True
R_MEETS_ITL_200 = False  # its largest gap is 260 ms

# -- before step 2 ---------------------------------------------------------------------------
P50_OF_10_20_30_40_MS = 25.0  # rank 1.5: halfway between 20 and 30
P99_OF_1_TO_16_MS = 15.85  # rank 14.85: 15 + 0.85 * (16 - 15), not the maximum

# -- before step 3: the README's run M -------------------------------------------------------
M_TPOT_MEAN_MS = 75.0  # (60 + 90) / 2: one value a request, none for a one-token answer
M_ITL_MEAN_MS = 70.0  # (4 * 60 + 2 * 90) / 6: every gap pooled
M_REQUEST_THROUGHPUT = 2.0  # 4 completed in 2 s; the failed one is not counted
M_GOODPUT_TPOT_80 = 1.5  # the two one-token answers and the 60 ms one, over 2 s
