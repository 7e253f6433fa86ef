"""Lab 05 — the capture-size ladder: the default ladder, a user's ladder, the rung lookup,
padding waste, and what a denser ladder costs."""

import pytest

import mini_vllm.config.capture_sizes as reference
from labkit import implementation
from labpredict import Approx, check_predictions
from mini_vllm.engine.stats import EngineStats, StepRecord

impl = implementation(
    __file__, starter="capture_sizes.py", reference="mini_vllm.config.capture_sizes"
)
answers = implementation(
    __file__, starter="predictions.py", reference="tests.course.lab_checks.phase05_lab05_answers"
)


def default_ladder():
    return impl.default_capture_sizes(max_num_seqs=256, max_num_batched_tokens=8192)


POWERS_OF_TWO = [1, 2, 4, 8, 16, 32]
TRACE_Q = {3: 40, 5: 30, 9: 20, 12: 10}  # the README's trace Q: decode batches of 3 to 12


def step1_scenario(sizes):
    """The README's step 1 questions, on `sizes` (a module with default_capture_sizes)."""
    return (
        len(sizes.default_capture_sizes(256, 8192)),
        sizes.default_capture_sizes(130, 8192)[-1],
        sizes.default_capture_sizes(256, 20)[-1],
    )


def step3_scenario(sizes):
    """The README's step 3 questions, on `sizes`."""
    at_256 = sizes.default_capture_sizes(256, 8192)
    at_130 = sizes.default_capture_sizes(130, 8192)
    return (
        sizes.padded_size(33, at_256),
        sizes.padded_size(257, at_256),
        sizes.padded_size(258, at_130) is not None,
    )


def step4_scenario(sizes):
    """The README's step 4 questions, on `sizes`."""
    ladder = sizes.default_capture_sizes(256, 8192)
    return (
        sizes.padding_waste(TRACE_Q, ladder).padding_tokens,
        sizes.padding_waste(TRACE_Q, POWERS_OF_TWO).padding_tokens,
        sizes.padding_waste([33], ladder).waste,
    )


def rung(size, ladder):
    """The rung by its definition, written out here so no code under test is trusted."""
    return min((s for s in ladder if s >= size), default=None)


# --- step 1: the default ladder ---------------------------------------------------------


@pytest.mark.step1
def test_your_step1_predictions_match_what_the_reference_computes():
    sizes, top_130, top_budget_20 = step1_scenario(reference)
    check_predictions(
        answers,
        {
            "S1_NUM_SIZES_256_SEQS": sizes,
            "S1_TOP_RUNG_130_SEQS": top_130,
            "S1_TOP_RUNG_BUDGET_20": top_budget_20,
        },
    )


@pytest.mark.step1
def test_the_readme_step1_scenario_runs_the_same_on_your_code():
    assert step1_scenario(impl) == step1_scenario(reference)


@pytest.mark.step1
def test_default_ladder_has_51_sizes_at_max_512():
    ladder = default_ladder()
    assert len(ladder) == 51
    assert ladder[:5] == [1, 2, 4, 8, 16]
    assert ladder[-3:] == [480, 496, 512]
    assert 248 in ladder and 256 in ladder and 264 not in ladder and 272 in ladder
    assert ladder == sorted(set(ladder)), "ascending, each size once"


@pytest.mark.step1
def test_default_ladder_follows_max_num_seqs():
    assert impl.default_capture_sizes(max_num_seqs=8, max_num_batched_tokens=8192) == [
        1,
        2,
        4,
        8,
        16,
    ]
    assert impl.default_capture_sizes(max_num_seqs=1, max_num_batched_tokens=8192) == [1, 2]
    ladder = impl.default_capture_sizes(max_num_seqs=160, max_num_batched_tokens=8192)
    assert ladder[-5:] == [256, 272, 288, 304, 320] and len(ladder) == 3 + 31 + 5


@pytest.mark.step1
def test_default_ladder_stops_at_512_whatever_max_num_seqs():
    assert default_ladder() == impl.default_capture_sizes(1024, 1 << 20)


@pytest.mark.step1
def test_default_ladder_is_clipped_to_the_token_budget():
    assert impl.default_capture_sizes(max_num_seqs=256, max_num_batched_tokens=20) == [
        1,
        2,
        4,
        8,
        16,
    ]
    assert impl.default_capture_sizes(max_num_seqs=256, max_num_batched_tokens=3) == [1, 2]


@pytest.mark.step1
def test_a_largest_size_on_the_grid_is_the_top_rung():
    # 2 * 128 = 256 exactly: the last multiple of 8 below it, then 256 itself.
    at_128 = impl.default_capture_sizes(max_num_seqs=128, max_num_batched_tokens=8192)
    assert at_128[-3:] == [240, 248, 256] and len(at_128) == 3 + 31 + 1
    assert impl.default_capture_sizes(max_num_seqs=4, max_num_batched_tokens=8192) == [
        1,
        2,
        4,
        8,
    ]
    assert impl.default_capture_sizes(max_num_seqs=2, max_num_batched_tokens=8192) == [1, 2, 4]
    # A token budget exactly at a rung keeps that rung.
    assert impl.default_capture_sizes(max_num_seqs=256, max_num_batched_tokens=16)[-1] == 16
    assert impl.default_capture_sizes(max_num_seqs=256, max_num_batched_tokens=8) == [1, 2, 4, 8]


@pytest.mark.step1
def test_a_largest_size_off_the_grid_is_not_a_rung():
    # 2 * 130 = 260 is not a multiple of 16: the ladder stops at 256, and a batch of 257
    # to 260 tokens runs eagerly. The ladder never goes past its largest size either.
    at_130 = impl.default_capture_sizes(max_num_seqs=130, max_num_batched_tokens=8192)
    assert at_130[-2:] == [248, 256] and 260 not in at_130
    at_100 = impl.default_capture_sizes(max_num_seqs=100, max_num_batched_tokens=8192)
    assert at_100[-2:] == [192, 200]
    assert impl.default_capture_sizes(max_num_seqs=256, max_num_batched_tokens=30)[-1] == 24


@pytest.mark.step1
def test_enforce_eager_captures_nothing():
    assert impl.default_capture_sizes(256, 8192, enforce_eager=True) == []


@pytest.mark.step1
@pytest.mark.parametrize("seqs, budget", [(0, 8192), (256, 0), (-1, 8192)])
def test_default_ladder_rejects_non_positive_limits(seqs, budget):
    with pytest.raises(ValueError):
        impl.default_capture_sizes(seqs, budget)


# --- step 2: a user's ladder ------------------------------------------------------------


@pytest.mark.step2
def test_user_ladder_is_deduplicated_filtered_and_sorted():
    got = impl.normalize_capture_sizes([64, 8, 8, 1, 4096, 16], max_num_batched_tokens=2048)
    assert got == [1, 8, 16, 64]


@pytest.mark.step2
def test_user_ladder_keeps_a_size_equal_to_the_token_budget():
    assert impl.normalize_capture_sizes([2048, 512, 4096], max_num_batched_tokens=2048) == [
        512,
        2048,
    ]


@pytest.mark.step2
def test_user_ladder_leaves_the_callers_list_alone():
    sizes = [64, 8, 8, 1, 4096, 16]
    assert impl.normalize_capture_sizes(sizes, max_num_batched_tokens=2048) == [1, 8, 16, 64]
    assert sizes == [64, 8, 8, 1, 4096, 16], "the caller's list was changed"


@pytest.mark.step2
def test_user_ladder_accepts_any_iterable():
    assert impl.normalize_capture_sizes((s for s in (32, 4, 32)), 64) == [4, 32]


@pytest.mark.step2
@pytest.mark.parametrize("bad", [[], [0, 8], [-4], [2.5], [True, 8]])
def test_user_ladder_rejects_empty_or_non_positive_sizes(bad):
    with pytest.raises(ValueError):
        impl.normalize_capture_sizes(bad, max_num_batched_tokens=2048)


@pytest.mark.step2
def test_user_ladder_entirely_above_the_budget_is_an_error():
    with pytest.raises(ValueError):
        impl.normalize_capture_sizes([4096, 8192], max_num_batched_tokens=2048)


# --- step 3: the rung lookup ------------------------------------------------------------


@pytest.mark.step3
def test_your_step3_predictions_match_what_the_reference_computes():
    rung_33, rung_257, has_graph_258 = step3_scenario(reference)
    check_predictions(
        answers,
        {
            "S3_RUNG_OF_33": rung_33,
            "S3_RUNG_OF_257": rung_257,
            "S3_258_HAS_A_GRAPH_AT_130_SEQS": has_graph_258,
        },
    )


@pytest.mark.step3
def test_the_readme_step3_scenario_runs_the_same_on_your_code():
    assert step3_scenario(impl) == step3_scenario(reference)


@pytest.mark.step3
@pytest.mark.parametrize(
    "batch, rung", [(33, 40), (32, 32), (3, 4), (1, 1), (5, 8), (249, 256), (257, 272), (512, 512)]
)
def test_rung_lookup_pads_up_to_the_next_capture_size(batch, rung):
    assert impl.padded_size(batch, default_ladder()) == rung


@pytest.mark.step3
def test_rung_lookup_a_batch_exactly_at_the_top_rung_has_its_graph_one_past_has_none():
    ladder = [1, 8, 16, 64]
    assert impl.padded_size(64, ladder) == 64, "the largest graph serves a batch of its size"
    assert impl.padded_size(65, ladder) is None
    assert [impl.padded_size(n, [8]) for n in (1, 7, 8, 9)] == [8, 8, 8, None]


@pytest.mark.step3
def test_rung_lookup_above_the_ladder_is_none():
    assert impl.padded_size(513, default_ladder()) is None
    assert impl.padded_size(1, []) is None


@pytest.mark.step3
def test_rung_lookup_on_every_size_of_a_sparse_ladder():
    ladder = [2, 4, 8, 16, 32]
    got = [impl.padded_size(n, ladder) for n in range(1, 35)]
    assert got == [min([s for s in ladder if s >= n], default=None) for n in range(1, 35)]


@pytest.mark.step3
@pytest.mark.parametrize("tokens", [0, -3])
def test_rung_lookup_rejects_an_empty_batch(tokens):
    with pytest.raises(ValueError):
        impl.padded_size(tokens, default_ladder())


# --- step 4: padding waste --------------------------------------------------------------


@pytest.mark.step4
def test_your_step4_predictions_match_what_the_reference_computes():
    padding_default, padding_powers, waste_33 = step4_scenario(reference)
    check_predictions(
        answers,
        {
            "S4_PADDING_DEFAULT_LADDER": padding_default,
            "S4_PADDING_POWERS_OF_TWO": padding_powers,
            "S4_WASTE_OF_33": Approx(waste_33, rel=5e-3),
        },
    )


@pytest.mark.step4
def test_the_readme_step4_scenario_runs_the_same_on_your_code():
    assert step4_scenario(impl) == pytest.approx(step4_scenario(reference))


@pytest.mark.step4
def test_padding_waste_counts_padded_tokens_over_real_tokens():
    # 33 -> 40 (7 padding), 40 -> 40 (0), 3 -> 4 (1), 600 runs eagerly (no padding, a miss,
    # and still 600 tokens of work)
    report = impl.padding_waste([33, 40, 3, 600], default_ladder())
    assert report == impl.PaddingReport(
        real_tokens=33 + 40 + 3 + 600, padding_tokens=8, graph_steps=3, eager_steps=1
    )
    assert report.waste == pytest.approx(8 / 676)
    assert report.hit_rate == pytest.approx(0.75)


@pytest.mark.step4
def test_padding_waste_accepts_a_histogram():
    as_list = impl.padding_waste([5] * 10 + [9] * 3, [1, 2, 4, 8, 16])
    as_hist = impl.padding_waste({5: 10, 9: 3}, [1, 2, 4, 8, 16])
    assert as_list == as_hist
    assert as_hist.padding_tokens == 10 * 3 + 3 * 7
    assert as_hist.real_tokens == 10 * 5 + 3 * 9 and as_hist.graph_steps == 13


@pytest.mark.step4
def test_padding_waste_of_a_trace_above_the_ladder_is_all_misses():
    report = impl.padding_waste({100: 4, 200: 1}, POWERS_OF_TWO)
    assert report == impl.PaddingReport(
        real_tokens=600, padding_tokens=0, graph_steps=0, eager_steps=5
    )


@pytest.mark.step4
def test_real_tokens_are_the_traces_work_whatever_the_ladder():
    """The decision of step 4: a batch that runs eagerly is still work the trace asked for.
    Leave its tokens out of real_tokens and the same trace has less work on a shorter
    ladder: its waste comes out as padding over the few batches that fit, and two ladders
    are no longer compared on the same work."""
    trace = {3: 10, 600: 1}
    for ladder in ([1, 2, 4], [1, 2, 4, 8], [1, 2, 4, 1024], default_ladder()):
        report = impl.padding_waste(trace, ladder)
        assert report.real_tokens == 3 * 10 + 600, (
            f"on {ladder[:6]}: real_tokens {report.real_tokens}, but the trace holds 630 "
            "tokens whichever ladder runs it"
        )
    short = impl.padding_waste(trace, [1, 2, 4])
    assert short.padding_tokens == 10 and short.eager_steps == 1
    assert short.waste == pytest.approx(10 / 630), "10 padding tokens in 630 of work, not 10 in 30"


@pytest.mark.step4
def test_the_report_agrees_with_the_engines_padding_waste_and_hit_rate():
    """The engine's own metrics (mini_vllm.engine.stats, served on /metrics) count every
    step: padded tokens over real ones, and the share of decode steps that replayed."""
    trace = [3, 3, 9, 40, 41, 600, 700, 12, 3]
    ladder = [1, 2, 4, 8, 16, 32, 64]
    stats = EngineStats()
    for size in trace:
        padded = rung(size, ladder)
        stats.record(
            StepRecord(
                num_reqs=size,
                num_tokens=size,
                num_padded_tokens=size if padded is None else padded,
                num_prefill_tokens=0,
                num_decode_tokens=size,
                uniform_decode=True,
                runtime_mode="NONE" if padded is None else "FULL",
                seconds=0.0,
            )
        )
    report = impl.padding_waste(trace, ladder)
    assert report.waste == pytest.approx(stats.padding_waste)
    assert report.hit_rate == pytest.approx(stats.decode_graph_hit_rate)


@pytest.mark.step4
def test_padding_waste_at_the_top_rung_and_one_past():
    report = impl.padding_waste([512, 513], default_ladder())
    assert report == impl.PaddingReport(
        real_tokens=1025, padding_tokens=0, graph_steps=1, eager_steps=1
    )


@pytest.mark.step4
def test_default_ladder_is_no_denser_than_powers_of_two_below_16():
    # A server whose batches hold 3 to 12 requests: both ladders pad exactly alike.
    trace = {3: 40, 5: 30, 9: 20, 12: 10}
    sparse = impl.padding_waste(trace, POWERS_OF_TWO)
    dense = impl.padding_waste(trace, default_ladder())
    assert sparse == dense
    assert sparse.padding_tokens == 40 * 1 + 30 * 3 + 20 * 7 + 10 * 4 == 310
    assert impl.padding_waste(trace, [3, 5, 9, 12, 16, 32]).padding_tokens == 0


# --- step 5: the trade ------------------------------------------------------------------


@pytest.mark.step5
def test_denser_ladder_wastes_less_but_costs_more_graphs():
    trace = {1: 50, 3: 40, 5: 30, 12: 20, 20: 10, 33: 5}
    sparse = impl.ladder_cost(
        trace, [1, 2, 4, 8, 16, 32, 64], capture_seconds_per_graph=0.5, memory_mib_per_graph=20
    )
    dense = impl.ladder_cost(
        trace, list(range(1, 65)), capture_seconds_per_graph=0.5, memory_mib_per_graph=20
    )
    assert dense.padding.padding_tokens == 0 < sparse.padding.padding_tokens
    assert sparse.padding == impl.padding_waste(trace, [1, 2, 4, 8, 16, 32, 64])
    assert dense.num_graphs == 64 and sparse.num_graphs == 7
    assert dense.capture_seconds == pytest.approx(32.0)
    assert sparse.capture_seconds == pytest.approx(3.5)
    assert dense.graph_memory_mib == pytest.approx(1280)
    assert sparse.graph_memory_mib == pytest.approx(140)


@pytest.mark.step5
def test_every_rung_costs_a_graph_even_if_the_trace_never_uses_it():
    cost = impl.ladder_cost({3: 10}, [1, 2, 4, 8], 0.5, 20.0)
    assert cost == impl.LadderCost(
        num_graphs=4,
        padding=impl.PaddingReport(30, 10, 10, 0),
        capture_seconds=2.0,
        graph_memory_mib=80.0,
    )


@pytest.mark.step5
def test_ladder_too_short_for_the_trace_loses_hit_rate():
    trace = {8: 90, 100: 10}
    assert impl.ladder_cost(trace, [1, 2, 4, 8], 0.1, 1.0).padding.hit_rate == pytest.approx(0.9)
    longer = impl.ladder_cost(trace, [1, 2, 4, 8, 128], 0.1, 1.0)
    assert longer.padding.hit_rate == pytest.approx(1.0)


@pytest.mark.step5
def test_a_graph_that_costs_nothing_is_allowed():
    # A cost left out of the comparison is zero, not an error.
    cost = impl.ladder_cost({8: 2}, [8], capture_seconds_per_graph=0.0, memory_mib_per_graph=0.0)
    assert cost == impl.LadderCost(
        num_graphs=1,
        padding=impl.PaddingReport(16, 0, 2, 0),
        capture_seconds=0.0,
        graph_memory_mib=0.0,
    )


@pytest.mark.step5
@pytest.mark.parametrize("seconds, mib", [(-1.0, 0.0), (0.0, -5.0)])
def test_ladder_cost_rejects_negative_per_graph_costs(seconds, mib):
    with pytest.raises(ValueError):
        impl.ladder_cost({1: 1}, [1], capture_seconds_per_graph=seconds, memory_mib_per_graph=mib)
