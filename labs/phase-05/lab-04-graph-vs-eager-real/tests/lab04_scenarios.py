"""Given: the README's scenarios, and the simulated GPU that lets a timer be checked on a CPU.

The simulation has a clock in seconds and one in-order GPU queue. Launching a kernel costs
the CPU some time; the kernel then runs on the GPU once the GPU has finished everything
launched before it. `time.perf_counter` reads the simulated clock and
`torch.cuda.synchronize` moves it to the moment the queue is empty, so the time a correct
timer must report is known to the microsecond and does not depend on this machine.

The lab's tests and `explore.py` both build the README's questions from this file, the
tests on the reference and `explore.py` on your code:

    with simulated() as sim:
        engine = FakeEngine(sim, [[(0.001, 0.004)]] * 5, "cuda")
        times = time_decode_steps(engine, steps=3, warmup=2)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from types import SimpleNamespace

import torch

Kernel = tuple[float, float]  # (CPU seconds to launch it, GPU seconds to run it)


class SimulatedGPU:
    """A clock in seconds and one in-order GPU queue."""

    def __init__(self) -> None:
        self.now = 0.0  # what time.perf_counter() reads
        self.busy_until = 0.0  # when the GPU finishes the work queued so far
        self.syncs = 0
        self.synced_devices: list[object] = []  # the argument of every synchronize call

    def perf_counter(self) -> float:
        return self.now

    def synchronize(self, device=None) -> None:
        self.syncs += 1
        self.synced_devices.append(device)
        self.now = max(self.now, self.busy_until)

    def launch(self, cpu_s: float, gpu_s: float) -> None:
        """The CPU spends `cpu_s` launching; the kernel runs `gpu_s` once the GPU is free."""
        self.now += cpu_s
        self.busy_until = max(self.now, self.busy_until) + gpu_s


class FakeEngine:
    """An engine whose step number i launches the kernels `steps[i]`, in order.

    `device` is what `engine.runner.device` says. `runs_on` is where the kernels really
    run: "cuda" (the default for a CUDA device) queues them on the simulated GPU, so
    `step()` returns once they are launched; "cpu" runs each at once, so `step()` returns
    when they are done. An engine that says "cpu" but runs on "cuda" is what a timer that
    never waits for the GPU sees.
    """

    def __init__(
        self,
        sim: SimulatedGPU,
        steps: Sequence[Sequence[Kernel]],
        device: str = "cuda",
        runs_on: str | None = None,
    ) -> None:
        self.sim, self.steps, self.calls = sim, [list(s) for s in steps], 0
        self.runner = SimpleNamespace(device=torch.device(device))
        self.runs_on = runs_on or self.runner.device.type

    def step(self) -> None:
        kernels = self.steps[self.calls]
        self.calls += 1
        for cpu_s, gpu_s in kernels:
            if self.runs_on == "cuda":
                self.sim.launch(cpu_s, gpu_s)
            else:  # a CPU computes while the step runs: nothing is left to wait for
                self.sim.now += cpu_s + gpu_s


@contextlib.contextmanager
def simulated() -> Iterator[SimulatedGPU]:
    """Within the block, `time.perf_counter` and `torch.cuda.synchronize` are the simulation's."""
    sim = SimulatedGPU()
    saved = time.perf_counter, torch.cuda.synchronize
    time.perf_counter, torch.cuda.synchronize = sim.perf_counter, sim.synchronize
    try:
        yield sim
    finally:
        time.perf_counter, torch.cuda.synchronize = saved


# -- the README's scenarios -------------------------------------------------------------------

# Step E: an eager decode step of 300 kernels, each launched in 5 µs of CPU time and run in
# 3 µs of GPU time. Step G: its graph, one replay launched in 10 µs, then the same 300
# kernels' 900 µs of GPU work back to back.
STEP_E: list[Kernel] = [(5e-6, 3e-6)] * 300
STEP_G: list[Kernel] = [(10e-6, 900e-6)]

# The tests' fake engine: the first call is the slow one (first token, lazy set-up), and
# the GPU part dominates, as in a real decode step.
FIRST_CALLS: list[list[Kernel]] = [
    [(0.002, 0.050)],
    [(0.001, 0.020)],
    [(0.001, 0.004)],
    [(0.0015, 0.006)],
    [(0.001, 0.003)],
]


def median_step_ms(
    timer: Callable[..., list[float]], step: Sequence[Kernel], device="cuda", runs_on=None
) -> float:
    """The median of `timer(engine, steps=5, warmup=2)` in ms, for an engine whose every
    step is `step`."""
    with simulated() as sim:
        engine = FakeEngine(sim, [step] * 7, device, runs_on)
        times = sorted(timer(engine, steps=5, warmup=2))
    return times[len(times) // 2] * 1000


def readme_step1(timer: Callable[..., list[float]]) -> dict[str, float]:
    """The answers to the README's step 1 questions, with `timer` as time_decode_steps."""
    eager, graph = median_step_ms(timer, STEP_E), median_step_ms(timer, STEP_G)
    # A timer that never waits: the engine says "cpu", the kernels still run on the GPU.
    eager_blind = median_step_ms(timer, STEP_E, device="cpu", runs_on="cuda")
    graph_blind = median_step_ms(timer, STEP_G, device="cpu", runs_on="cuda")
    with simulated() as sim:
        from_first = timer(FakeEngine(sim, FIRST_CALLS, "cuda"), steps=3, warmup=0)
    return {
        "eager_ms": eager,
        "graph_ms": graph,
        "graph_ms_no_sync": graph_blind,
        "speedup_no_sync": eager_blind / graph_blind,
        "mean_from_first_call_ms": sum(from_first) / len(from_first) * 1000,
    }


# Step 2: an article's table of Llama-3.1-8B decode on an H100 SXM, eager and graph ms a
# step at batch 1, 4, 16 and 32 (its speed-ups: 1.65x, 1.53x, 1.30x, 1.16x).
ARTICLE: list[tuple[int, float, float]] = [
    (1, 8.4, 5.1),
    (4, 9.2, 6.0),
    (16, 12.1, 9.3),
    (32, 18.7, 16.1),
]


def readme_step2(impl, recorded_rows) -> dict[str, object]:
    """The answers to the README's step 2 questions, with `impl` giving ITLRow, saving_ms
    and crossover_batch, on the article's table and on the recorded run's rows."""
    article = [impl.ITLRow(*row) for row in ARTICLE]
    return {
        "article_saving_ms_batch_32": impl.saving_ms(article)[32],
        "article_crossover_at_1_30": impl.crossover_batch(article, threshold=1.30),
        "recorded_crossover_at_6": impl.crossover_batch(recorded_rows, threshold=6.0),
    }
