"""The course's answers to labs/phase-02/lab-01-block-manager/predictions.py.

The lab's tests read this file in place of the student's with `--impl=ref`, and check it
against what the reference computes (labs/labpredict.py). Each comment says why; the
worked answers are on book/src/phase-02/EXERCISES.md.
"""

# -- before step 3: growing a table ------------------------------------------------------------
S3_BLOCKS_AFTER_PROMPT = 2  # the sampled token has no K/V yet: no block until a step computes it
S3_BOTH_DECODE = True  # a's position 8 takes the free block; b's position 7 fits in its block 1
S3_TOKENS_SAMPLED = 5  # a's 3 blocks hold positions up to 11; each step samples the token after
#                        the last it computes, so the step that computes 11 samples token 12

# -- before step 5: prefix caching -------------------------------------------------------------
S5_EIGHT_TOKENS_CACHED = 4  # freed blocks stay findable, but the last token must be computed
S5_B_TABLE = [0, 1, 3]  # a's two cached blocks, then the free block at the front of the pool:
#                         3, never used, not a's third block 2, which was freed after it
S5_FREE_AFTER_B = 3  # the two revived blocks leave the pool too: 6 - 2 - 1
S5_AFTER_DECODE_CACHED = 4  # 8 is sampled, not computed: a's second block is not full of K/V
