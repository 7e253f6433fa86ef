"""Lab 03 — routing batches to FULL / PIECEWISE / NONE graphs."""

import pytest

from labkit import implementation

impl = implementation(
    __file__, starter="cudagraph_dispatcher.py", reference="mini_vllm.engine.cudagraph_dispatcher"
)
M = impl.CUDAGraphMode
BD = impl.BatchDescriptor

LADDER = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]


def make(mode, max_num_seqs=64, sizes=LADDER, q=1):
    return impl.CudagraphDispatcher(M[mode], sizes, max_num_seqs, uniform_decode_query_len=q)


# mode -> (runtime mode for uniform decode, runtime mode for a mixed batch)
ROUTES = {
    "NONE": ("NONE", "NONE"),
    "PIECEWISE": ("PIECEWISE", "PIECEWISE"),
    "FULL": ("FULL", "FULL"),
    "FULL_DECODE_ONLY": ("FULL", "NONE"),
    "FULL_AND_PIECEWISE": ("FULL", "PIECEWISE"),
}


@pytest.mark.parametrize("mode", list(ROUTES))
def test_dispatch_routes_decode_and_mixed_batches_per_mode(mode):
    dispatcher = make(mode)
    decode_mode, _ = dispatcher.dispatch(16, uniform_decode=True)
    mixed_mode, _ = dispatcher.dispatch(16, uniform_decode=False)
    assert (decode_mode.name, mixed_mode.name) == ROUTES[mode]


def test_dispatch_full_and_piecewise_gives_decode_its_exact_uniform_key():
    mode, key = make("FULL_AND_PIECEWISE").dispatch(33, uniform_decode=True)
    assert mode is M.FULL
    assert key == BD(40, 40, uniform=True)


def test_dispatch_mixed_batch_gets_the_relaxed_padded_key():
    mode, key = make("FULL_AND_PIECEWISE").dispatch(33, uniform_decode=False)
    assert mode is M.PIECEWISE
    assert key == BD(40) and key.num_reqs is None and key.uniform is False


def test_dispatch_full_alone_serves_decode_through_the_relaxed_key():
    mode, key = make("FULL").dispatch(3, uniform_decode=True)
    assert mode is M.FULL and key == BD(4)


def test_dispatch_disable_full_falls_back_to_piecewise():
    mode, key = make("FULL_AND_PIECEWISE").dispatch(8, uniform_decode=True, disable_full=True)
    assert mode is M.PIECEWISE and key == BD(8)
    mode, key = make("FULL_DECODE_ONLY").dispatch(8, uniform_decode=True, disable_full=True)
    assert mode is M.NONE and key.num_tokens == 8


@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL", "FULL_AND_PIECEWISE"])
def test_dispatch_above_the_ladder_runs_eager_unpadded(mode):
    runtime, key = make(mode).dispatch(65, uniform_decode=True)
    assert runtime is M.NONE and key.num_tokens == 65


def test_dispatch_exact_capture_size_is_not_padded():
    assert make("PIECEWISE").dispatch(32, uniform_decode=False) == (M.PIECEWISE, BD(32))


def test_dispatch_uniform_keys_stop_at_max_num_seqs():
    # 8 requests at most: a uniform batch above 8 tokens cannot exist, so no FULL key for it.
    dispatcher = make("FULL_AND_PIECEWISE", max_num_seqs=8)
    assert {k.num_tokens for k in dispatcher.keys[M.FULL]} == {1, 2, 4, 8}
    assert {k.num_tokens for k in dispatcher.keys[M.PIECEWISE]} == set(LADDER)


def test_dispatch_speculative_decode_keys_start_at_query_len():
    dispatcher = make("FULL_AND_PIECEWISE", max_num_seqs=8, q=4)
    assert {k.num_tokens for k in dispatcher.keys[M.FULL]} == {4, 8, 16, 24, 32}
    mode, key = dispatcher.dispatch(12, uniform_decode=True)
    assert mode is M.FULL and key == BD(16, 4, uniform=True)


def test_dispatch_none_mode_has_no_keys_and_never_pads():
    dispatcher = make("NONE")
    assert not dispatcher.keys[M.FULL] and not dispatcher.keys[M.PIECEWISE]
    assert dispatcher.dispatch(3, uniform_decode=True)[1].num_tokens == 3
