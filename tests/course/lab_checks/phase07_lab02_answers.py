"""The course's answers to labs/phase-07/lab-02-agreement/predictions.py.

The lab's tests read this file in place of the student's with `--impl=ref`, and check it
against what the reference computes (labs/labpredict.py). Each comment says why.
"""

# -- before step 1: two ladders, FULL_AND_PIECEWISE, max_num_seqs 8 -------------------------
# A PIECEWISE graph a size, and a FULL decode graph a size up to max_num_seqs (8): 4 + 4
# on rank 0, 3 + 3 on rank 1.
GRAPHS_EACH_RANK_CAPTURES = [8, 6]
# Rank 0 pads 3 to 4; rank 1 has no 4 and pads to 8: a FULL graph of 4 rows meets one of 8.
ROWS_OF_A_DECODE_OF_3 = [4, 8]
# Both pad 5 to 8: the ladders disagree, yet this step runs as if they did not.
ROWS_OF_A_DECODE_OF_5 = [8, 8]
# Largest first: both warm up 8 first; then rank 0 warms up 4 and rank 1 warms up 2.
FIRST_CAPTURE_THAT_DIFFERS = 2

# -- before step 3: fingerprints ------------------------------------------------------------
# A str's hash is salted with a random seed each process draws at start (PYTHONHASHSEED).
HASH_SAME_IN_TWO_PROCESSES = False
# Another row order is another batch layout: another forward.
FINGERPRINT_CHANGES_WHEN_ROWS_SWAP = True
# A rank's block ids address only its own cache: they are left out.
FINGERPRINT_CHANGES_WITH_BLOCK_TABLES = False

# -- before step 4: a flag only rank 1 holds (ladder 1, 2, 4, 8, FULL_AND_PIECEWISE) ---------
MODES_OF_A_DECODE_OF_3 = ["FULL", "PIECEWISE"]
# Both pad 3 to 4: the shapes agree, the graphs do not.
ROWS_OF_THAT_DECODE = [4, 4]
# A mixed batch never takes a FULL graph under FULL_AND_PIECEWISE: the flag cannot matter.
MODES_OF_A_MIXED_STEP_OF_3 = ["PIECEWISE", "PIECEWISE"]
