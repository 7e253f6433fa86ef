"""mini_vllm/bench/ladder.py: a capture ladder chosen
from a trace, scored like the engine scores it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from mini_vllm.bench.ladder import (
    choose_ladder,
    evaluate_ladder,
    load_trace,
    make_workload,
    powers_of_two_ladder,
    run_workload,
    save_trace,
    score_with_engine,
    trace_from_stats,
    tradeoff,
)
from mini_vllm.config.capture_sizes import default_capture_sizes
from mini_vllm.llm import LLM

ROOT = Path(__file__).resolve().parents[2]
LAB_TRACE = ROOT / "labs" / "phase-06/lab-01-capture-ladder" / "data" / "trace.json"


def long_tailed_trace(n: int = 4000, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [max(1, min(512, round(rng.lognormvariate(3.0, 0.8)))) for _ in range(n)]


def test_the_workload_is_reproducible_and_counted_in_steps():
    a, b = make_workload(50, seed=3), make_workload(50, seed=3)
    assert a == b and a != make_workload(50, seed=4)
    assert len(a) == 50
    assert [r.arrival_step for r in a] == sorted(r.arrival_step for r in a)
    assert all(8 <= len(r.prompt_token_ids) <= 64 and 2 <= r.max_tokens <= 160 for r in a)


def test_the_lab_trace_says_how_it_was_made():
    data = load_trace(LAB_TRACE)
    assert data["command"].startswith("python -m mini_vllm.bench.ladder --out ")
    assert data["workload"] == {
        "function": "mini_vllm.bench.ladder.make_workload",
        "num_requests": 400,
        "seed": 0,
    }
    trace = data["decode_batch_sizes"]
    assert len(trace) > 500 and min(trace) >= 1
    assert len(data["ttft_ms"]) == 400
    assert sum(1 for s in data["steps"] if s[2]) == len(trace)


def test_evaluate_matches_the_engine_dispatcher_on_a_long_tail():
    trace = long_tailed_trace()
    for ladder in (
        default_capture_sizes(256, 8192),
        powers_of_two_ladder(8),
        [1, 2, 4, 8, 16, 32, 48, 64],
    ):
        score = evaluate_ladder(trace, ladder)
        stats = score_with_engine(trace, ladder, max_num_seqs=256)
        assert score.hit_rate == pytest.approx(stats.decode_graph_hit_rate, abs=1e-12)
        assert score.padding_waste == pytest.approx(stats.padding_waste, abs=1e-12)
        assert trace_from_stats(stats) == trace


def test_decode_batches_above_max_num_seqs_replay_piecewise_graphs():
    stats = score_with_engine([4, 12], [4, 16], max_num_seqs=8)
    assert [s.runtime_mode for s in stats.steps] == ["FULL", "PIECEWISE"]
    assert stats.decode_graph_hit_rate == 1.0


def test_chooser_on_a_long_tail_with_vllms_512_cap_is_quick_and_bounded():
    trace = long_tailed_trace()
    for n in (4, 8, 16):
        ladder = choose_ladder(trace, n, max_capture_size=512)
        score = evaluate_ladder(trace, ladder)
        assert len(ladder) <= n and score.hit_rate >= 0.92 and ladder[-1] <= 512
    default = evaluate_ladder(trace, default_capture_sizes(256, 8192))
    chosen = evaluate_ladder(trace, choose_ladder(trace, 16, min_hit_rate=default.hit_rate))
    assert chosen.padding_waste < default.padding_waste  # 16 chosen graphs beat 51 default ones


def test_chooser_refuses_a_cap_below_the_needed_top_rung():
    with pytest.raises(ValueError, match="only .* of decode steps"):
        choose_ladder(long_tailed_trace(), 8, max_capture_size=16)


def test_tradeoff_curve_pads_less_with_every_graph():
    scores = tradeoff(long_tailed_trace(), range(1, 9))
    assert [s.num_graphs for s in scores] == list(range(1, 9))
    assert all(b.padding_waste <= a.padding_waste for a, b in zip(scores, scores[1:]))
    assert all(s.hit_rate >= 0.92 for s in scores)


def test_run_workload_times_every_token_and_agrees_with_the_chooser(tmp_path):
    workload = make_workload(40, seed=1)
    trace = trace_from_stats(
        run_workload(
            LLM("tiny", device="cpu", dtype="float32", max_num_seqs=16, cudagraph_mode="NONE"),
            workload,
        ).stats
    )
    ladder = choose_ladder(trace, 3)
    llm = LLM(
        "tiny",
        device="cpu",
        dtype="float32",
        max_num_seqs=16,
        cudagraph_mode="FULL_AND_PIECEWISE",
        cudagraph_capture_sizes=ladder,
    )
    run = run_workload(llm, workload)
    assert len(run.ttft_s) == len(workload)
    assert len(run.itl_s) == sum(r.max_tokens for r in workload) - len(workload)
    assert run.decode_batch_sizes == trace  # the ladder changes no scheduling decision
    assert run.stats.decode_graph_hit_rate == pytest.approx(evaluate_ladder(trace, ladder).hit_rate)
    assert run.stats.decode_graph_hit_rate >= 0.92
    saved = load_trace(save_trace(run, tmp_path / "run.json", {"note": "test"}))
    assert saved["note"] == "test" and saved["decode_batch_sizes"] == trace
