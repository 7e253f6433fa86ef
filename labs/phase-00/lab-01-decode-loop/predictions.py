"""Your predictions for Phase 00, lab 01: fill each in BEFORE you write the step it is for.

Each name is a question of the README (its scenario is in the step's "Predict first").
Replace None with your answer: an integer or a list of integers. Then
`pytest labs/phase-00/lab-01-decode-loop -m step2 -k predictions` (step5 likewise)
grades that step's answers against the reference, and `python explore.py` prints what
your own code gives beside each answer once it runs. When a prediction was off, keep the
first one in a comment and write down why.
"""

# -- before step 2: the filters ---------------------------------------------------------------
S2_KEPT_WITH_TOP_K = None  # list: the indices kept with top_k 3 and top_p 0.7
S2_KEPT_WITHOUT_TOP_K = None  # list: the indices kept with top_k -1 and top_p 0.7
S2_EQUAL_LOGITS_KEPT = None  # int: how many of four equal logits top_p 0.5 keeps

# -- before step 5: the loop ------------------------------------------------------------------
S5_FORWARDS = None  # int: forwards for 7 new tokens
S5_TOKEN_IDS_FED = None  # int: token ids through the model over those forwards, in all
S5_TOKEN_IDS_WITHOUT_CACHE = None  # int: the same, recomputing the whole sequence every token
S5_NUM_GAPS = None  # int: entries of itl_s
S5_TOKENS_UNDER_LIMIT_12 = None  # int: new tokens with max_tokens=50 and max_model_len=12
S5_LAST_POSITION_FED = None  # int: the largest position fed to the model in that request
