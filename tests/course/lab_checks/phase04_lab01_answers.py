"""The course's answers to labs/phase-04/lab-01-model-inputs/predictions.py.

The lab's tests read this file in place of the student's with `--impl=ref`, and check it
against what the reference computes (labs/labpredict.py). Each comment says why; the
README's scenario has `a` on blocks 0 and 1, and `b` on blocks 2, 3 and 4, then `a` on 5.
"""

# -- before step 2: the flat inputs ----------------------------------------------------------
S2_POSITIONS = [6, 5, 6, 7, 8, 9]  # a's decode at 6; b's chunk resumes at its 5 cached tokens
S2_SLOT_MAPPING = [6, 13, 14, 15, 16, 17]  # b's positions 5-7 in block 3, 8-9 in block 4
S3_LOGITS_INDICES = [0, 1]  # b's chunk reaches the end of its prompt: it samples too
S3_UNIFORM_DECODE = False  # b's row is the last token of a prompt: a prefill, not a decode
S4_SLOT_MAPPING = [20, 19]  # a's position 8 opens a new block, 5; b's 11 is in block 4

# -- before step 3: the padding --------------------------------------------------------------
S3_PADDED_NUM_REQS = 2  # a mixed batch grows by tokens only
S4_PADDED_NUM_REQS = 4  # a uniform decode: each padded token is a decode row of its own
S4_PADDED_SEQ_LENS = [9, 12, 0, 0]  # a padded row reads nothing
