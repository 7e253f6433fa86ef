"""The course's answers to labs/phase-05/lab-06-piecewise-split/predictions.py.

The lab's tests read this file in place of the student's with `--impl=ref`, and check it
against what the reference computes (labs/labpredict.py). Each comment says why.
"""

# -- before step 1: what stays opaque ---------------------------------------------------------
LEAF_EVERYTHING_CALL_MODULES = 4  # embed_tokens, layers.0, layers.1, norm: nothing left

# -- before step 3: the pieces ----------------------------------------------------------------
PIECES_30_LAYERS = 61  # 30 attention pieces and the 31 runs of work around them
CAPTURED_PIECES_30_LAYERS = 31  # L + 1: attention runs eagerly
PIECEWISE_GRAPHS_51_SIZES = 1581  # one graph a capturable piece a size: 31 * 51
FULL_GRAPHS_51_SIZES = 51  # one graph of the whole forward a size
PIECES_OF_A1_A2_ADD = 3  # [A1] [A2] [add]: nothing before A1, nothing between
LARGEST_CAPTURABLE_PIECE = "middle"  # a layer's MLP plus the next layer's attention input
