"""Your predictions for Phase 05, lab 01: fill each in BEFORE you write the step it is for.

Each name is a question of the README (the "Predict first" part of each step gives the
scenario). Replace None with your answer: a number in the unit the comment gives, or
True / False. Then `pytest labs/phase-05/lab-01-graph-replay-simulator -m step1 -k predictions`
(step2, step3 likewise) grades that step's answers against the reference, and
`python explore.py` prints what your own code gives beside each answer once it runs.
When a prediction was off, keep the first one in a comment and write down why.
"""

# -- before step 1: the 8-op toy model on one (4, 16) float32 input, fresh devices --------
EAGER_HOST_US = None  # host_us after one eager run, in microseconds
EAGER_CLOCK_US = None  # clock_us after that eager run, in microseconds
CAPTURE_POOL_BYTES = None  # pool.nbytes after capturing the 8 ops on that input, in bytes
OUTPUT_IS_NAN_AFTER_CAPTURE = None  # True or False: is the last buffer all NaN right then?

# -- before step 2: replay that graph once -------------------------------------------------
REPLAY_CLOCK_US = None  # clock_us after the one replay, in microseconds
REPLAY_BEATS_EAGER_WITH_NODE_US_3 = None  # True or False, on devices with node_us=3.0

# -- before step 3: a GraphRunner called with (4, 16), (4, 16), (8, 16), (4, 16) ----------
RUNNER_LAUNCHES = None  # device.launches at the end
RUNNER_CAPTURES = None  # device.captures at the end
RUNNER_POOL_BYTES = None  # device.pool.nbytes at the end, in bytes
FIRST_RESULT_HOLDS_CALL = None  # the array the first call returned holds which call's output?
