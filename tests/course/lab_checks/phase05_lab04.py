"""Phase 05, lab 04 (graphs vs eager on a real model): its steps and the mistakes its
CPU-OK tests catch (the lab is GPU-REQ, so the suite does not run these; see the lab's
tests for the simulated GPU that makes the timer checkable on a CPU)."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "labs"))
from mutation import Mutant

MODULE = "mini_vllm.bench.itl"

STEPS = {
    1: [f"{MODULE}:time_decode_steps"],
    2: [f"{MODULE}:speedups", f"{MODULE}:saving_ms", f"{MODULE}:crossover_batch"],
    3: [],  # on a GPU: run the given sweep (measure_itl) with the step 1 timer
    4: [f"{MODULE}:vllm_itl_ms"],  # optional, needs vLLM
}

MUTANTS = [
    Mutant(
        name="no device sync",
        mistake="Reads the clock around engine.step() without waiting for the GPU, so it "
        "times the kernel launches only, the very part CUDA graphs remove.",
        module=MODULE,
        old="        synchronize(device)\n        start = time.perf_counter()\n"
        "        engine.step()\n        synchronize(device)\n",
        new="        start = time.perf_counter()\n        engine.step()\n",
    ),
    Mutant(
        name="sync after the step only",
        mistake="Waits for the GPU after each step but not before the first timed one, so the "
        "warm-up's queued kernels land in the first timed step.",
        module=MODULE,
        old="        synchronize(device)\n        start = time.perf_counter()\n",
        new="        start = time.perf_counter()\n",
    ),
    Mutant(
        name="sync before the step only",
        mistake="Waits for the GPU before the step but reads the clock right after launching "
        "it, so each time is the launch time alone.",
        module=MODULE,
        old="        engine.step()\n        synchronize(device)\n        times.append",
        new="        engine.step()\n        times.append",
    ),
    Mutant(
        name="warm-up timed",
        mistake="Times every step from the first one on, so the slow first token and the "
        "warm-up steps count as inter-token latency.",
        module=MODULE,
        old="    for _ in range(warmup):\n        engine.step()\n    times = []\n"
        "    for _ in range(steps):\n",
        new="    times = []\n    for _ in range(warmup + steps):\n",
    ),
    Mutant(
        name="times since the first timed step",
        mistake="Starts the clock once, before the loop, so each entry is the time since the "
        "first timed step (cumulative), not that step's own latency.",
        module=MODULE,
        old="    times = []\n    for _ in range(steps):\n        synchronize(device)\n"
        "        start = time.perf_counter()\n",
        new="    times = []\n    synchronize(device)\n    start = time.perf_counter()\n"
        "    for _ in range(steps):\n        synchronize(device)\n",
    ),
    Mutant(
        name="no warm-up",
        mistake="Skips the warm-up calls, so the first timed step pays the one-off costs.",
        module=MODULE,
        old="    for _ in range(warmup):\n        engine.step()\n",
        new="",
    ),
    Mutant(
        name="speed-up inverted",
        mistake="Divides graph time by eager time, so the speed-up is below 1 where graphs win.",
        module=MODULE,
        old="return {row.batch: row.eager_ms / row.graph_ms for row in rows}",
        new="return {row.batch: row.graph_ms / row.eager_ms for row in rows}",
    ),
    Mutant(
        name="saving reversed",
        mistake="Subtracts eager from graph time, so the saving comes out negative.",
        module=MODULE,
        old="return {row.batch: row.eager_ms - row.graph_ms for row in rows}",
        new="return {row.batch: row.graph_ms - row.eager_ms for row in rows}",
    ),
    Mutant(
        name="crossover in given order",
        mistake="Walks the rows in the order they come, so the first row below the threshold "
        "is not the smallest batch size.",
        module=MODULE,
        old="    for row in sorted(rows, key=lambda r: r.batch):\n        if row.eager_ms",
        new="    for row in rows:\n        if row.eager_ms",
    ),
    Mutant(
        name="crossover at or below",
        mistake="Takes a speed-up equal to the threshold as below it.",
        module=MODULE,
        old="if row.eager_ms / row.graph_ms < threshold:",
        new="if row.eager_ms / row.graph_ms <= threshold:",
    ),
]
