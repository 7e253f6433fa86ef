"""Lab 05 — the capture-size ladder: rungs, the default ladder, padding waste, the trade."""

import pytest

from labkit import implementation

impl = implementation(
    __file__, starter="capture_sizes.py", reference="mini_vllm.config.capture_sizes"
)


def default_ladder():
    return impl.default_capture_sizes(max_num_seqs=256, max_num_batched_tokens=8192)


@pytest.mark.parametrize(
    "batch, rung", [(33, 40), (32, 32), (3, 4), (1, 1), (5, 8), (249, 256), (257, 272), (512, 512)]
)
def test_rung_lookup_pads_up_to_the_next_capture_size(batch, rung):
    assert impl.padded_size(batch, default_ladder()) == rung


def test_rung_lookup_above_the_ladder_is_none():
    assert impl.padded_size(513, default_ladder()) is None


def test_default_ladder_has_51_sizes_at_max_512():
    ladder = default_ladder()
    assert len(ladder) == 51
    assert ladder[:5] == [1, 2, 4, 8, 16]
    assert ladder[-3:] == [480, 496, 512]
    assert 248 in ladder and 256 in ladder and 264 not in ladder


def test_default_ladder_follows_max_num_seqs():
    assert impl.default_capture_sizes(max_num_seqs=8, max_num_batched_tokens=8192) == [
        1,
        2,
        4,
        8,
        16,
    ]
    assert impl.default_capture_sizes(max_num_seqs=1, max_num_batched_tokens=8192) == [1, 2]


def test_default_ladder_is_clipped_to_the_token_budget():
    assert impl.default_capture_sizes(max_num_seqs=256, max_num_batched_tokens=20) == [
        1,
        2,
        4,
        8,
        16,
    ]


def test_enforce_eager_captures_nothing():
    assert impl.default_capture_sizes(256, 8192, enforce_eager=True) == []


def test_user_ladder_is_deduplicated_filtered_and_sorted():
    assert impl.normalize_capture_sizes([64, 8, 8, 1, 4096, 16], max_num_batched_tokens=2048) == [
        1,
        8,
        16,
        64,
    ]


@pytest.mark.parametrize("bad", [[], [0, 8], [-4], [2.5]])
def test_user_ladder_rejects_empty_or_non_positive_sizes(bad):
    with pytest.raises(ValueError):
        impl.normalize_capture_sizes(bad, max_num_batched_tokens=2048)


def test_padding_waste_counts_padded_tokens_over_real_tokens():
    # 33 -> 40 (7 padding), 40 -> 40 (0), 3 -> 4 (1), 600 runs eagerly (no padding, a miss)
    report = impl.padding_waste([33, 40, 3, 600], default_ladder())
    assert report.real_tokens == 33 + 40 + 3 + 600
    assert report.padding_tokens == 8
    assert report.waste == pytest.approx(8 / 676)
    assert (report.graph_steps, report.eager_steps) == (3, 1)
    assert report.hit_rate == pytest.approx(0.75)


def test_padding_waste_accepts_a_histogram():
    as_list = impl.padding_waste([5] * 10 + [9] * 3, [1, 2, 4, 8, 16])
    as_hist = impl.padding_waste({5: 10, 9: 3}, [1, 2, 4, 8, 16])
    assert as_list == as_hist
    assert as_hist.padding_tokens == 10 * 3 + 3 * 7


def test_denser_ladder_wastes_less_but_costs_more_graphs():
    trace = {1: 50, 3: 40, 5: 30, 12: 20, 20: 10, 33: 5}
    sparse = impl.ladder_cost(
        trace, [1, 2, 4, 8, 16, 32, 64], capture_seconds_per_graph=0.5, memory_mib_per_graph=20
    )
    dense = impl.ladder_cost(
        trace, list(range(1, 65)), capture_seconds_per_graph=0.5, memory_mib_per_graph=20
    )
    assert dense.padding.padding_tokens == 0 < sparse.padding.padding_tokens
    assert dense.num_graphs == 64 and sparse.num_graphs == 7
    assert dense.capture_seconds == pytest.approx(32.0) and sparse.capture_seconds == pytest.approx(
        3.5
    )
    assert dense.graph_memory_mib == pytest.approx(
        1280
    ) and sparse.graph_memory_mib == pytest.approx(140)


def test_ladder_too_short_for_the_trace_loses_hit_rate():
    trace = {8: 90, 100: 10}
    assert impl.ladder_cost(trace, [1, 2, 4, 8], 0.1, 1.0).padding.hit_rate == pytest.approx(0.9)
    assert impl.ladder_cost(trace, [1, 2, 4, 8, 128], 0.1, 1.0).padding.hit_rate == pytest.approx(
        1.0
    )


def test_ladder_cost_rejects_negative_per_graph_costs():
    with pytest.raises(ValueError):
        impl.ladder_cost({1: 1}, [1], capture_seconds_per_graph=-1.0, memory_mib_per_graph=0.0)
