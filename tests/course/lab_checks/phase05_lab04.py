"""Phase 05, lab 04 (graphs vs eager on a real model): its steps and the mistakes its
CPU-OK tests catch (the lab is GPU-REQ, so the suite does not run these: run them by hand,
see the instructors' page; the lab's tests/lab04_scenarios.py holds the simulated GPU that
makes the timer checkable on a CPU)."""

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
    Mutant(
        name="the current GPU, not the engine's",
        mistake="Waits for the current CUDA device (torch.cuda.synchronize() with no "
        "argument, or 'cuda') instead of the engine's own, so an engine on cuda:1 is timed "
        "while its kernels still run.",
        module=MODULE,
        old="    device = engine.runner.device\n",
        new="    device = torch.device(engine.runner.device.type)\n",
    ),
    Mutant(
        name="the machine's GPU, not the engine's device",
        mistake="Decides whether to wait from torch.cuda.is_available() instead of the "
        "engine's device, so an engine on the CPU is synchronised (a call into CUDA) on any "
        "machine that has a GPU.",
        module=MODULE,
        old="    device = engine.runner.device\n",
        new='    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n',
    ),
    Mutant(
        name="time.time clock",
        mistake="Starts the clock with time.time() and stops it with time.perf_counter() "
        "(or mixes clocks otherwise), so the difference means nothing.",
        module=MODULE,
        old="        synchronize(device)\n        start = time.perf_counter()\n",
        new="        synchronize(device)\n        start = time.time()\n",
    ),
    Mutant(
        name="milliseconds",
        mistake="Returns each step's time in milliseconds, though the contract (and "
        "measure_itl, which multiplies by 1000) wants seconds.",
        module=MODULE,
        old="        times.append(time.perf_counter() - start)",
        new="        times.append((time.perf_counter() - start) * 1000)",
    ),
    Mutant(
        name="crossover by multiplying",
        mistake="Compares eager_ms < threshold * graph_ms instead of the speed-up itself, so "
        "a speed-up exactly at the threshold (3.15 / 3.0 = 1.05) counts as below it: "
        "1.05 * 3.0 rounds up in floating point.",
        module=MODULE,
        old="if row.eager_ms / row.graph_ms < threshold:",
        new="if row.eager_ms < threshold * row.graph_ms:",
    ),
    Mutant(
        name="speed-ups walk the rows twice",
        mistake="Reads the rows twice (the batch sizes, then the ratios), so rows given as "
        "a generator give an empty table.",
        module=MODULE,
        old="    return {row.batch: row.eager_ms / row.graph_ms for row in rows}",
        new="    batches = [row.batch for row in rows]\n"
        "    return dict(zip(batches, [row.eager_ms / row.graph_ms for row in rows]))",
    ),
]
