"""Lab 03, steps 3 and 4 — the dispatcher's keys; routing batches to FULL, PIECEWISE, NONE."""

import pytest

import mini_vllm.engine.cudagraph_dispatcher as reference
from labkit import implementation
from labpredict import check_predictions

impl = implementation(
    __file__, starter="cudagraph_dispatcher.py", reference="mini_vllm.engine.cudagraph_dispatcher"
)
answers = implementation(
    __file__, starter="predictions.py", reference="tests.course.lab_checks.phase05_lab03_answers"
)
M = impl.CUDAGraphMode
BD = impl.BatchDescriptor

LADDER = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
MODES = ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]


def make(mode, max_num_seqs=64, sizes=LADDER, q=1):
    return impl.CudagraphDispatcher(M[mode], sizes, max_num_seqs, uniform_decode_query_len=q)


def relaxed(sizes):
    return {BD(s) for s in sizes}


def uniform(sizes, q=1):
    return {BD(s, s // q, uniform=True) for s in sizes}


# The README's dispatcher D: the default ladder of max_num_seqs=16 (token budget 2048).
D_LADDER = [1, 2, 4, 8, 16, 24, 32]


def dispatcher_d(dispatchers, mode="FULL_AND_PIECEWISE", q=1):
    modes = dispatchers.CUDAGraphMode
    return dispatchers.CudagraphDispatcher(modes[mode], D_LADDER, 16, uniform_decode_query_len=q)


def step3_scenario(dispatchers):
    """The README's step 3 questions on `dispatchers` (a module with CudagraphDispatcher)."""
    full, piecewise = dispatchers.CUDAGraphMode.FULL, dispatchers.CUDAGraphMode.PIECEWISE
    d = dispatcher_d(dispatchers)
    return (
        len(d.keys[piecewise]),
        len(d.keys[full]),
        len(dispatcher_d(dispatchers, q=2).keys[full]),
    )


def step4_scenario(dispatchers):
    """The README's step 4 questions on `dispatchers`: mode names and one token count."""
    d = dispatcher_d(dispatchers)
    mode_20, key_20 = d.dispatch(20, uniform_decode=False)
    mode_33, _ = d.dispatch(33, uniform_decode=False)
    decode_only, _ = dispatcher_d(dispatchers, "FULL_DECODE_ONLY").dispatch(20, False)
    return mode_20.name, key_20.num_tokens, mode_33.name, decode_only.name


# --- step 3: the keys built at start-up ------------------------------------------------

# mode -> (keys under PIECEWISE, keys under FULL), with LADDER and max_num_seqs 64
KEYS = {
    "NONE": (set(), set()),
    "PIECEWISE": (relaxed(LADDER), set()),
    "FULL": (set(), relaxed(LADDER)),
    "FULL_DECODE_ONLY": (set(), uniform(LADDER)),
    "FULL_AND_PIECEWISE": (relaxed(LADDER), uniform(LADDER)),
}


@pytest.mark.step3
def test_your_step3_predictions_match_what_the_reference_computes():
    piecewise, full, full_q2 = step3_scenario(reference)
    check_predictions(
        answers,
        {"S3_PIECEWISE_KEYS": piecewise, "S3_FULL_KEYS": full, "S3_FULL_KEYS_Q2": full_q2},
    )


@pytest.mark.step3
def test_the_readme_step3_scenario_runs_the_same_on_your_code():
    assert step3_scenario(impl) == step3_scenario(reference)


@pytest.mark.step3
@pytest.mark.parametrize("mode", MODES)
def test_keys_of_each_mode(mode):
    dispatcher = make(mode)
    assert dispatcher.keys[M.PIECEWISE] == KEYS[mode][0]
    assert dispatcher.keys[M.FULL] == KEYS[mode][1]


@pytest.mark.step3
def test_keys_uniform_ones_stop_at_max_num_seqs():
    # 4 requests at most: a uniform batch above 4 tokens cannot exist, so no FULL key for it.
    dispatcher = make("FULL_AND_PIECEWISE", max_num_seqs=4, sizes=[1, 2, 4, 8, 16])
    assert dispatcher.keys[M.FULL] == uniform([1, 2, 4])
    assert dispatcher.keys[M.PIECEWISE] == relaxed([1, 2, 4, 8, 16])


@pytest.mark.step3
def test_keys_speculative_decode_start_at_the_query_len():
    # q = 4 tokens a request: uniform batches hold 4, 8, ..., 4 * max_num_seqs tokens.
    dispatcher = make("FULL_AND_PIECEWISE", max_num_seqs=8, q=4)
    assert dispatcher.keys[M.FULL] == uniform([4, 8, 16, 24, 32], q=4)
    assert BD(16, 4, uniform=True) in dispatcher.keys[M.FULL]


@pytest.mark.step3
def test_keys_uniform_ones_include_both_ends_exactly():
    # q = 2, at most 4 requests: a uniform batch holds 2 to 8 tokens, both ends included.
    dispatcher = make("FULL_AND_PIECEWISE", max_num_seqs=4, sizes=[1, 2, 4, 6, 8, 10], q=2)
    assert dispatcher.keys[M.FULL] == uniform([2, 4, 6, 8], q=2)
    assert BD(8, 4, uniform=True) in dispatcher.keys[M.FULL], "4 requests of 2 tokens"
    assert dispatcher.keys[M.PIECEWISE] == relaxed([1, 2, 4, 6, 8, 10])


@pytest.mark.step3
def test_keys_full_decode_only_respects_max_num_seqs_too():
    dispatcher = make("FULL_DECODE_ONLY", max_num_seqs=8)
    assert dispatcher.keys[M.FULL] == uniform([1, 2, 4, 8])
    assert dispatcher.keys[M.PIECEWISE] == set()


# --- step 4: dispatch -----------------------------------------------------------------

# mode -> (runtime mode for uniform decode, runtime mode for a mixed batch)
ROUTES = {
    "NONE": ("NONE", "NONE"),
    "PIECEWISE": ("PIECEWISE", "PIECEWISE"),
    "FULL": ("FULL", "FULL"),
    "FULL_DECODE_ONLY": ("FULL", "NONE"),
    "FULL_AND_PIECEWISE": ("FULL", "PIECEWISE"),
}


@pytest.mark.step4
def test_your_step4_predictions_match_what_the_reference_computes():
    mode_20, tokens_20, mode_33, decode_only = step4_scenario(reference)
    check_predictions(
        answers,
        {
            "S4_MIXED_20_MODE": mode_20,
            "S4_MIXED_20_TOKENS": tokens_20,
            "S4_MIXED_33_MODE": mode_33,
            "S4_FULL_DECODE_ONLY_MIXED_20_MODE": decode_only,
        },
    )


@pytest.mark.step4
def test_the_readme_step4_scenario_runs_the_same_on_your_code():
    assert step4_scenario(impl) == step4_scenario(reference)


@pytest.mark.step4
@pytest.mark.parametrize("mode", MODES)
def test_dispatch_routes_decode_and_mixed_batches_per_mode(mode):
    dispatcher = make(mode)
    decode_mode, _ = dispatcher.dispatch(16, uniform_decode=True)
    mixed_mode, _ = dispatcher.dispatch(16, uniform_decode=False)
    assert (decode_mode.name, mixed_mode.name) == ROUTES[mode]


@pytest.mark.step4
def test_dispatch_full_and_piecewise_gives_decode_its_exact_uniform_key():
    mode, key = make("FULL_AND_PIECEWISE").dispatch(33, uniform_decode=True)
    assert mode is M.FULL
    assert key == BD(40, 40, uniform=True)


@pytest.mark.step4
def test_dispatch_mixed_batch_gets_the_relaxed_padded_key():
    mode, key = make("FULL_AND_PIECEWISE").dispatch(33, uniform_decode=False)
    assert mode is M.PIECEWISE
    assert key == BD(40) and key.num_reqs is None and key.uniform is False


@pytest.mark.step4
def test_dispatch_full_alone_serves_decode_through_the_relaxed_key():
    mode, key = make("FULL").dispatch(3, uniform_decode=True)
    assert mode is M.FULL and key == BD(4)


@pytest.mark.step4
def test_dispatch_exact_capture_size_is_not_padded():
    assert make("PIECEWISE").dispatch(32, uniform_decode=False) == (M.PIECEWISE, BD(32))


@pytest.mark.step4
def test_dispatch_disable_full_falls_back_to_piecewise():
    mode, key = make("FULL_AND_PIECEWISE").dispatch(8, uniform_decode=True, disable_full=True)
    assert (mode, key) == (M.PIECEWISE, BD(8))


@pytest.mark.step4
@pytest.mark.parametrize("mode", ["FULL", "FULL_DECODE_ONLY"])
def test_dispatch_disable_full_without_piecewise_graphs_runs_eager_unpadded(mode):
    # FULL keeps its graphs under relaxed keys: disable_full must skip that try as well.
    runtime, key = make(mode).dispatch(3, uniform_decode=True, disable_full=True)
    assert (runtime, key) == (M.NONE, BD(3, 3, uniform=True))


@pytest.mark.step4
def test_dispatch_mixed_batch_under_full_decode_only_runs_eager_unpadded():
    # No graph serves it, so nothing is padded: the eager forward runs the 33 real tokens.
    assert make("FULL_DECODE_ONLY").dispatch(33, uniform_decode=False) == (M.NONE, BD(33))


@pytest.mark.step4
def test_dispatch_an_eager_batch_computes_only_its_own_tokens():
    """The decision of step 4. The runner builds the forward's inputs for the key's
    num_tokens rows. A padded row exists only so that a captured graph finds the shape it
    was recorded for; an eager forward replays no graph, so every padding row it computes
    is work nobody reads."""
    dispatcher = make("FULL_DECODE_ONLY")  # mixed batches have no graph at all
    rows = real = 0
    for num_tokens in range(17, 65):
        runtime, key = dispatcher.dispatch(num_tokens, uniform_decode=False)
        assert runtime is M.NONE
        rows += key.num_tokens
        real += num_tokens
    assert rows == real, (
        f"mixed batches of 17 to 64 tokens ran eagerly on {rows} rows for {real} real "
        f"tokens: {rows - real} rows of padding that no graph needed"
    )


@pytest.mark.step4
def test_dispatch_uniform_batch_beyond_the_full_keys_runs_eager_unpadded():
    # q = 4, 8 requests at most: a uniform batch of 9 requests (36 tokens) has no FULL key.
    dispatcher = make("FULL_DECODE_ONLY", max_num_seqs=8, q=4)
    assert dispatcher.dispatch(36, uniform_decode=True) == (M.NONE, BD(36, 9, uniform=True))


@pytest.mark.step4
def test_dispatch_speculative_decode_pads_to_a_uniform_key():
    dispatcher = make("FULL_AND_PIECEWISE", max_num_seqs=8, q=4)
    assert dispatcher.dispatch(12, uniform_decode=True) == (M.FULL, BD(16, 4, uniform=True))


@pytest.mark.step4
@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL", "FULL_AND_PIECEWISE"])
def test_dispatch_above_the_ladder_runs_eager_unpadded(mode):
    assert make(mode).dispatch(65, uniform_decode=True) == (M.NONE, BD(65, 65, uniform=True))
    assert make(mode).dispatch(65, uniform_decode=False) == (M.NONE, BD(65))


@pytest.mark.step4
@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL", "FULL_AND_PIECEWISE"])
def test_dispatch_a_batch_exactly_at_the_largest_capture_size_replays_its_graph(mode):
    # The largest rung, 64, was captured: a batch of exactly 64 tokens replays it.
    dispatcher = make(mode)
    assert dispatcher.max_capture_size == 64
    decode_mode, decode_key = dispatcher.dispatch(64, uniform_decode=True)
    mixed_mode, mixed_key = dispatcher.dispatch(64, uniform_decode=False)
    assert (decode_mode.name, mixed_mode.name) == ROUTES[mode], "64 is a capture size"
    assert decode_key.num_tokens == mixed_key.num_tokens == 64
    assert dispatcher.dispatch(65, uniform_decode=False)[0] is M.NONE


@pytest.mark.step4
def test_dispatch_uniform_batch_past_the_full_keys_falls_back_to_piecewise():
    # 20 requests at most: uniform keys stop at 16, the last rung a uniform batch can fill.
    # A decode batch of 17 to 20 requests pads to 24, which has no FULL key: the mixed
    # mode's graph of that size serves it (relaxed key), rather than eager.
    dispatcher = make("FULL_AND_PIECEWISE", max_num_seqs=20)
    assert dispatcher.dispatch(16, uniform_decode=True) == (M.FULL, BD(16, 16, uniform=True))
    assert dispatcher.dispatch(17, uniform_decode=True) == (M.PIECEWISE, BD(24))
    assert dispatcher.dispatch(20, uniform_decode=True) == (M.PIECEWISE, BD(24))


@pytest.mark.step4
def test_dispatch_none_mode_never_pads():
    assert make("NONE").dispatch(3, uniform_decode=True) == (M.NONE, BD(3, 3, uniform=True))
    assert make("NONE").dispatch(3, uniform_decode=False) == (M.NONE, BD(3))


@pytest.mark.step4
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("uniform_decode", [True, False])
@pytest.mark.parametrize("disable_full", [False, True])
def test_dispatch_always_answers_a_runtime_mode_and_a_key_it_holds(
    mode, uniform_decode, disable_full
):
    dispatcher = make(mode, max_num_seqs=16)
    for num_tokens in range(1, 70):
        runtime, key = dispatcher.dispatch(num_tokens, uniform_decode, disable_full)
        assert runtime in (M.NONE, M.PIECEWISE, M.FULL)
        if runtime is M.NONE:
            assert key.num_tokens == num_tokens, "eager runs the real tokens, unpadded"
            rung = min((s for s in LADDER if s >= num_tokens), default=None)
            usable = [] if rung is None else [(M.PIECEWISE, BD(rung))]
            if rung is not None and not disable_full:
                exact = BD(rung, rung, uniform=True) if uniform_decode else BD(rung)
                usable += [(M.FULL, exact), (M.FULL, BD(rung))]
            served = [(m, k) for m, k in usable if k in dispatcher.keys[m]]
            assert not served, f"{num_tokens} tokens ran eagerly, but {served} could serve them"
        else:
            assert key in dispatcher.keys[runtime], f"{key} is not a key under {runtime.name}"
            rung = min(s for s in LADDER if s >= num_tokens)
            assert key.num_tokens == rung, f"{num_tokens} tokens pad to {rung}"
            assert not (disable_full and runtime is M.FULL)
