"""Your predictions for Phase 01, lab 01: fill each in BEFORE you write the step it is for.

Each name is a question of the README (its scenario is in the step's "Predict first").
Replace None with your answer: a number, a word, or True / False. Then
`pytest labs/phase-01/lab-01-llama-layers -m step1 -k predictions` (step3 and step4
likewise) grades that step's answers against the reference, and `python explore.py`
prints what your own code gives beside each answer once it runs. When a prediction was
off, keep the first one in a comment and write down why.
"""

# -- before step 1: RMSNorm in half precision ------------------------------------------------
S1_OUT_FLOAT16_STATISTICS = None  # number: each output if mean(x^2) is taken in float16
S1_OUT_FLOAT32_STATISTICS = None  # number: each output with float32 statistics
S1_NEW_RESIDUAL = None  # number: each entry of the new residual, 256 + 1 in bfloat16

# -- before step 3: RoPE and dtypes ----------------------------------------------------------
S3_BF16_POSITION = None  # number: the position 1001 once stored as a bfloat16
S3_PRODUCT_DTYPE = None  # word: the dtype of a bfloat16 tensor times a float32 tensor
S3_SCORE_UNCHANGED = None  # True or False: same score at positions (30, 25) as at (9, 4)?

# -- before step 4: grouped-query attention over the cache ------------------------------------
S4_KV_HEAD_OF_QUERY_HEAD_5 = None  # int: the KV head query head 5 reads (9 heads, 3 KV heads)
S4_KV_BYTES_PER_TOKEN = None  # int: bytes of KV cache one token takes, all 30 layers, bf16
S4_KEYS_SEEN = None  # int: positions the first token of the 2-token chunk attends over
