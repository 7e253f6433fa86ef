"""The course's answers to labs/phase-00/lab-01-decode-loop/predictions.py.

The lab's tests read this file in place of the student's with `--impl=ref`, and check it
against what the reference computes (labs/labpredict.py). Each comment says why.
"""

# -- before step 2: the filters ---------------------------------------------------------------
S2_KEPT_WITH_TOP_K = [0, 1]  # survivors 0.4, 0.333, 0.267: 0.733 before the third >= 0.7
S2_KEPT_WITHOUT_TOP_K = [0, 1, 2]  # uncut: 0.55 before the third < 0.7, 0.75 before the 4th
S2_EQUAL_LOGITS_KEPT = 2  # 0.25 each: two reach 0.5 exactly, so the third is not needed

# -- before step 5: the loop ------------------------------------------------------------------
S5_FORWARDS = 7  # the prefill gives token 1, six decode steps tokens 2 to 7
S5_TOKEN_IDS_FED = 15  # 9 in the prefill, then 1 a step; token 7 is never fed
S5_TOKEN_IDS_WITHOUT_CACHE = 84  # 9 + 10 + ... + 15: the whole sequence for every token
S5_NUM_GAPS = 6  # one gap per token after the first
S5_TOKENS_UNDER_LIMIT_12 = 3  # prompt + output stop at 12 tokens: 12 - 9
S5_LAST_POSITION_FED = 10  # positions 0-8, then 9 and 10; the third token is not fed
