"""The course's answers to labs/phase-05/lab-01-graph-replay-simulator/predictions.py.

The lab's tests read this file in place of the student's with `--impl=ref`, and check it
against what the reference computes (labs/labpredict.py). Each comment says why.
"""

# -- before step 1: the 8-op toy model on one (4, 16) float32 input, fresh devices --------
EAGER_HOST_US = 40.0  # 8 launches of 5 us; no op waits for the GPU
EAGER_CLOCK_US = 44.0  # each kernel (at most 4 us) ends before the next launch; the last adds 4
CAPTURE_POOL_BYTES = 3072  # per layer 4x16 + 4x32 + 4x32 + 4x16 floats of 4 bytes, two layers
OUTPUT_IS_NAN_AFTER_CAPTURE = True  # a capture records; no kernel has run yet

# -- before step 2: replay that graph once -------------------------------------------------
REPLAY_CLOCK_US = 41.0  # 5 us to launch, then 24 us of kernels and 8 x 1.5 us of nodes
REPLAY_BEATS_EAGER_WITH_NODE_US_3 = False  # 5 + 24 + 24 = 53 us against the same 44 us

# -- before step 3: a GraphRunner called with (4, 16), (4, 16), (8, 16), (4, 16) ----------
RUNNER_LAUNCHES = 20  # 8 + 1 (warm-up, replay), 1, 8 + 1, 1
RUNNER_CAPTURES = 2  # one graph per shape
RUNNER_POOL_BYTES = 9984  # 3328 for (4, 16): static input + 8 outputs; twice that for (8, 16)
FIRST_RESULT_HOLDS_CALL = 4  # the static output of (4, 16), overwritten by every replay of it
