"""The course's answers to labs/phase-03/lab-01-scheduler/predictions.py.

The lab's tests read this file in place of the student's with `--impl=ref`, and check it
against what the reference computes (labs/labpredict.py). Each comment says why.
"""

# -- before step 2: who gets in -------------------------------------------------------------
S2_B_FIRST_CHUNK = 6  # a takes 4 of the 10 tokens; b's 7-token prompt is cut to the 6 left
S2_B_SAMPLES = False  # b's chunk stops short of its prompt's end: nothing to sample yet
S2_REQUEST_COUNTS = [2, 2]  # a and b run; the budget is spent, so c and d wait
S2_RUNNING_WITH_BUDGET_32 = 3  # a, b and c fit in 13 tokens; max_num_seqs=3 keeps d out

# -- before step 3: after the forward ---------------------------------------------------------
S3_FINISHED = ["w", "x"]  # w failed on arrival (16 tokens leave no room), x hit the limit
S3_X_FINISH_REASON = "length"  # 15 prompt tokens + its first token fill max_model_len=16
S3_REQUEST_COUNTS = [1, 0]  # z (12 + 1 tokens) decodes on; nobody waits

# -- before step 5: preemption ----------------------------------------------------------------
S5_FIRST_PREEMPTION_STEP = 3  # a's position 8 needs a third block; none is free
S5_FIRST_VICTIM = "b"  # the most recently admitted running request
S5_RECOMPUTED_TOKENS = 8  # b's 5 prompt tokens and the 3 tokens it had generated
S5_PREEMPTIONS = 2  # b in step 3; c, the newest then, preempts itself in step 8
S5_TWO_BLOCKS_TOKENS_COMPUTED = 16  # 5 + 1 + 1 + 1 + 1 + 5 + 1 + 1: b waits, nothing redone
