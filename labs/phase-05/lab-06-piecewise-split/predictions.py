"""Your predictions for Phase 05, lab 06: fill each in BEFORE you write the step it is for.

Each name is a question of the README. Replace None with your answer: an integer, or
one of the words the comment offers. Then `pytest labs/phase-05/lab-06-piecewise-split
-m step1 -k predictions` (step3 likewise) grades that step's answers against the
reference, and `python explore.py` prints what your own code gives beside each answer
once it runs. When a prediction was off, keep the first one in a comment and write down
why.
"""

# -- before step 1: what stays opaque ---------------------------------------------------------
LEAF_EVERYTHING_CALL_MODULES = None  # int: call_module nodes if every module were a leaf

# -- before step 3: the pieces ----------------------------------------------------------------
PIECES_30_LAYERS = None  # int: pieces of the split of a 30-layer Llama
CAPTURED_PIECES_30_LAYERS = None  # int: how many of them PIECEWISE graphs capture
PIECEWISE_GRAPHS_51_SIZES = None  # int: CUDA graphs PIECEWISE captures with 51 sizes
FULL_GRAPHS_51_SIZES = None  # int: CUDA graphs FULL would capture with the same sizes
PIECES_OF_A1_A2_ADD = None  # int: pieces of the graph A1, A2, add (A = attention)
LARGEST_CAPTURABLE_PIECE = None  # "first", "middle" or "last": most compute nodes, tiny
