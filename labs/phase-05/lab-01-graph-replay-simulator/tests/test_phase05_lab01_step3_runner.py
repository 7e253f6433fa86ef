"""Lab 01, step 3 — `GraphRunner`: one graph per input shape, fed through static buffers."""

import numpy as np
import pytest

import mini_vllm.teaching.cudagraph as reference
from labkit import implementation
from labpredict import check_predictions

impl = implementation(__file__, starter="cudagraph.py", reference="mini_vllm.teaching.cudagraph")
answers = implementation(
    __file__, starter="predictions.py", reference="tests.course.lab_checks.phase05_lab01_answers"
)

pytestmark = pytest.mark.step3

HIDDEN = 16


def rand(batch, seed, width=HIDDEN, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal((batch, width)).astype(dtype)


def expected(ops, x):
    """The model computed directly from the ops' functions, with no device in between."""
    for op in ops:
        x = op.fn(x)
    return x


def kinds(trace):
    return [kind for kind, _ in trace]


# --- capture on first sight, replay afterwards ------------------------------------------


def test_first_call_with_new_shape_warms_up_captures_then_replays():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2)
    device = impl.SimDevice()
    runner = impl.GraphRunner(ops, device)
    x = rand(4, seed=10)
    out = runner(x)
    assert list(runner.graphs) == [(4, HIDDEN)]
    assert device.captures == 1
    # warm-up: one eager launch per op; then the capture (no launches); then one replay
    assert kinds(device.trace) == ["kernel"] * len(ops) + ["graph"]
    np.testing.assert_allclose(out, expected(ops, x), rtol=1e-6, atol=1e-6)


def test_the_graph_memory_is_the_static_input_and_every_nodes_output():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2)
    device = impl.SimDevice()
    runner = impl.GraphRunner(ops, device)
    runner(rand(4, seed=11))
    entry = runner.graphs[(4, HIDDEN)]
    assert entry.shape == (4, HIDDEN)
    assert len(entry.graph.nodes) == len(ops)
    assert any(buf is entry.static_input for buf in device.pool.buffers)
    assert entry.static_output is entry.graph.nodes[-1].dst
    # input 4x16, then per layer 4x16, 4x32, 4x32, 4x16; float32
    assert device.pool.nbytes == (4 * 16 + 2 * (2 * 4 * 16 + 2 * 4 * 32)) * 4 == 3328
    runner(rand(4, seed=12))
    assert device.pool.nbytes == 3328, "a replay allocates nothing"


@pytest.mark.parametrize("num_layers", [1, 4])
def test_launch_count_eager_is_op_count_replay_is_one(num_layers):
    ops = impl.toy_model(hidden=HIDDEN, num_layers=num_layers)
    device = impl.SimDevice()
    runner = impl.GraphRunner(ops, device)
    runner(rand(2, seed=4))  # warm-up, capture
    before = device.launches
    runner(rand(2, seed=5))
    assert device.launches - before == 1
    before = device.launches
    impl.run_eager(ops, device, rand(2, seed=6))
    assert device.launches - before == len(ops)


def test_replay_costs_the_host_one_graph_launch_not_one_per_op():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=4)
    device = impl.SimDevice(launch_us=5.0, graph_launch_us=7.0)
    runner = impl.GraphRunner(ops, device)
    runner(rand(2, seed=7))
    before = device.host_us
    runner(rand(2, seed=8))
    assert device.host_us - before == pytest.approx(7.0)
    before = device.host_us
    impl.run_eager(ops, device, rand(2, seed=9))
    assert device.host_us - before == pytest.approx(5.0 * len(ops))


def test_later_calls_with_a_captured_shape_replay_without_recapturing():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2)
    device = impl.SimDevice()
    runner = impl.GraphRunner(ops, device)
    runner(rand(4, seed=11))
    entry = runner.graphs[(4, HIDDEN)]
    device.trace.clear()
    for seed in (12, 13, 14):
        runner(rand(4, seed=seed))
    assert kinds(device.trace) == ["graph"] * 3
    assert device.captures == 1
    assert runner.graphs[(4, HIDDEN)] is entry


def test_graphs_are_keyed_by_input_shape():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2)
    device = impl.SimDevice()
    runner = impl.GraphRunner(ops, device)
    for batch in (1, 4, 8, 4, 1):
        runner(rand(batch, seed=batch))
    assert set(runner.graphs) == {(1, HIDDEN), (4, HIDDEN), (8, HIDDEN)}
    assert device.captures == 3
    assert device.launches == 3 * (len(ops) + 1) + 2


def test_a_graph_is_per_whole_shape_not_per_batch_size():
    # Elementwise ops work at any width: the same batch size at two widths is two shapes.
    ops = [impl.Op("scale", lambda v: v * 3.0), impl.Op("shift", lambda v: v - 1.0)]
    runner = impl.GraphRunner(ops, impl.SimDevice())
    narrow, wide = rand(2, seed=15, width=8), rand(2, seed=16, width=24)
    runner(narrow)
    np.testing.assert_allclose(runner(wide), expected(ops, wide), rtol=1e-6)
    assert set(runner.graphs) == {(2, 8), (2, 24)}


# --- static buffers ------------------------------------------------------------------------


def test_replay_reads_static_input_buffer_so_forgetting_the_copy_gives_stale_results():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2)
    runner = impl.GraphRunner(ops, impl.SimDevice())
    old, new = rand(4, seed=20), rand(4, seed=21)
    runner(old)
    entry = runner.graphs[(4, HIDDEN)]
    # A raw replay without copying `new` in: it silently computes on the old input.
    stale = entry.replay().copy()
    np.testing.assert_allclose(stale, expected(ops, old), rtol=1e-6, atol=1e-6)
    assert not np.allclose(stale, expected(ops, new))
    # Writing the new input into the static buffer is what makes the replay see it.
    entry.static_input[...] = new
    np.testing.assert_allclose(entry.replay(), expected(ops, new), rtol=1e-6, atol=1e-6)


def test_runner_copies_input_so_replay_matches_eager_for_every_captured_shape():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=3)
    runner = impl.GraphRunner(ops, impl.SimDevice())
    batches = (1, 2, 4, 8)
    for batch in batches:
        runner(rand(batch, seed=100 + batch))  # capture each shape
    for round_ in range(3):
        for batch in batches:
            x = rand(batch, seed=1000 * round_ + batch)
            np.testing.assert_allclose(runner(x), expected(ops, x), rtol=1e-6, atol=1e-6)


def test_the_callers_array_is_not_the_static_input():
    ops = [impl.Op("scale", lambda v: v * 2.0)]
    runner = impl.GraphRunner(ops, impl.SimDevice())
    x = rand(2, seed=22)
    runner(x)
    entry = runner.graphs[(2, HIDDEN)]
    assert entry.static_input is not x, "the graph must own its input buffer"
    x[...] = 0.0  # the caller reuses its array: the graph's input does not change
    assert np.abs(entry.static_input).sum() > 0


def test_replay_returns_the_same_static_output_buffer():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2)
    runner = impl.GraphRunner(ops, impl.SimDevice())
    first = runner(rand(4, seed=30))
    second = runner(rand(4, seed=31))
    assert second is first
    assert second is runner.graphs[(4, HIDDEN)].static_output


def test_next_replay_overwrites_the_previous_output():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2)
    runner = impl.GraphRunner(ops, impl.SimDevice())
    a, b = rand(4, seed=32), rand(4, seed=33)
    out_a = runner(a)
    kept = out_a.copy()  # what a caller must do to keep a result (gpt-fast clones)
    runner(b)
    np.testing.assert_allclose(out_a, expected(ops, b), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(kept, expected(ops, a), rtol=1e-6, atol=1e-6)


def test_branch_taken_at_capture_is_frozen_in_replay():
    double = impl.Op("double", lambda v: v * 2)
    negate = impl.Op("negate", lambda v: -v)
    # Host-side Python control flow: which kernel to launch depends on the input's sign.
    branch = impl.Branch(
        "sign_branch", lambda host_x: bool(host_x.sum() > 0), if_true=double, if_false=negate
    )
    ops = [branch, impl.Op("add_one", lambda v: v + 1)]
    runner = impl.GraphRunner(ops, impl.SimDevice())
    positive = np.ones((2, HIDDEN), dtype=np.float32)
    negative = -np.ones((2, HIDDEN), dtype=np.float32)
    np.testing.assert_allclose(runner(positive), positive * 2 + 1)  # captured on "double"
    # Eagerly the negative input takes the other branch; the replay keeps the captured one.
    np.testing.assert_allclose(impl.run_eager(ops, impl.SimDevice(), negative), -negative + 1)
    np.testing.assert_allclose(runner(negative), negative * 2 + 1)


# --- what the runner refuses -------------------------------------------------------------


def test_failed_capture_stores_no_graph_and_closes_the_capture():
    from_host = impl.Op("positions_from_list", lambda v: v + 1.0, copies_from_host=True)
    scale = impl.Op("scale", lambda v: v * 0.5)
    device = impl.SimDevice()
    runner = impl.GraphRunner([scale, from_host], device)
    with pytest.raises(impl.CaptureError, match="positions_from_list"):
        runner(rand(2, seed=40))
    assert runner.graphs == {}
    assert not device.is_capturing
    # The device still works for a model that can be captured.
    ok = impl.GraphRunner([scale, impl.Op("square", lambda v: v * v)], device)
    ok(rand(2, seed=41))
    assert list(ok.graphs) == [(2, HIDDEN)]


def test_new_shape_after_capture_window_closed_raises_listing_captured_shapes():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=1)
    device = impl.SimDevice()
    runner = impl.GraphRunner(ops, device)
    runner(rand(1, seed=7))
    runner(rand(4, seed=8))
    runner.close_capture_window()
    with pytest.raises(impl.CaptureError) as info:
        runner(rand(3, seed=9))
    message = str(info.value)
    assert str((1, HIDDEN)) in message and str((4, HIDDEN)) in message
    assert set(runner.graphs) == {(1, HIDDEN), (4, HIDDEN)}, (
        "no silent capture after the window closed"
    )
    assert device.captures == 2
    # Captured shapes still replay.
    x = rand(4, seed=10)
    np.testing.assert_allclose(runner(x), expected(ops, x), rtol=1e-6, atol=1e-6)


def test_new_shape_after_capture_window_closed_runs_eagerly_with_fallback():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2)
    device = impl.SimDevice()
    runner = impl.GraphRunner(ops, device, fallback_to_eager=True)
    runner(rand(4, seed=11))
    runner.close_capture_window()
    x = rand(3, seed=12)
    before = device.launches
    out = runner(x)
    assert device.launches - before == len(ops), "the fallback runs eagerly: one launch per op"
    assert set(runner.graphs) == {(4, HIDDEN)}
    assert device.captures == 1
    np.testing.assert_allclose(out, expected(ops, x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float64, np.int64])
def test_wrong_dtype_input_raises_naming_the_expected_dtype_and_the_captured_shapes(dtype):
    runner = impl.GraphRunner(
        impl.toy_model(hidden=HIDDEN, num_layers=1), impl.SimDevice(), dtype=np.float32
    )
    runner(rand(2, seed=13))
    with pytest.raises(ValueError, match="float32") as info:
        runner(rand(2, seed=14, dtype=dtype))
    assert str((2, HIDDEN)) in str(info.value)
    with pytest.raises(ValueError, match="float32"):
        runner(rand(5, seed=15, dtype=dtype))  # a new shape is checked before any capture
    assert set(runner.graphs) == {(2, HIDDEN)}


@pytest.mark.parametrize("bad", [[[1.0, 2.0]], 3.0, "x"], ids=["list", "float", "str"])
def test_an_input_that_is_not_a_numpy_array_is_a_type_error(bad):
    device = impl.SimDevice()
    runner = impl.GraphRunner([impl.Op("scale", lambda v: v * 2.0)], device)
    with pytest.raises(TypeError):
        runner(bad)
    assert runner.graphs == {} and device.launches == 0


def test_without_a_dtype_any_dtype_captures_but_a_captured_shape_keeps_its_own():
    ops = [impl.Op("scale", lambda v: v * 2)]
    runner = impl.GraphRunner(ops, impl.SimDevice(), dtype=None)
    ints = np.arange(6, dtype=np.int64).reshape(2, 3)
    np.testing.assert_array_equal(runner(ints), ints * 2)
    assert runner.graphs[(2, 3)].static_input.dtype == np.int64
    # The same shape in float64: converted into the int64 static input, 0.5 would become
    # 0 without a word; a second graph for one shape would leave two static inputs and
    # two outputs behind one key. The runner refuses, naming the dtype it holds.
    with pytest.raises(ValueError, match="int64"):
        runner(np.full((2, 3), 0.5))
    assert len(runner.graphs) == 1
    halves = np.full((4, 3), 0.5, dtype=np.float64)
    np.testing.assert_allclose(runner(halves), halves * 2)  # a new shape captures as float64


def test_your_step3_predictions_match_what_the_reference_computes():
    ops = reference.toy_model(hidden=HIDDEN, num_layers=2)
    device = reference.SimDevice()
    runner = reference.GraphRunner(ops, device)
    inputs = [rand(4, seed=40), rand(4, seed=41), rand(8, seed=42), rand(4, seed=43)]
    outputs = [runner(x).copy() for x in inputs[:1]]
    first = runner.graphs[(4, HIDDEN)].static_output
    for x in inputs[1:]:
        outputs.append(runner(x).copy())
    holds = [i + 1 for i, out in enumerate(outputs) if np.array_equal(first, out)]
    check_predictions(
        answers,
        {
            "RUNNER_LAUNCHES": device.launches,
            "RUNNER_CAPTURES": device.captures,
            "RUNNER_POOL_BYTES": device.pool.nbytes,
            "FIRST_RESULT_HOLDS_CALL": holds[-1],
        },
    )


def test_the_callers_arrays_are_never_written():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=1)
    runner = impl.GraphRunner(ops, impl.SimDevice())
    inputs = [rand(4, seed=50), rand(4, seed=51), rand(4, seed=52)]
    kept = [x.copy() for x in inputs]
    for x in inputs:
        runner(x)
    for x, before in zip(inputs, kept):
        np.testing.assert_array_equal(x, before, err_msg="the runner wrote into its input")


@pytest.mark.parametrize("fallback", [False, True], ids=["no fallback", "fallback"])
def test_a_captured_shape_still_replays_once_the_window_is_closed(fallback):
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2)
    device = impl.SimDevice()
    runner = impl.GraphRunner(ops, device, fallback_to_eager=fallback)
    runner(rand(4, seed=53))
    runner.close_capture_window()
    x = rand(4, seed=54)
    before = device.launches
    out = runner(x)
    assert device.launches - before == 1, "a captured shape replays: one launch"
    assert device.trace[-1][0] == "graph"
    np.testing.assert_allclose(out, expected(ops, x), rtol=1e-6, atol=1e-6)
