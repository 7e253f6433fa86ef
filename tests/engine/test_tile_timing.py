"""The autotuner's tile timing keeps Triton's `do_bench` contract (CPU-OK: the graph
timing itself is replaced by fixed numbers; tests/gpu/test_triton_gemv.py runs it on a GPU)."""

from __future__ import annotations

import pytest

from mini_vllm import envs
from mini_vllm.errors import UserError
from mini_vllm.kernels import gemv as triton_gemv


def test_quantiles_of_the_per_call_times_in_milliseconds(monkeypatch):
    monkeypatch.setattr(
        triton_gemv, "graph_call_times_us", lambda fn, calls, replays: [5.0, 1.0, 3.0, 2.0, 4.0]
    )
    assert triton_gemv.tile_time_ms(None, (0.5, 0.2, 0.8)) == [0.003, 0.002, 0.005]
    assert triton_gemv.tile_time_ms(None) == [0.003]


def test_the_timing_is_chosen_by_name(monkeypatch):
    monkeypatch.setenv("MINI_VLLM_TILE_TIMING", "Triton")
    assert envs.MINI_VLLM_TILE_TIMING == "triton"
    monkeypatch.setenv("MINI_VLLM_TILE_TIMING", "alone")
    with pytest.raises(UserError, match="MINI_VLLM_TILE_TIMING='alone'.*graph, triton"):
        assert envs.MINI_VLLM_TILE_TIMING
