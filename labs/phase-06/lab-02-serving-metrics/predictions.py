"""Your predictions for Phase 06, lab 02: fill each in BEFORE you write the step it is for.

Each name is a question of the README (its section "Predict first" of each step gives the
scenario). Replace None with your answer: a number in the unit the comment gives, or
True / False. Then `pytest labs/phase-06/lab-02-serving-metrics -m step1 -k predictions`
(step2, step3 likewise) grades that step's answers against the reference, and
`python explore.py` prints what your own code gives beside each answer once it runs.
When a prediction was off, keep the first one in a comment and write down why.
"""

# -- before step 1: the README's record R ----------------------------------------------------
R_TPOT_MS = None  # R's TPOT, in milliseconds
R_MEETS_TPOT_90 = None  # True or False: is R good under --goodput tpot:90 ?
R_MEETS_ITL_200 = None  # True or False: is R good under --goodput itl:200 ?

# -- before step 2 ---------------------------------------------------------------------------
P50_OF_10_20_30_40_MS = None  # the P50 of four latencies of 10, 20, 30 and 40 ms, in ms
P99_OF_1_TO_16_MS = None  # the P99 of sixteen latencies of 1, 2, ..., 16 ms, in ms

# -- before step 3: the README's run M -------------------------------------------------------
M_TPOT_MEAN_MS = None  # the report's mean TPOT, in milliseconds
M_ITL_MEAN_MS = None  # the report's mean ITL, in milliseconds
M_REQUEST_THROUGHPUT = None  # completed requests per second
M_GOODPUT_TPOT_80 = None  # good requests per second under --goodput tpot:80
