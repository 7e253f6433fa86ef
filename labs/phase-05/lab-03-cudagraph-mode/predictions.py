"""Your predictions for Phase 05, lab 03: fill each in BEFORE you write the step it is for.

Each name is a question of the README (the "Predict first" part of steps 2, 3, 4 and 6
gives the scenario). Replace None with your answer: a whole number, or a mode's name as a
string ("FULL_DECODE_ONLY"). Then
`pytest labs/phase-05/lab-03-cudagraph-mode -m step2 -k predictions` (step3, step4, step6
likewise) grades that step's answers against the reference, and `python explore.py`
prints what your own code gives beside each answer once it runs. When a prediction was
off, keep the first one in a comment and write down why.
"""

# -- before step 2: the downgrade (attention split unless said) ------------------------------
S2_SPEC_DECODE_SINGLE_TOKEN_BACKEND = None  # name: FULL_AND_PIECEWISE, that backend, q = 3
S2_SPEC_DECODE_UNIFORM_BATCH_BACKEND = None  # name: FULL_AND_PIECEWISE, UNIFORM_BATCH, q = 3
S2_NO_SPLIT_UNIFORM_BATCH_BACKEND = None  # name: FULL_AND_PIECEWISE, UNIFORM_BATCH, no split

# -- before step 3: the keys of dispatcher D ---------------------------------------------------
S3_PIECEWISE_KEYS = None  # int: keys under PIECEWISE
S3_FULL_KEYS = None  # int: keys under FULL
S3_FULL_KEYS_Q2 = None  # int: keys under FULL with uniform_decode_query_len=2

# -- before step 4: dispatch on D --------------------------------------------------------------
S4_MIXED_20_MODE = None  # name: the runtime mode of dispatch(20, uniform_decode=False)
S4_MIXED_20_TOKENS = None  # int: the num_tokens of the key it returns
S4_MIXED_33_MODE = None  # name: the runtime mode of dispatch(33, uniform_decode=False)
S4_FULL_DECODE_ONLY_MIXED_20_MODE = None  # name: dispatch(20, False) under FULL_DECODE_ONLY

# -- before step 6: launches of a piecewise runner ---------------------------------------------
S6_EAGER_LAUNCHES = None  # int: launches of one eager run of the model
S6_FIRST_CALL_LAUNCHES = None  # int: launches of the runner's first call with a batch size
S6_SECOND_CALL_LAUNCHES = None  # int: launches of its second call with that size
