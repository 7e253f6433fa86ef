"""Phase 05, lab 04 — eager vs CUDA graphs on a real model shape.

Step 1 (CPU-OK) times decode steps on a simulated GPU: a clock the tests move by hand
and one GPU queue, where a step costs some CPU time to launch and then some GPU time
to run, after the work queued before it. `time.perf_counter` and
`torch.cuda.synchronize` are replaced by the simulation's, so the expected times are
known exactly and nothing depends on how fast this machine is.
Step 2 (CPU-OK) analyses made-up rows and the recorded H100 run in `recorded/`.
Steps 3 and 4 (GPU-REQ) measure for real on a CUDA machine.
"""

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from labkit import implementation

impl = implementation(__file__, starter="graph_vs_eager.py", reference="mini_vllm.bench.itl")
RECORDED = Path(__file__).resolve().parent.parent / "recorded" / "h100-itl.json"


# -- a simulated GPU --------------------------------------------------------------------------


class SimulatedGPU:
    """A clock in seconds and one in-order GPU queue."""

    def __init__(self):
        self.now = 0.0  # what time.perf_counter() reads
        self.busy_until = 0.0  # when the GPU finishes the work queued so far
        self.syncs = 0

    def perf_counter(self):
        return self.now

    def synchronize(self, device=None):
        self.syncs += 1
        self.now = max(self.now, self.busy_until)

    def launch(self, cpu_s, gpu_s):
        """The CPU spends `cpu_s` launching; the kernels run `gpu_s` once the GPU is free."""
        self.now += cpu_s
        self.busy_until = max(self.now, self.busy_until) + gpu_s


class FakeEngine:
    """`step()` number i costs `costs[i]` = (CPU seconds, GPU seconds)."""

    def __init__(self, sim, costs, device):
        self.sim, self.costs, self.calls = sim, costs, 0
        self.runner = SimpleNamespace(device=torch.device(device))

    def step(self):
        cpu_s, gpu_s = self.costs[self.calls]
        self.calls += 1
        if self.runner.device.type == "cuda":
            self.sim.launch(cpu_s, gpu_s)
        else:  # a CPU computes while the step runs: nothing is left to wait for
            self.sim.now += cpu_s + gpu_s


@pytest.fixture
def sim(monkeypatch):
    sim = SimulatedGPU()
    monkeypatch.setattr(time, "perf_counter", sim.perf_counter)
    monkeypatch.setattr(torch.cuda, "synchronize", sim.synchronize)
    return sim


# The first call is the slow one (first token, lazy set-up); the GPU part dominates,
# as in a real decode step. Warm-up: the first two calls.
COSTS = [(0.002, 0.050), (0.001, 0.020), (0.001, 0.004), (0.0015, 0.006), (0.001, 0.003)]
WARMUP, STEPS = 2, 3
TIMED = [cpu + gpu for cpu, gpu in COSTS[WARMUP:]]  # 0.005, 0.0075, 0.004


# -- step 1: the timer -----------------------------------------------------------------------


@pytest.mark.step1
def test_timer_steps_warmup_plus_steps_times_and_returns_one_time_per_timed_step(sim):
    engine = FakeEngine(sim, COSTS, "cpu")
    times = impl.time_decode_steps(engine, steps=STEPS, warmup=WARMUP)
    assert engine.calls == WARMUP + STEPS
    assert len(times) == STEPS


@pytest.mark.step1
def test_timer_gives_each_timed_step_alone_without_the_warmup_on_a_cpu(sim):
    engine = FakeEngine(sim, COSTS, "cpu")
    times = impl.time_decode_steps(engine, steps=STEPS, warmup=WARMUP)
    # Each entry is one step's own time: not counted from the first token, not cumulative.
    assert times == pytest.approx(TIMED, rel=1e-9)
    assert sim.syncs == 0, "on a CPU there is no device to wait for (no call into CUDA)"


@pytest.mark.step1
def test_timer_on_a_gpu_waits_for_the_kernels_not_only_the_launches(sim):
    engine = FakeEngine(sim, COSTS, "cuda")
    times = impl.time_decode_steps(engine, steps=STEPS, warmup=WARMUP)
    launches = [cpu for cpu, _ in COSTS[WARMUP:]]
    assert times != pytest.approx(launches, rel=1e-9), (
        "these are the launch times alone: the clock was read before the GPU had finished"
    )
    assert times == pytest.approx(TIMED, rel=1e-9)


@pytest.mark.step1
def test_timer_on_a_gpu_leaves_the_warmups_queued_work_out_of_the_first_timed_step(sim):
    # The warm-up's kernels (70 ms of GPU work) are still running when it returns.
    engine = FakeEngine(sim, COSTS, "cuda")
    times = impl.time_decode_steps(engine, steps=STEPS, warmup=WARMUP)
    assert times[0] == pytest.approx(TIMED[0], rel=1e-9), (
        f"first timed step took {times[0] * 1000:.1f} ms, expected {TIMED[0] * 1000:.1f}: "
        "it includes work queued before it"
    )


@pytest.mark.step1
def test_timer_with_no_warmup_times_from_the_first_call(sim):
    engine = FakeEngine(sim, COSTS, "cuda")
    times = impl.time_decode_steps(engine, steps=2, warmup=0)
    assert engine.calls == 2
    assert times == pytest.approx([0.052, 0.021], rel=1e-9)


# -- step 2: the analysis --------------------------------------------------------------------

ROWS = [
    impl.ITLRow(1, 12.0, 2.0),
    impl.ITLRow(8, 13.0, 3.0),
    impl.ITLRow(32, 20.0, 10.0),
    impl.ITLRow(64, 31.0, 30.0),
]


@pytest.mark.step2
def test_speedup_is_eager_over_graph_per_batch():
    assert impl.speedups(ROWS) == {
        1: 6.0,
        8: pytest.approx(13 / 3),
        32: 2.0,
        64: pytest.approx(31 / 30),
    }


@pytest.mark.step2
def test_saving_is_eager_minus_graph_per_batch():
    assert impl.saving_ms(ROWS) == {1: 10.0, 8: 10.0, 32: 10.0, 64: 1.0}


@pytest.mark.step2
def test_crossover_is_the_first_batch_below_the_threshold():
    assert impl.crossover_batch(ROWS) == 64
    assert impl.crossover_batch(ROWS, threshold=2.5) == 32
    # "below" is strict: a speed-up of exactly 2.0 still pays 2.0x.
    assert impl.crossover_batch(ROWS, threshold=2.0) == 64


@pytest.mark.step2
def test_crossover_does_not_depend_on_the_order_of_the_rows():
    shuffled = [ROWS[3], ROWS[1], ROWS[0], ROWS[2]]
    assert impl.crossover_batch(shuffled, threshold=2.5) == 32
    assert impl.crossover_batch(list(reversed(ROWS)), threshold=5.0) == 8


@pytest.mark.step2
def test_crossover_is_none_while_graphs_still_pay():
    assert impl.crossover_batch(ROWS[:3]) is None
    assert impl.crossover_batch(ROWS, threshold=1.01) is None


@pytest.mark.step2
def test_recorded_h100_run_graphs_win_big_at_batch_1_and_less_at_64():
    meta, rows = impl.load_recorded(RECORDED)
    assert "H100" in meta["machine"]
    gains = impl.speedups(rows)
    assert gains[1] >= 3.0  # launch-bound: graphs remove most of the step
    assert gains[max(gains)] < gains[1]  # the gain shrinks as the GPU gets busier
    # What graphs save is the launch time, so it does not grow with the batch the way the step does.
    saved = impl.saving_ms(rows)
    assert saved[max(saved)] < 2 * saved[1]
    assert all(s > 0 for s in saved.values())
    assert impl.crossover_batch(rows) is None  # a 135M model stays launch-bound up to 64


# -- step 3: on a GPU --------------------------------------------------------------------------


@pytest.mark.step3
@pytest.mark.gpu
def test_time_decode_steps_returns_one_positive_time_per_step_on_a_real_engine():
    from mini_vllm.bench.itl import decoding_engine
    from mini_vllm.models.loader import load_model

    model, _, _ = load_model("smollm2-135m", device="cuda", progress=False)
    engine = decoding_engine(model, 1, 128, 40, "full_and_piecewise")
    times = impl.time_decode_steps(engine, steps=10, warmup=2)
    assert len(times) == 10 and all(t > 0 for t in times)
    assert engine.stats.steps[-1].runtime_mode == "FULL"


@pytest.mark.step3
@pytest.mark.gpu
def test_graphs_beat_eager_at_batch_1_on_this_gpu():
    rows = impl.measure_itl("smollm2-135m", "cuda", batch_sizes=[1], steps=15)
    assert impl.speedups(rows)[1] >= 2.0


# -- step 4 (optional): real vLLM --------------------------------------------------------------


@pytest.mark.step4
@pytest.mark.gpu
def test_real_vllm_enforce_eager_is_slower_at_batch_1(tmp_path):
    from mini_vllm.bench.itl import vllm_available

    if not vllm_available():
        pytest.skip(
            "OPTIONAL: vLLM is not installed here (pip "
            "install vllm on a CUDA machine to run this part)"
        )
    from mini_vllm.models.loader import load_model

    model, _, _ = load_model("smollm2-135m", device="cpu", progress=False)
    _save_hf_dir(model, tmp_path)
    eager = impl.vllm_itl_ms(str(tmp_path), enforce_eager=True)
    graphs = impl.vllm_itl_ms(str(tmp_path), enforce_eager=False)
    assert graphs < eager


def _save_hf_dir(model, path):
    """Our random SmolLM2-shaped weights as a Hugging Face directory vLLM can load."""
    from mini_vllm.bench.harness import transformers_twin

    transformers_twin(model).save_pretrained(path)
