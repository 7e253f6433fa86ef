"""Lab 04 — eager vs CUDA graphs on a real model shape:
the recorded run (CPU-OK) and a live one (GPU-REQ)."""

import pytest

from labkit import implementation

impl = implementation(__file__, starter="graph_vs_eager.py", reference="mini_vllm.bench.itl")
RECORDED = (
    __import__("pathlib").Path(__file__).resolve().parent.parent / "recorded" / "h100-itl.json"
)

ROWS = [
    impl.ITLRow(1, 12.0, 2.0),
    impl.ITLRow(8, 13.0, 3.0),
    impl.ITLRow(32, 20.0, 10.0),
    impl.ITLRow(64, 31.0, 30.0),
]


def test_speedup_is_eager_over_graph_per_batch():
    assert impl.speedups(ROWS) == {
        1: 6.0,
        8: pytest.approx(13 / 3),
        32: 2.0,
        64: pytest.approx(31 / 30),
    }


def test_saving_is_eager_minus_graph_per_batch():
    assert impl.saving_ms(ROWS) == {1: 10.0, 8: 10.0, 32: 10.0, 64: 1.0}


def test_crossover_is_the_first_batch_below_the_threshold():
    assert impl.crossover_batch(ROWS) == 64
    assert impl.crossover_batch(ROWS, threshold=2.5) == 32
    assert (
        impl.crossover_batch(list(reversed(ROWS)), threshold=2.5) == 32
    )  # order of the rows does not matter


def test_crossover_is_none_while_graphs_still_pay():
    assert impl.crossover_batch(ROWS[:3]) is None


def test_recorded_h100_run_graphs_win_big_at_batch_1_and_less_at_64():
    meta, rows = impl.load_recorded(RECORDED)
    assert "H100" in meta["machine"]
    gains = impl.speedups(rows)
    assert gains[1] >= 3.0  # launch-bound: graphs remove most of the step
    assert gains[max(gains)] < gains[1]  # the gain shrinks as the GPU gets busier
    # What graphs save is the launch time, so it does not grow with the batch the way the step does.
    saved = impl.saving_ms(rows)
    assert saved[max(saved)] < 2 * saved[1]


@pytest.mark.gpu
def test_time_decode_steps_returns_one_positive_time_per_step():
    from mini_vllm.bench.itl import decoding_engine
    from mini_vllm.models.loader import load_model

    model, _, _ = load_model("smollm2-135m", device="cuda", progress=False)
    engine = decoding_engine(model, 1, 128, 40, "full_and_piecewise")
    times = impl.time_decode_steps(engine, steps=10, warmup=2)
    assert len(times) == 10 and all(t > 0 for t in times)
    assert engine.stats.steps[-1].runtime_mode == "FULL"


@pytest.mark.gpu
def test_graphs_beat_eager_at_batch_1_on_this_gpu():
    rows = impl.measure_itl("smollm2-135m", "cuda", batch_sizes=[1], steps=15)
    assert impl.speedups(rows)[1] >= 2.0


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
