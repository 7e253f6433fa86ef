"""Your predictions for Phase 06, lab 01: fill each in BEFORE you write the step it is for.

Each name is a question of the README about its trace G (the "Predict first" part of
steps 2, 3 and 4). Replace None with your answer: a number, or a list of rungs in
ascending order. Then `pytest labs/phase-06/lab-01-capture-ladder -m step2 -k predictions`
(step3, step4 likewise) grades that step's answers against the reference, and
`python explore.py` prints what your own code gives beside each answer once it runs.
When a prediction was off, keep the first one in a comment and write down why.
"""

# -- before step 2: scoring a ladder on G ------------------------------------------------------
S2_HIT_RATE_8_16 = None  # the hit rate of the ladder [8, 16] on G: a share between 0 and 1
S2_PADDING_8_16 = None  # the padding tokens of [8, 16] on G
S2_PADDING_8_16_20 = None  # the padding tokens of [8, 16, 20] on G

# -- before step 3: G served with the ladder [4, 8, 18] and max_num_seqs 8 -------------------
S3_FULL_STEPS = None  # steps that replay a FULL graph
S3_PIECEWISE_STEPS = None  # steps that replay PIECEWISE graphs
S3_PADDED_SIZE_OF_20 = None  # the padded size a step of 20 is recorded with
S3_ENGINE_HIT_RATE = None  # the engine's decode_graph_hit_rate: a share between 0 and 1

# -- before step 4: choosing a ladder for G ---------------------------------------------------
S4_BEST_3_AT_100 = None  # the best ladder of at most 3 rungs at min_hit_rate=1.0
S4_BEST_PADDING_3_AT_100 = None  # its padding tokens
S4_TOP_RUNG_AT_80 = None  # the top rung at min_hit_rate=0.8
S4_BEST_3_AT_80 = None  # the best ladder of at most 3 rungs at min_hit_rate=0.8
