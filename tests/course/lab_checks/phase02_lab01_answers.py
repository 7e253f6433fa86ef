"""The course's answers to labs/phase-02/lab-01-block-manager/predictions.py.

The lab's tests read this file in place of the student's with `--impl=ref`, and check it
against what the reference computes (labs/labpredict.py). Each comment says why.
"""

# -- before step 3: growing a table ------------------------------------------------------------
S3_BLOCKS_AT_8 = 2  # 8 tokens fill two blocks exactly: no third block until position 8
S3_CAN_FINISH_PROMPT = True  # positions 8 and 9 need one more block, and one is free
S3_FIRST_REFUSED_POSITION = 12  # the third block holds positions 8 to 11; 12 needs a fourth

# -- before step 5: prefix caching -------------------------------------------------------------
S5_B_CACHED_TOKENS = 4  # b's second [1, 2, 3, 4] follows a different prefix than a's [5, 6, 7, 8]
S5_EIGHT_TOKENS_CACHED = 4  # both blocks are cached, but the last token must be computed
S5_X_TABLE = [3, 2]  # a's tail rejoined the pool first, so x evicts a's last blocks
S5_A2_CACHED_TOKENS = 8  # a's first two blocks survived; block 2 (tokens 8-11) was taken
