"""Lab 01 — capture and replay: one graph per shape, static buffers, one launch."""

import numpy as np
import pytest

from labkit import implementation

impl = implementation(__file__, starter="cudagraph.py", reference="mini_vllm.cudagraph")

HIDDEN = 16


def rand(batch, seed):
    return np.random.default_rng(seed).standard_normal((batch, HIDDEN)).astype(np.float32)


def expected(ops, x):
    """The model computed directly from the ops' functions, with no device in between."""
    for op in ops:
        x = op.fn(x)
    return x


def kinds(trace):
    return [kind for kind, _ in trace]


def test_eager_run_launches_one_kernel_per_op():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2)
    device = impl.SimDevice()
    x = rand(4, seed=1)
    out = impl.run_eager(ops, device, x)
    assert device.launches == len(ops)
    assert device.trace == [("kernel", op.name) for op in ops]
    np.testing.assert_allclose(out, expected(ops, x), rtol=1e-6, atol=1e-6)


def test_capture_records_each_op_as_a_node_and_launches_nothing():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2)
    device = impl.SimDevice()
    graph = impl.CapturedGraph(device)
    x = rand(4, seed=2)
    with device.capture(graph):
        h = x
        for op in ops:
            h = device.launch(op, h)
    assert device.launches == 0, "capturing records kernels; it must not launch them"
    assert [node.op.name for node in graph.nodes] == [op.name for op in ops]
    assert h.shape == (4, HIDDEN)


def test_replay_is_one_launch_that_reruns_the_recorded_ops():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=3)
    device = impl.SimDevice()
    graph = impl.CapturedGraph(device)
    x = rand(4, seed=3)
    with device.capture(graph):
        h = x
        for op in ops:
            h = device.launch(op, h)
    static_output = h
    graph.replay()
    assert device.launches == 1
    assert device.trace[-1][0] == "graph"
    np.testing.assert_allclose(static_output, expected(ops, x), rtol=1e-6, atol=1e-6)


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
    double = impl.Op("double", lambda x: x * 2)
    negate = impl.Op("negate", lambda x: -x)
    # Host-side Python control flow: which kernel to launch depends on the input's sign.
    branch = impl.Branch(
        "sign_branch", lambda host_x: bool(host_x.sum() > 0), if_true=double, if_false=negate
    )
    ops = [branch, impl.Op("add_one", lambda x: x + 1)]
    runner = impl.GraphRunner(ops, impl.SimDevice())
    positive = np.ones((2, HIDDEN), dtype=np.float32)
    negative = -np.ones((2, HIDDEN), dtype=np.float32)
    np.testing.assert_allclose(runner(positive), positive * 2 + 1)  # captured on the "double" path
    # Eagerly the negative input takes the other branch; the replay keeps the captured one.
    np.testing.assert_allclose(impl.run_eager(ops, impl.SimDevice(), negative), -negative + 1)
    np.testing.assert_allclose(runner(negative), negative * 2 + 1)
