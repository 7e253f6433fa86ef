"""The course's answers to labs/phase-05/lab-02-launch-overhead/predictions.py.

The lab's tests read this file in place of the student's with `--impl=ref`, and check it
against what the reference computes (labs/labpredict.py). Each comment says why.
"""

# -- before step 1: the kernel K on hardware H -----------------------------------------------
K_GPU_US_BATCH_1 = 4.0  # 4 MB at 1 TB/s; its 20 MFLOP take only 0.2 µs
K_GPU_US_BATCH_64 = 12.8  # 1.28 GFLOP at 100 TFLOP/s: compute-bound now
K_FIRST_BATCH_SLOWER_THAN_BATCH_1 = 21  # at 20 both limits are 4 µs: the slower, not the sum

# -- before step 2: the toy step T -----------------------------------------------------------
T_EAGER_US = 371.0  # 37 launches of 10 µs, then the last kernel's 1 µs

# -- before step 3 ---------------------------------------------------------------------------
T_GRAPH_US = 86.0  # 12 µs to launch, then 37 nodes of 1 + 1 µs
T_SPEEDUP = 4.314  # 371 / 86

# -- before step 4: the one-kernel step E, and the SmolLM2 preset ----------------------------
E_SPEEDUP_BATCH_6 = 2.0  # (10 + 6) / (2 + 6)
E_CROSSOVER_AT_2 = 7  # batch 6 meets 2.0 exactly and still pays; batch 7 gives 17 / 9
SMOLLM2_CROSSOVER_IS_NONE = True  # 1394 launches (20.6 ms) against 92 µs of GPU work at
# batch 1; at 4096 the eager step is still 25.2 ms and the graph 14.1 ms
