"""Your predictions for Phase 03, lab 01: fill each in BEFORE you write the step it is for.

Each name is a question of the README (its scenario is in the step's "Predict first").
Replace None with your answer: an integer, True / False, a request id ("a"), a finish
reason ("stop", "length" or "error"), or a list. Then
`pytest labs/phase-03/lab-01-scheduler -m step2 -k predictions` (step3 and step5
likewise) grades that step's answers against the reference, and `python explore.py`
prints what your own scheduler gives beside each answer once it runs. When a prediction
was off, keep the first one in a comment and write down why.
"""

# -- before step 2: who gets in -------------------------------------------------------------
S2_B_FIRST_CHUNK = None  # int: tokens of b's row in the first step, with a budget of 10
S2_B_SAMPLES = None  # True or False: does b's row sample a token in that step?
S2_REQUEST_COUNTS = None  # list: [running, waiting] after that step
S2_RUNNING_WITH_BUDGET_32 = None  # int: requests running after the first step, budget 32

# -- before step 3: after the forward ---------------------------------------------------------
S3_FINISHED = None  # list: the ids update_from_output returns after the first step, in order
S3_X_FINISH_REASON = None  # "stop", "length", "error" or None (still running): x's
S3_REQUEST_COUNTS = None  # list: [running, waiting] after the update

# -- before step 5: preemption ----------------------------------------------------------------
S5_FIRST_PREEMPTION_STEP = None  # int: the step (from 0) of the first preemption
S5_FIRST_VICTIM = None  # "a", "b" or "c": who is preempted first
S5_RECOMPUTED_TOKENS = None  # int: the tokens of the victim's row when it comes back
S5_PREEMPTIONS = None  # int: preemptions in the whole run
S5_TWO_BLOCKS_TOKENS_COMPUTED = None  # int: tokens computed over the two-block run, in all
