"""Phase 06, lab 01 — a capture ladder chosen from a recorded trace, scored by the engine's
own accounting."""

import itertools
import json
from collections import Counter

import pytest

import mini_vllm.bench.ladder as reference
from labkit import implementation, lab_dir_of
from labpredict import check_predictions
from mini_vllm.engine.stats import EngineStats, StepRecord

impl = implementation(__file__, starter="ladder.py", reference="mini_vllm.bench.ladder")
answers = implementation(
    __file__, starter="predictions.py", reference="tests.course.lab_checks.phase06_lab01_answers"
)

RECORDED = json.loads((lab_dir_of(__file__) / "data" / "trace.json").read_text())
TRACE = RECORDED["decode_batch_sizes"]


def step(tokens, uniform=True, prefill=0, mode="NONE", padded=None):
    return StepRecord(
        num_reqs=tokens,
        num_tokens=tokens,
        num_padded_tokens=padded or tokens,
        num_prefill_tokens=prefill,
        num_decode_tokens=tokens - prefill,
        uniform_decode=uniform,
        runtime_mode=mode,
        seconds=0.0,
    )


# The README's trace G: {size: steps}, 27 decode steps, 355 tokens.
G = {2: 3, 3: 3, 8: 3, 16: 9, 18: 4, 20: 5}
G_STEPS = [size for size, steps in G.items() for _ in range(steps)]


def step2_scenario(module):
    """The README's step 2 questions on `module`'s evaluate_ladder."""
    return {
        "hit_rate_8_16": module.evaluate_ladder(G, [8, 16]).hit_rate,
        "padding_8_16": module.evaluate_ladder(G, [8, 16]).padding_tokens,
        "padding_8_16_20": module.evaluate_ladder(G, [8, 16, 20]).padding_tokens,
    }


def step3_scenario(module):
    """The README's step 3 questions on `module`'s score_with_engine: G served with the
    ladder [4, 8, 18] and max_num_seqs 8."""
    stats = module.score_with_engine(G_STEPS, [4, 8, 18], max_num_seqs=8)
    modes = Counter(s.runtime_mode for s in stats.steps)
    padded = {s.num_tokens: s.num_padded_tokens for s in stats.steps}
    return {
        "full_steps": modes["FULL"],
        "piecewise_steps": modes["PIECEWISE"],
        "padded_size_of_20": padded[20],
        "engine_hit_rate": stats.decode_graph_hit_rate,
    }


def step4_scenario(module):
    """The README's step 4 questions on `module`'s choose_ladder and evaluate_ladder."""
    best_100 = module.choose_ladder(G, 3, min_hit_rate=1.0)
    return {
        "best_3_at_100": best_100,
        "best_padding_3_at_100": module.evaluate_ladder(G, best_100).padding_tokens,
        "top_rung_at_80": module.choose_ladder(G, 1, min_hit_rate=0.8)[-1],
        "best_3_at_80": module.choose_ladder(G, 3, min_hit_rate=0.8),
    }


# --- the trace and the score ---------------------------------------------------------


@pytest.mark.step1
def test_trace_keeps_only_uniform_decode_steps_in_order():
    stats = EngineStats(
        steps=[
            step(40, uniform=False, prefill=37),
            step(3),
            step(9, uniform=False, prefill=6),
            step(5),
            step(1),
        ]
    )
    assert impl.trace_from_stats(stats) == [3, 5, 1]


@pytest.mark.step1
def test_trace_holds_each_steps_real_size_not_the_rung_it_ran_at():
    # Recorded under a ladder 1, 4, 8: the 3 ran at 4, the 5 at 8, the 9 eagerly.
    stats = EngineStats(
        steps=[
            step(3, mode="FULL", padded=4),
            step(5, mode="FULL", padded=8),
            step(9),
            step(1, mode="FULL"),
        ]
    )
    assert impl.trace_from_stats(stats) == [3, 5, 9, 1]


@pytest.mark.step1
def test_the_recorded_runs_steps_give_the_recorded_trace():
    # Each recorded step: [tokens, prefill tokens, uniform decode (0 or 1), ms].
    steps = [
        step(tokens, uniform=bool(uniform), prefill=prefill)
        for tokens, prefill, uniform, _ in RECORDED["steps"]
    ]
    assert impl.trace_from_stats(EngineStats(steps=steps)) == TRACE
    assert impl.trace_from_stats(EngineStats()) == []


@pytest.mark.step2
def test_your_step2_predictions_match_what_the_reference_computes():
    found = step2_scenario(reference)
    check_predictions(
        answers,
        {
            "S2_HIT_RATE_8_16": found["hit_rate_8_16"],
            "S2_PADDING_8_16": found["padding_8_16"],
            "S2_PADDING_8_16_20": found["padding_8_16_20"],
        },
    )


@pytest.mark.step2
def test_the_readme_ladders_score_the_same_on_your_code():
    assert step2_scenario(impl) == pytest.approx(step2_scenario(reference), abs=1e-12)


@pytest.mark.step2
def test_rung_lookup_pads_each_step_up_to_the_next_rung():
    score = impl.evaluate_ladder([3, 4, 5, 8, 1], [8, 4])
    assert score.ladder == (4, 8)
    assert score.padding_tokens == 1 + 0 + 3 + 0 + 3
    assert score.graph_steps == score.decode_steps == 5
    assert score.real_tokens == 21


@pytest.mark.step2
def test_steps_above_the_top_rung_are_misses_that_add_no_padding():
    score = impl.evaluate_ladder({2: 6, 16: 3, 17: 1}, [4, 16])
    assert score.decode_steps == 10 and score.graph_steps == 9
    assert score.hit_rate == pytest.approx(0.9)
    assert score.padding_tokens == 6 * 2  # the 17 runs eagerly, unpadded
    assert score.padding_waste == pytest.approx(12 / (12 + 48 + 17))


@pytest.mark.step2
def test_the_callers_ladder_and_trace_are_left_as_they_were():
    ladder, trace = [8, 4, 4], [3, 4, 5, 8, 1]
    impl.evaluate_ladder(trace, ladder)
    assert ladder == [8, 4, 4] and trace == [3, 4, 5, 8, 1]


@pytest.mark.step2
def test_a_ladder_and_a_trace_given_as_generators_are_read_once():
    score = impl.evaluate_ladder((b for b in [3, 4, 5, 8, 1]), (r for r in [8, 4]))
    assert score == impl.evaluate_ladder([3, 4, 5, 8, 1], [4, 8])
    assert score.ladder == (4, 8) and score.padding_tokens == 7


@pytest.mark.step3
def test_your_step3_predictions_match_what_the_reference_computes():
    found = step3_scenario(reference)
    check_predictions(
        answers,
        {
            "S3_FULL_STEPS": found["full_steps"],
            "S3_PIECEWISE_STEPS": found["piecewise_steps"],
            "S3_PADDED_SIZE_OF_20": found["padded_size_of_20"],
            "S3_ENGINE_HIT_RATE": found["engine_hit_rate"],
        },
    )


@pytest.mark.step3
def test_the_readme_trace_is_served_the_same_on_your_code():
    assert step3_scenario(impl) == pytest.approx(step3_scenario(reference), abs=1e-12)


@pytest.mark.step3
def test_engine_accounting_pads_and_routes_like_the_dispatcher():
    stats = impl.score_with_engine([3, 8, 9, 20], [4, 8, 16], max_num_seqs=16)
    assert [s.num_padded_tokens for s in stats.steps] == [4, 8, 16, 20]
    assert [s.runtime_mode for s in stats.steps] == ["FULL", "FULL", "FULL", "NONE"]
    assert all(s.uniform_decode for s in stats.steps)
    assert [s.num_tokens for s in stats.steps] == [3, 8, 9, 20]


@pytest.mark.step3
def test_engine_accounting_without_max_num_seqs_gives_every_rung_a_full_graph():
    # A batch of 3 pads to the rung 4, above the largest batch the trace holds. The
    # ladder was captured for decode: the rung should replay its FULL graph.
    stats = impl.score_with_engine([3, 3], [4, 8])
    seen = [(s.runtime_mode, s.num_padded_tokens) for s in stats.steps]
    assert seen == [("FULL", 4), ("FULL", 4)], (
        f"without max_num_seqs the trace ran as {seen}: the dispatcher builds a FULL decode "
        "graph only for a rung that fits max_num_seqs rows (a rung of 4 needs at least 4), "
        "and the other rungs run on PIECEWISE graphs. Which max_num_seqs gives every rung "
        "of the ladder its FULL graph?"
    )


@pytest.mark.step3
def test_a_rung_exactly_at_max_num_seqs_replays_its_full_graph():
    at = impl.score_with_engine([5, 8], [4, 8], max_num_seqs=8)
    assert [(s.runtime_mode, s.num_padded_tokens) for s in at.steps] == [("FULL", 8)] * 2
    below = impl.score_with_engine([5, 8], [4, 8], max_num_seqs=7)
    assert [(s.runtime_mode, s.num_padded_tokens) for s in below.steps] == [("PIECEWISE", 8)] * 2


@pytest.mark.step3
def test_engine_accounting_with_graphs_off_runs_every_step_eagerly_unpadded():
    stats = impl.score_with_engine([3, 8, 9], [4, 8, 16], cudagraph_mode="NONE")
    assert [(s.runtime_mode, s.num_padded_tokens) for s in stats.steps] == [
        ("NONE", 3),
        ("NONE", 8),
        ("NONE", 9),
    ]
    assert stats.decode_graph_hit_rate == 0.0 and stats.padding_waste == 0.0


@pytest.mark.step3
def test_full_decode_only_runs_a_batch_above_max_num_seqs_eagerly_unpadded():
    # Without PIECEWISE graphs, a batch of 10 has no graph to pad to: the rung lookup
    # says 16, the dispatcher says eager, at 10.
    stats = impl.score_with_engine(
        (b for b in [3, 10]), [4, 16], cudagraph_mode="FULL_DECODE_ONLY", max_num_seqs=8
    )
    assert [(s.runtime_mode, s.num_padded_tokens) for s in stats.steps] == [
        ("FULL", 4),
        ("NONE", 10),
    ]


@pytest.mark.step3
def test_engine_accounting_uses_piecewise_when_only_piecewise_is_captured():
    stats = impl.score_with_engine([3, 30], [4, 8], cudagraph_mode="PIECEWISE")
    assert [(s.runtime_mode, s.num_padded_tokens) for s in stats.steps] == [
        ("PIECEWISE", 4),
        ("NONE", 30),
    ]


@pytest.mark.step3
@pytest.mark.parametrize(
    "ladder", [[1, 2, 4, 8, 16, 32], [4, 12, 20], [23], [1, 2, 3, 5, 8, 13, 21]]
)
def test_hit_rate_and_waste_equal_the_engine_stats_on_the_recorded_trace(ladder):
    score = impl.evaluate_ladder(TRACE, ladder)
    stats = impl.score_with_engine(TRACE, ladder, max_num_seqs=64)
    assert score.hit_rate == pytest.approx(stats.decode_graph_hit_rate, abs=1e-12)
    assert score.padding_waste == pytest.approx(stats.padding_waste, abs=1e-12)


# --- choosing ------------------------------------------------------------------------


@pytest.mark.step4
def test_your_step4_predictions_match_what_the_reference_computes():
    found = step4_scenario(reference)
    check_predictions(
        answers,
        {
            "S4_BEST_3_AT_100": found["best_3_at_100"],
            "S4_BEST_PADDING_3_AT_100": found["best_padding_3_at_100"],
            "S4_TOP_RUNG_AT_80": found["top_rung_at_80"],
            "S4_BEST_3_AT_80": found["best_3_at_80"],
        },
    )


@pytest.mark.step4
def test_the_readme_ladders_are_chosen_the_same_on_your_code():
    assert step4_scenario(impl) == step4_scenario(reference)


@pytest.mark.step4
@pytest.mark.parametrize("max_graphs", [1, 4, 6, 8])
def test_chosen_ladder_reaches_92_percent_on_the_recorded_trace(max_graphs):
    ladder = impl.choose_ladder(TRACE, max_graphs)
    assert impl.evaluate_ladder(TRACE, ladder).hit_rate >= 0.92


@pytest.mark.step4
@pytest.mark.parametrize("max_graphs", range(1, 13))
def test_chosen_ladder_never_exceeds_the_graph_bound(max_graphs):
    ladder = impl.choose_ladder(TRACE, max_graphs)
    assert 1 <= len(ladder) <= max_graphs
    assert ladder == sorted(set(ladder))


@pytest.mark.step4
def test_every_rung_is_a_batch_size_the_trace_holds():
    assert set(impl.choose_ladder(TRACE, 8)) <= set(TRACE)


@pytest.mark.step4
def test_chosen_ladder_pads_less_than_powers_of_two_with_the_same_count():
    naive = impl.powers_of_two_ladder(6)  # 1..32: the smallest such ladder that reaches 92% here
    assert impl.evaluate_ladder(TRACE, naive).hit_rate >= 0.92
    chosen = impl.choose_ladder(TRACE, len(naive))
    assert (
        impl.evaluate_ladder(TRACE, chosen).padding_waste
        < impl.evaluate_ladder(TRACE, naive).padding_waste / 2
    )


@pytest.mark.step4
def test_more_graphs_never_pad_more():
    wastes = [
        impl.evaluate_ladder(TRACE, impl.choose_ladder(TRACE, n)).padding_waste
        for n in range(1, 11)
    ]
    assert all(b <= a for a, b in zip(wastes, wastes[1:]))
    assert wastes[-1] < wastes[0]


SMALL_TRACES = {
    "chat": ({1: 5, 2: 9, 3: 2, 5: 7, 6: 1, 9: 4, 12: 6, 15: 1, 20: 1}, 0.9),
    # Greedy ("add the rung that saves most now") picks 8 first and ends at 41 padded
    # tokens with 3 graphs; the best 3-rung ladder pads 35.
    "greedy trap": ({2: 3, 3: 3, 8: 3, 16: 9, 18: 4, 20: 5}, 1.0),
}


@pytest.mark.step4
@pytest.mark.parametrize("name", SMALL_TRACES)
def test_chosen_ladder_is_optimal_on_a_small_trace(name):
    trace, rate = SMALL_TRACES[name]
    total = sum(trace.values())
    for max_graphs in (1, 2, 3, 4):
        chosen = impl.evaluate_ladder(
            trace, impl.choose_ladder(trace, max_graphs, min_hit_rate=rate)
        )
        best = min(
            impl.evaluate_ladder(trace, rungs).padding_tokens
            for n in range(1, max_graphs + 1)
            for rungs in itertools.combinations(sorted(trace), n)
            if sum(c for s, c in trace.items() if s <= max(rungs)) >= rate * total
        )
        assert chosen.hit_rate >= rate
        assert chosen.padding_tokens == best, (
            f"{max_graphs} graphs: {chosen.ladder} is not the least padding"
        )


def smallest_top(trace, percent):
    """The smallest size whose cumulative steps reach `percent`% of all: integers only."""
    counts = {s: trace.count(s) for s in set(trace)} if isinstance(trace, list) else trace
    total, covered = sum(counts.values()), 0
    for size in sorted(counts):
        covered += counts[size]
        if covered * 100 >= percent * total:
            return size
    raise AssertionError("unreachable")


@pytest.mark.step4
@pytest.mark.parametrize("percent", [50, 80, 92, 99, 100])
def test_top_rung_is_the_smallest_size_that_reaches_the_hit_rate(percent):
    for max_graphs in (1, 6):
        ladder = impl.choose_ladder(TRACE, max_graphs, min_hit_rate=percent / 100)
        assert ladder[-1] == smallest_top(TRACE, percent), f"{max_graphs} graphs: {ladder}"


@pytest.mark.step4
def test_a_trace_that_reaches_the_hit_rate_exactly_stops_there():
    # 3 of 4 steps are size 1: a ladder [1] reaches 75% exactly. A rung at 5 on top
    # would pad nothing more, but it is a graph more for no gain.
    assert impl.choose_ladder({1: 3, 5: 1}, 2, min_hit_rate=0.75) == [1]
    # 23 of 25 steps at or below 2: exactly 92%, the default threshold.
    assert impl.choose_ladder({1: 20, 2: 3, 9: 2}, 3) == [1, 2]


@pytest.mark.step4
def test_a_hit_rate_target_is_met_in_counts_not_in_rounded_floats():
    # 7 of 100 steps are size 1: exactly 7%. In floating point 0.07 * 100 is
    # 7.000000000000001, so "7 >= 0.07 * 100" is False, though 7 / 100 == 0.07 is True.
    assert impl.choose_ladder({1: 7, 2: 93}, 1, min_hit_rate=0.07) == [1]


@pytest.mark.step4
def test_both_ends_of_the_hit_rate_range_are_accepted():
    assert impl.choose_ladder({3: 2, 5: 1, 9: 1}, 2, min_hit_rate=0.0) == [3]
    assert impl.choose_ladder({3: 2, 5: 1, 9: 1}, 2, min_hit_rate=1.0) == [3, 9]


@pytest.mark.step4
def test_the_callers_trace_is_left_as_it_was():
    trace = {2: 3, 3: 3, 8: 3, 16: 9, 18: 4, 20: 5}
    impl.choose_ladder(trace, 3, min_hit_rate=0.8)
    assert trace == {2: 3, 3: 3, 8: 3, 16: 9, 18: 4, 20: 5}


@pytest.mark.step4
def test_a_full_hit_rate_puts_the_top_rung_on_the_largest_batch():
    assert impl.choose_ladder(TRACE, 5, min_hit_rate=1.0)[-1] == max(TRACE)


@pytest.mark.step4
def test_as_many_graphs_as_sizes_means_no_padding():
    trace = [3, 3, 7, 10, 10, 10]
    assert impl.choose_ladder(trace, 3, min_hit_rate=1.0) == [3, 7, 10]


@pytest.mark.step4
def test_infeasible_request_raises_a_clear_error():
    with pytest.raises(ValueError, match="hit rate"):
        impl.choose_ladder(TRACE, 8, min_hit_rate=0.92, max_capture_size=8)


@pytest.mark.step4
def test_a_top_rung_equal_to_the_capture_size_bound_is_allowed():
    top = smallest_top(TRACE, 92)
    assert impl.choose_ladder(TRACE, 6, max_capture_size=top)[-1] == top
    with pytest.raises(ValueError, match="hit rate"):
        impl.choose_ladder(TRACE, 6, max_capture_size=top - 1)


@pytest.mark.step4
@pytest.mark.parametrize("kwargs", [{"max_graphs": 0}, {"max_graphs": 4, "min_hit_rate": 1.5}])
def test_bad_bounds_are_errors(kwargs):
    with pytest.raises(ValueError):
        impl.choose_ladder(TRACE, **kwargs)


@pytest.mark.step4
def test_empty_trace_is_an_error():
    with pytest.raises(ValueError):
        impl.choose_ladder([], 4)


# --- the real engine -----------------------------------------------------------------


@pytest.mark.step4
def test_the_real_engine_replays_the_chosen_ladder_at_92_percent():
    from mini_vllm.bench.ladder import make_workload, run_workload
    from mini_vllm.llm import LLM

    ladder = impl.choose_ladder(TRACE, 6)
    llm = LLM(
        "tiny",
        device="cpu",
        dtype="float32",
        max_num_seqs=64,
        cudagraph_mode="FULL_AND_PIECEWISE",
        cudagraph_capture_sizes=ladder,
    )
    workload = RECORDED["workload"]
    run_workload(llm, make_workload(workload["num_requests"], workload["seed"]))
    seen = impl.trace_from_stats(llm.stats)
    assert seen == TRACE  # batch sizes depend on the scheduler only, not on the machine
    assert llm.stats.decode_graph_hit_rate >= 0.92
    assert llm.stats.decode_graph_hit_rate == pytest.approx(
        impl.evaluate_ladder(seen, ladder).hit_rate, abs=1e-12
    )
