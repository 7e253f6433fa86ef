"""Lab 03, steps 5 and 6 — piecewise graphs: split at attention, capture the pieces between,
run attention eagerly."""

import re

import numpy as np
import pytest

import mini_vllm.teaching.cudagraph as reference
from labkit import implementation
from labpredict import check_predictions

impl = implementation(__file__, starter="piecewise.py", reference="mini_vllm.teaching.cudagraph")
answers = implementation(
    __file__, starter="predictions.py", reference="tests.course.lab_checks.phase05_lab03_answers"
)

HIDDEN = 16


def step6_scenario(sim):
    """The README's step 6 questions on `sim` (a module with PiecewiseGraphRunner): the
    launches of an eager run, of a piecewise runner's first call with a batch size, and of
    its second call with that size, on toy_model(hidden=16, num_layers=4, attention=True)."""
    ops = sim.toy_model(hidden=HIDDEN, num_layers=4, attention=True)
    device = sim.SimDevice()
    sim.run_eager(ops, device, rand(4, seed=20))
    eager = device.launches
    device = sim.SimDevice()
    runner = sim.PiecewiseGraphRunner(ops, device)
    runner(rand(4, seed=21))
    first = device.launches
    runner(rand(4, seed=22))
    return eager, first, device.launches - first


def rand(batch, seed):
    return np.random.default_rng(seed).standard_normal((batch, HIDDEN)).astype(np.float32)


def op(name, capturable=True):
    return impl.Op(name, lambda x: x + 1.0, capturable=capturable)


def names(pieces):
    return [[o.name for o in piece.ops] for piece in pieces]


def expected(ops, x):
    for o in ops:
        x = o.fn(x)
    return x


# --- step 5: the split ----------------------------------------------------------------


@pytest.mark.step5
def test_piecewise_split_makes_each_splitting_op_its_own_piece_in_order():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=3, attention=True)
    pieces = impl.split_ops(ops)
    assert [o.name for piece in pieces for o in piece.ops] == [o.name for o in ops], (
        "order kept, nothing lost"
    )
    split = [piece for piece in pieces if piece.is_splitting_op]
    assert names(split) == [["attention_0"], ["attention_1"], ["attention_2"]]
    captured = [piece for piece in pieces if not piece.is_splitting_op]
    assert len(captured) == len(split) + 1
    assert all(o.capturable for piece in captured for o in piece.ops)


@pytest.mark.step5
def test_piecewise_split_never_makes_an_empty_piece():
    ops = [op("attn_a", False), op("attn_b", False), op("mlp"), op("norm"), op("attn_c", False)]
    pieces = impl.split_ops(ops)
    assert names(pieces) == [["attn_a"], ["attn_b"], ["mlp", "norm"], ["attn_c"]]
    assert [piece.is_splitting_op for piece in pieces] == [True, True, False, True]
    assert all(piece.ops for piece in pieces)


@pytest.mark.step5
def test_piecewise_split_keeps_a_trailing_run_of_ops():
    ops = [op("A", False), op("x"), op("y"), op("B", False), op("B2", False), op("z")]
    pieces = impl.split_ops(ops)
    assert names(pieces) == [["A"], ["x", "y"], ["B"], ["B2"], ["z"]]
    assert [piece.is_splitting_op for piece in pieces] == [True, False, True, True, False]
    assert all(isinstance(piece.ops, tuple) for piece in pieces)


@pytest.mark.step5
def test_piecewise_split_without_splitting_ops_is_one_captured_piece():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2, attention=False)
    pieces = impl.split_ops(ops)
    assert len(pieces) == 1 and not pieces[0].is_splitting_op
    assert [o.name for o in pieces[0].ops] == [o.name for o in ops]


@pytest.mark.step5
def test_piecewise_split_follows_a_custom_splitting_predicate():
    ops = [op("a"), op("b"), op("c"), op("d")]
    pieces = impl.split_ops(ops, is_splitting_op=lambda o: o.name in ("b", "d"))
    assert names(pieces) == [["a"], ["b"], ["c"], ["d"]]
    assert [piece.is_splitting_op for piece in pieces] == [False, True, False, True]


# --- step 6: the piecewise runner -------------------------------------------------------


@pytest.mark.step6
def test_your_step6_predictions_match_what_the_reference_computes():
    eager, first, second = step6_scenario(reference)
    check_predictions(
        answers,
        {
            "S6_EAGER_LAUNCHES": eager,
            "S6_FIRST_CALL_LAUNCHES": first,
            "S6_SECOND_CALL_LAUNCHES": second,
        },
    )


@pytest.mark.step6
def test_the_readme_step6_scenario_runs_the_same_on_your_code():
    assert step6_scenario(impl) == step6_scenario(reference)


@pytest.mark.step6
def test_piecewise_runner_splits_at_attention_by_default():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2, attention=True)
    runner = impl.PiecewiseGraphRunner(ops, impl.SimDevice())
    assert names(runner.pieces) == names(impl.split_ops(ops))
    # [rmsnorm_0] attention_0 [up_proj_0 .. rmsnorm_1] attention_1 [up_proj_1 ..]
    assert runner.num_captured_pieces == 3


@pytest.mark.step6
def test_piecewise_output_matches_eager_for_every_shape_and_fresh_input():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=3, attention=True)
    runner = impl.PiecewiseGraphRunner(ops, impl.SimDevice())
    for round_ in range(3):
        for batch in (1, 3, 8):
            x = rand(batch, seed=100 * round_ + batch)
            np.testing.assert_allclose(runner(x), expected(ops, x), rtol=1e-6, atol=1e-6)


@pytest.mark.step6
def test_piecewise_replay_launches_one_per_piece_plus_one_per_splitting_op():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2, attention=True)
    device = impl.SimDevice()
    runner = impl.PiecewiseGraphRunner(ops, device)
    runner(rand(4, seed=1))  # warm-up and capture of every piece
    device.trace.clear()
    before = device.launches
    runner(rand(4, seed=2))
    k = sum(piece.is_splitting_op for piece in runner.pieces)
    assert device.launches - before == runner.num_captured_pieces + k == 5
    # The splitting ops run eagerly between the replays, in model order.
    assert [kind for kind, _ in device.trace] == ["graph", "kernel", "graph", "kernel", "graph"]
    assert [name for kind, name in device.trace if kind == "kernel"] == [
        "attention_0",
        "attention_1",
    ]


@pytest.mark.step6
def test_piecewise_splitting_ops_run_eagerly_so_their_host_decisions_stay_fresh():
    # Attention picks its kernel on the host from this step's input (like prefill vs
    # decode from the attention metadata). Captured, that choice would be frozen.
    attention = impl.Branch(
        "attention",
        lambda host_x: bool(host_x.sum() > 0),
        if_true=impl.Op("attention_prefill", lambda x: x * 3.0, capturable=False),
        if_false=impl.Op("attention_decode", lambda x: x - 3.0, capturable=False),
    )
    ops = [impl.Op("proj", lambda x: x * 1.0), attention, impl.Op("out", lambda x: x + 0.5)]
    device = impl.SimDevice()
    runner = impl.PiecewiseGraphRunner(ops, device)
    positive, negative = np.ones((2, HIDDEN), np.float32), -np.ones((2, HIDDEN), np.float32)
    np.testing.assert_allclose(runner(positive), positive * 3.0 + 0.5)
    device.trace.clear()
    np.testing.assert_allclose(runner(negative), negative - 3.0 + 0.5)
    assert ("kernel", "attention_decode") in device.trace
    assert device.captures == 2, "the pieces around attention were captured once, not again"


@pytest.mark.step6
def test_piecewise_pieces_are_captured_once_per_shape_on_a_shared_device():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2, attention=True)
    device = impl.SimDevice()
    runner = impl.PiecewiseGraphRunner(ops, device)
    for batch in (2, 4, 2, 4, 4):
        runner(rand(batch, seed=batch))
    assert device.captures == runner.num_captured_pieces * 2
    assert runner.device is device and device.pool.nbytes > 0


@pytest.mark.step6
def test_piecewise_rejects_a_non_array_or_a_wrong_dtype():
    runner = impl.PiecewiseGraphRunner(impl.toy_model(hidden=HIDDEN, attention=True))
    with pytest.raises(TypeError):
        runner([[0.0] * HIDDEN])
    with pytest.raises(ValueError, match="float32"):
        runner(rand(2, seed=3).astype(np.float64))


@pytest.mark.step6
def test_piecewise_a_later_piece_may_run_in_another_dtype_than_the_model_input():
    # A float32 input cast to float16 by the first piece (an embedding in full precision,
    # the layers in half): only the model's input is checked against the model's dtype.
    ops = [
        impl.Op("embed_to_half", lambda x: (x * 2.0).astype(np.float16)),
        impl.Op("attention", lambda x: x + np.float16(1.0), capturable=False),
        impl.Op("out_proj", lambda x: x * np.float16(0.5)),
    ]
    runner = impl.PiecewiseGraphRunner(ops, impl.SimDevice(), dtype=np.float32)
    for seed in (12, 13):  # the capture, then a replay
        x = rand(4, seed=seed)
        out = runner(x)
        assert out.dtype == np.float16, "the output keeps the dtype the model computes in"
        np.testing.assert_allclose(out, expected(ops, x), rtol=1e-3)
    with pytest.raises(ValueError, match="float32"):
        runner(rand(4, seed=14).astype(np.float16))


@pytest.mark.step6
def test_piecewise_new_shape_after_capture_window_closed_raises_and_old_ones_replay():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=3, attention=True)
    device = impl.SimDevice()
    runner = impl.PiecewiseGraphRunner(ops, device)
    assert runner.num_captured_pieces == 4
    runner(rand(4, seed=5))
    runner.close_capture_window()
    captures = device.captures
    with pytest.raises(impl.CaptureError, match=re.escape(str((3, HIDDEN)))):
        runner(rand(3, seed=6))
    x = rand(4, seed=7)
    np.testing.assert_allclose(runner(x), expected(ops, x), rtol=1e-6, atol=1e-6)
    assert device.captures == captures


@pytest.mark.step6
def test_piecewise_fallback_runs_every_piece_eagerly_once_the_window_is_closed():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=3, attention=True)
    device = impl.SimDevice()
    runner = impl.PiecewiseGraphRunner(ops, device, fallback_to_eager=True)
    runner(rand(4, seed=8))
    runner.close_capture_window()
    captures, launches = device.captures, device.launches
    device.trace.clear()
    x = rand(3, seed=9)
    np.testing.assert_allclose(runner(x), expected(ops, x), rtol=1e-6, atol=1e-6)
    assert device.captures == captures, "no piece may capture once the window is closed"
    assert device.launches - launches == len(ops), "one eager launch per op, no graph"
    assert {kind for kind, _ in device.trace} == {"kernel"}
    # The shape captured before the window closed still replays.
    device.trace.clear()
    x = rand(4, seed=10)
    np.testing.assert_allclose(runner(x), expected(ops, x), rtol=1e-6, atol=1e-6)
    assert [kind for kind, _ in device.trace].count("graph") == runner.num_captured_pieces
