"""Phase 05, lab 04 — eager vs CUDA graphs on a real model shape.

Step 1 (CPU-OK) times decode steps on a simulated GPU (tests/lab04_scenarios.py): a clock
the tests move by hand and one GPU queue, where a kernel costs some CPU time to launch and
then some GPU time to run, after the work queued before it. `time.perf_counter` and
`torch.cuda.synchronize` are replaced by the simulation's, so the expected times are
known exactly and nothing depends on how fast this machine is.
Step 2 (CPU-OK) analyses made-up rows, an article's table and the recorded H100 run in
`recorded/`. Steps 3 and 4 (GPU-REQ) measure for real on a CUDA machine.
"""

from pathlib import Path

import pytest
import torch
from lab04_scenarios import FIRST_CALLS, FakeEngine, readme_step1, readme_step2, simulated

import mini_vllm.bench.itl as reference
from labkit import implementation
from labpredict import check_predictions

impl = implementation(__file__, starter="graph_vs_eager.py", reference="mini_vllm.bench.itl")
answers = implementation(
    __file__, starter="predictions.py", reference="tests.course.lab_checks.phase05_lab04_answers"
)
RECORDED = Path(__file__).resolve().parent.parent / "recorded" / "h100-itl.json"


@pytest.fixture
def sim():
    with simulated() as sim:
        yield sim


WARMUP, STEPS = 2, 3
# Each step's own time on a CPU, or on a GPU once the warm-up's queued work is done:
# 0.005, 0.0075, 0.004.
TIMED = [sum(cpu + gpu for cpu, gpu in step) for step in FIRST_CALLS[WARMUP:]]


# -- step 1: the timer -----------------------------------------------------------------------


@pytest.mark.step1
def test_your_step1_predictions_match_what_the_reference_computes():
    found = readme_step1(reference.time_decode_steps)
    check_predictions(
        answers,
        {
            "S1_EAGER_MS": found["eager_ms"],
            "S1_GRAPH_MS": found["graph_ms"],
            "S1_GRAPH_MS_NO_SYNC": found["graph_ms_no_sync"],
            "S1_SPEEDUP_NO_SYNC": found["speedup_no_sync"],
            "S1_MEAN_FROM_FIRST_CALL_MS": found["mean_from_first_call_ms"],
        },
    )


@pytest.mark.step1
def test_the_readme_steps_e_and_g_time_the_same_on_your_code():
    mine, ref = readme_step1(impl.time_decode_steps), readme_step1(reference.time_decode_steps)
    assert mine == pytest.approx(ref, rel=1e-9)


@pytest.mark.step1
def test_timer_steps_warmup_plus_steps_times_and_returns_one_time_per_timed_step(sim):
    engine = FakeEngine(sim, FIRST_CALLS, "cpu")
    times = impl.time_decode_steps(engine, steps=STEPS, warmup=WARMUP)
    assert engine.calls == WARMUP + STEPS
    assert len(times) == STEPS


@pytest.mark.step1
def test_timer_gives_each_timed_step_alone_without_the_warmup_on_a_cpu(sim):
    engine = FakeEngine(sim, FIRST_CALLS, "cpu")
    times = impl.time_decode_steps(engine, steps=STEPS, warmup=WARMUP)
    # Each entry is one step's own time, in seconds: not from the first token, not cumulative.
    assert times == pytest.approx(TIMED, rel=1e-9)
    assert sim.syncs == 0, "on a CPU there is no device to wait for (no call into CUDA)"


@pytest.mark.step1
def test_a_cpu_engine_is_not_synchronised_on_a_machine_that_has_a_gpu(sim, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    engine = FakeEngine(sim, FIRST_CALLS, "cpu")
    times = impl.time_decode_steps(engine, steps=STEPS, warmup=WARMUP)
    assert sim.syncs == 0, (
        "the engine runs on the CPU: whether this machine also has a GPU does not matter "
        "(wait for the engine's device, engine.runner.device)"
    )
    assert times == pytest.approx(TIMED, rel=1e-9)


@pytest.mark.step1
def test_timer_on_a_gpu_waits_for_the_kernels_not_only_the_launches(sim):
    engine = FakeEngine(sim, FIRST_CALLS, "cuda")
    times = impl.time_decode_steps(engine, steps=STEPS, warmup=WARMUP)
    launches = [sum(cpu for cpu, _ in step) for step in FIRST_CALLS[WARMUP:]]
    assert times != pytest.approx(launches, rel=1e-9), (
        "these are the launch times alone: the clock was read before the GPU had finished"
    )
    assert times == pytest.approx(TIMED, rel=1e-9)


@pytest.mark.step1
def test_timer_on_a_gpu_leaves_the_warmups_queued_work_out_of_the_first_timed_step(sim):
    # The warm-up's kernels (70 ms of GPU work) are still running when its last call returns.
    engine = FakeEngine(sim, FIRST_CALLS, "cuda")
    times = impl.time_decode_steps(engine, steps=STEPS, warmup=WARMUP)
    assert times[0] == pytest.approx(TIMED[0], rel=1e-9), (
        f"first timed step took {times[0] * 1000:.1f} ms, expected {TIMED[0] * 1000:.1f}: "
        "its clock started while the GPU was still running the warm-up's kernels, so they "
        "count as this step's latency"
    )


@pytest.mark.step1
def test_timer_waits_for_the_engines_own_gpu(sim):
    engine = FakeEngine(sim, FIRST_CALLS, "cuda:1")
    impl.time_decode_steps(engine, steps=STEPS, warmup=WARMUP)
    assert sim.syncs > 0
    waited_for = [None if d is None else torch.device(d) for d in sim.synced_devices]
    assert all(d == torch.device("cuda:1") for d in waited_for), (
        f"synchronised {sim.synced_devices}: the engine runs on cuda:1, and a bare "
        "synchronize() waits for the current device (cuda:0 unless changed) instead"
    )


@pytest.mark.step1
def test_timer_with_no_warmup_times_from_the_first_call(sim):
    engine = FakeEngine(sim, FIRST_CALLS, "cuda")
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
def test_your_step2_predictions_match_what_the_reference_computes():
    _, rows = reference.load_recorded(RECORDED)
    found = readme_step2(reference, rows)
    check_predictions(
        answers,
        {
            "S2_ARTICLE_SAVING_MS_BATCH_32": found["article_saving_ms_batch_32"],
            "S2_ARTICLE_CROSSOVER_AT_1_30": found["article_crossover_at_1_30"],
            "S2_RECORDED_CROSSOVER_AT_6": found["recorded_crossover_at_6"],
        },
    )


@pytest.mark.step2
def test_the_readme_article_and_recorded_run_give_the_same_on_your_code():
    _, rows = impl.load_recorded(RECORDED)
    assert readme_step2(impl, rows) == pytest.approx(readme_step2(reference, rows), rel=1e-9)


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
def test_crossover_agrees_with_the_speedups_exactly_at_the_threshold():
    rows = [impl.ITLRow(1, 12.0, 2.0), impl.ITLRow(16, 3.15, 3.0), impl.ITLRow(64, 3.1, 3.0)]
    assert impl.speedups(rows)[16] == 1.05  # 3.15 / 3.0, to the last bit
    assert impl.crossover_batch(rows, threshold=1.05) == 64, (
        "batch 16's speed-up is exactly 1.05, not below it; 1.05 * 3.0 is "
        f"{1.05 * 3.0!r} in floating point, so comparing eager with threshold * graph "
        "disagrees with the speed-up itself"
    )


@pytest.mark.step2
def test_crossover_does_not_depend_on_the_order_of_the_rows():
    shuffled = [ROWS[3], ROWS[1], ROWS[0], ROWS[2]]
    assert impl.crossover_batch(shuffled, threshold=2.5) == 32
    assert impl.crossover_batch(list(reversed(ROWS)), threshold=5.0) == 8


@pytest.mark.step2
def test_crossover_is_none_while_graphs_still_pay():
    assert impl.crossover_batch(ROWS[:3]) is None
    assert impl.crossover_batch(ROWS, threshold=1.01) is None
    assert impl.crossover_batch([]) is None


@pytest.mark.step2
def test_the_analysis_reads_rows_from_a_generator_once():
    assert impl.speedups(row for row in ROWS) == impl.speedups(ROWS)
    assert impl.saving_ms(row for row in ROWS) == impl.saving_ms(ROWS)
    assert impl.crossover_batch((row for row in reversed(ROWS)), threshold=2.5) == 32
    assert impl.speedups([]) == {} and impl.saving_ms([]) == {}


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
