"""Your predictions for Phase 05, lab 04: fill each in BEFORE you write the step it is for.

Each name is a question of the README (the "Predict first" part of each step gives the
scenario). Replace None with your answer: a number in the unit the comment gives, or a
batch size. Then `pytest labs/phase-05/lab-04-graph-vs-eager-real -m step1 -k predictions`
(step2 likewise) grades that step's answers against the reference, and `python explore.py`
prints what your own code gives beside each answer once it runs. When a prediction was
off, keep the first one in a comment and write down why.
"""

# -- before step 1: timing the simulated steps E and G -----------------------------------------
S1_EAGER_MS = None  # what a correct timer reports for step E, in ms
S1_GRAPH_MS = None  # what a correct timer reports for step G, in ms
S1_GRAPH_MS_NO_SYNC = None  # what a timer that never waits for the GPU reports for G, in ms
S1_SPEEDUP_NO_SYNC = None  # E / G as that timer reports them
S1_MEAN_FROM_FIRST_CALL_MS = None  # the fake engine's first 3 calls, timed from the first, in ms

# -- before step 2: reading a table of eager and graph steps --------------------------------
S2_ARTICLE_SAVING_MS_BATCH_32 = None  # eager - graph at batch 32 in the article's table, in ms
S2_ARTICLE_CROSSOVER_AT_1_30 = None  # crossover_batch(article, threshold=1.30): a batch size
S2_RECORDED_CROSSOVER_AT_6 = None  # crossover_batch(recorded run, threshold=6.0): a batch size
