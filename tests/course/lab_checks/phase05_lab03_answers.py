"""The course's answers to labs/phase-05/lab-03-cudagraph-mode/predictions.py.

The lab's tests read this file in place of the student's with `--impl=ref`, and check it
against what the reference computes (labs/labpredict.py). Each comment says why.
"""

# -- before step 2: the downgrade (attention split unless said) ------------------------------
S2_SPEC_DECODE_SINGLE_TOKEN_BACKEND = "PIECEWISE"  # q = 3 needs UNIFORM_BATCH for FULL decode;
# once decode loses FULL nothing full is left, and attention is split
S2_SPEC_DECODE_UNIFORM_BATCH_BACKEND = "FULL_AND_PIECEWISE"  # the need met exactly: kept
S2_NO_SPLIT_UNIFORM_BATCH_BACKEND = "FULL_DECODE_ONLY"  # no split: a request for FULL; mixed
# batches then lose FULL (needs ALWAYS) and have no pieces to fall back to

# -- before step 3: the keys of dispatcher D ---------------------------------------------------
S3_PIECEWISE_KEYS = 7  # one relaxed key per capture size, under the mixed mode
S3_FULL_KEYS = 5  # uniform batches hold 1 to 16 tokens: 1, 2, 4, 8, 16
S3_FULL_KEYS_Q2 = 6  # 2 to 32 tokens: 2, 4, 8, 16, 24, 32

# -- before step 4: dispatch on D --------------------------------------------------------------
S4_MIXED_20_MODE = "PIECEWISE"  # no FULL key for a mixed batch; BD(24) is under PIECEWISE
S4_MIXED_20_TOKENS = 24  # padded to its rung
S4_MIXED_33_MODE = "NONE"  # one past the largest capture size, 32
S4_FULL_DECODE_ONLY_MIXED_20_MODE = "NONE"  # its mixed mode is NONE: no relaxed keys at all

# -- before step 6: launches of a piecewise runner ---------------------------------------------
S6_EAGER_LAUNCHES = 20  # one launch per op
S6_FIRST_CALL_LAUNCHES = 25  # 16 warm-up kernels of the 5 pieces, 5 replays, 4 attention calls
S6_SECOND_CALL_LAUNCHES = 9  # 5 replays + 4 attention calls: k + 1 pieces and k splitting ops
