"""The course's answers to labs/phase-01/lab-01-llama-layers/predictions.py.

The lab's tests read this file in place of the student's with `--impl=ref`, and check it
against what the reference computes (labs/labpredict.py). Each comment says why.
"""

# -- before step 1: RMSNorm in half precision ------------------------------------------------
S1_OUT_FLOAT16_STATISTICS = 0.0  # 300^2 = 90,000 > 65,504: inf, rsqrt(inf) = 0, 300 * 0 = 0
S1_OUT_FLOAT32_STATISTICS = 1.0  # mean 90,000, rsqrt 1/300, 300/300 = 1 exactly in float16
S1_NEW_RESIDUAL = 256.0  # 257 needs 9 significant bits; bfloat16 has 8, the tie goes to 256

# -- before step 3: RoPE and dtypes ----------------------------------------------------------
S3_BF16_POSITION = 1000.0  # between 512 and 1024 bfloat16 steps by 4: 1001 rounds to 1000
S3_PRODUCT_DTYPE = "float32"  # torch promotes to the wider floating type of the two tensors
S3_SCORE_UNCHANGED = True  # the score depends on m - n only, and 30 - 25 = 9 - 4

# -- before step 4: grouped-query attention over the cache ------------------------------------
S4_KV_HEAD_OF_QUERY_HEAD_5 = 1  # 5 // (9 // 3): heads 3, 4 and 5 share KV head 1
S4_KV_BYTES_PER_TOKEN = 23040  # 2 (K and V) x 30 layers x 3 KV heads x 64 x 2 bytes
S4_KEYS_SEEN = 5  # it sits at position 4: keys 0 to 4, the cached four and itself
