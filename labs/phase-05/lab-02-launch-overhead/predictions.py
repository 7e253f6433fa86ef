"""Your predictions for Phase 05, lab 02: fill each in BEFORE you write the step it is for.

Each name is a question of the README (the "Predict first" part of each step gives the
scenario). Replace None with your answer: a number in the unit the comment gives, or
True / False. Then `pytest labs/phase-05/lab-02-launch-overhead -m step1 -k predictions`
(step2, step3, step4 likewise) grades that step's answers against the reference, and
`python explore.py` prints what your own code gives beside each answer once it runs.
When a prediction was off, keep the first one in a comment and write down why.
"""

# -- before step 1: the kernel K on hardware H -----------------------------------------------
K_GPU_US_BATCH_1 = None  # K's GPU time at batch 1, in µs
K_GPU_US_BATCH_64 = None  # K's GPU time at batch 64, in µs
K_FIRST_BATCH_SLOWER_THAN_BATCH_1 = None  # the smallest batch at which K takes longer than at 1

# -- before step 2: the toy step T -----------------------------------------------------------
T_EAGER_US = None  # T's eager step at batch 1, in µs

# -- before step 3 ---------------------------------------------------------------------------
T_GRAPH_US = None  # T's graph step at batch 1, in µs
T_SPEEDUP = None  # eager step / graph step

# -- before step 4: the one-kernel step E, and the SmolLM2 preset ----------------------------
E_SPEEDUP_BATCH_6 = None  # E's speedup at batch 6
E_CROSSOVER_AT_2 = None  # crossover_batch(E, threshold=2.0, max_batch=64)
SMOLLM2_CROSSOVER_IS_NONE = None  # True or False: do its graphs still pay at batch 4096?
