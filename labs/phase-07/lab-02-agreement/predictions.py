"""Your predictions for Phase 07, lab 02: fill each in BEFORE you write the step it is for.

Each name is a question of the README (its "Predict first" paragraphs give the scenario).
Replace None with your answer: True / False, a whole number, a word, or a list with one
entry a rank ([rank 0's, rank 1's]). Then
`pytest labs/phase-07/lab-02-agreement -m step1 -k predictions` (step3, step4 likewise)
grades them against the reference, and `python explore.py` prints what the code gives
beside each answer. When a prediction was off, keep the first one in a comment and write
down why.
"""

# -- before step 1: two ladders, FULL_AND_PIECEWISE, max_num_seqs 8 -------------------------
# rank 0 captures the sizes 1, 2, 4, 8 and rank 1 the sizes 1, 2, 8; nothing checks them
GRAPHS_EACH_RANK_CAPTURES = None  # [rank 0's number of graphs, rank 1's]
ROWS_OF_A_DECODE_OF_3 = None  # [rows rank 0's forward runs, rank 1's] for 3 decoding requests
ROWS_OF_A_DECODE_OF_5 = None  # the same for 5 decoding requests
FIRST_CAPTURE_THAT_DIFFERS = None  # counting from 1 in capture order: whose warm-up sizes differ

# -- before step 3: fingerprints ------------------------------------------------------------
HASH_SAME_IN_TWO_PROCESSES = None  # True or False: hash(("req-7", 1, 12)) in two fresh Pythons
FINGERPRINT_CHANGES_WHEN_ROWS_SWAP = None  # True or False, the engine's fingerprint
FINGERPRINT_CHANGES_WITH_BLOCK_TABLES = None  # True or False: only the block tables differ

# -- before step 4: a flag only rank 1 holds (ladder 1, 2, 4, 8, FULL_AND_PIECEWISE) ---------
# each rank dispatches alone: rank 0 may run FULL graphs, rank 1 may not
MODES_OF_A_DECODE_OF_3 = None  # ["FULL" / "PIECEWISE" / "NONE" for rank 0, ... for rank 1]
ROWS_OF_THAT_DECODE = None  # [rows rank 0's forward runs, rank 1's]
MODES_OF_A_MIXED_STEP_OF_3 = None  # a prefill chunk and decodes, 3 tokens in all
