"""Lab 01, step 2 — `SimDevice.replay`: one launch re-runs the recording on its own buffers."""

import numpy as np
import pytest

import mini_vllm.teaching.cudagraph as reference
from labkit import implementation
from labpredict import check_predictions

impl = implementation(__file__, starter="cudagraph.py", reference="mini_vllm.teaching.cudagraph")
answers = implementation(
    __file__, starter="predictions.py", reference="tests.course.lab_checks.phase05_lab01_answers"
)

pytestmark = pytest.mark.step2

HIDDEN = 16


def rand(batch, seed):
    return np.random.default_rng(seed).standard_normal((batch, HIDDEN)).astype(np.float32)


def expected(ops, x):
    """The model computed directly from the ops' functions, with no device in between."""
    for op in ops:
        x = op.fn(x)
    return x


def capture(device, ops, static_input):
    """Record `ops` on `static_input`; return the graph and its output buffer."""
    graph = impl.CapturedGraph(device)
    with device.capture(graph):
        x = static_input
        for op in ops:
            x = device.launch(op, x)
    return graph, x


def test_replay_is_one_launch_that_reruns_the_recorded_ops():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=3)
    device = impl.SimDevice()
    x = rand(4, seed=1)
    graph, static_output = capture(device, ops, x)
    graph.replay()
    assert device.launches == 1
    assert device.trace == [("graph", f"{len(ops)} nodes")]
    np.testing.assert_allclose(static_output, expected(ops, x), rtol=1e-6, atol=1e-6)


def test_replay_writes_into_the_recorded_buffers_in_place():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2)
    device = impl.SimDevice()
    x = rand(3, seed=2)
    graph, static_output = capture(device, ops, x)
    buffers = [node.dst for node in graph.nodes]
    graph.replay()
    assert all(node.dst is buf for node, buf in zip(graph.nodes, buffers))
    # Every intermediate buffer holds its kernel's result, not just the last one.
    h = x
    for node in graph.nodes:
        h = node.op.fn(h)
        np.testing.assert_allclose(node.dst, h, rtol=1e-6, atol=1e-6)
    assert graph.nodes[-1].dst is static_output


def test_replay_reads_whatever_the_input_buffer_holds_now():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2)
    device = impl.SimDevice()
    static_input = rand(4, seed=3)
    old = static_input.copy()
    graph, static_output = capture(device, ops, static_input)
    new = rand(4, seed=4)
    # Changing your own array does nothing: the graph reads its static input.
    graph.replay()
    stale = static_output.copy()
    np.testing.assert_allclose(stale, expected(ops, old), rtol=1e-6, atol=1e-6)
    assert not np.allclose(stale, expected(ops, new))
    # Writing the new input into the static buffer is what makes the replay see it.
    static_input[...] = new
    graph.replay()
    np.testing.assert_allclose(static_output, expected(ops, new), rtol=1e-6, atol=1e-6)


def test_replay_costs_the_host_one_graph_launch_and_the_gpu_every_node():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2)  # gpu_us 2, 4, 2, 4 a layer
    device = impl.SimDevice(launch_us=5.0, graph_launch_us=6.0, node_us=1.0)
    graph, _ = capture(device, ops, rand(2, seed=5))
    nodes_us = sum(op.gpu_us + 1.0 for op in ops)
    assert nodes_us == pytest.approx(32.0)
    graph.replay()
    assert (device.host_us, device.gpu_busy_until_us) == pytest.approx((6.0, 6.0 + 32.0))
    # The host does not wait: a second replay is queued behind the first on the GPU.
    graph.replay()
    assert (device.host_us, device.gpu_busy_until_us) == pytest.approx((12.0, 6.0 + 2 * 32.0))
    assert device.launches == 2


def test_replay_is_refused_while_a_capture_is_open():
    device = impl.SimDevice()
    graph, _ = capture(device, impl.toy_model(hidden=HIDDEN, num_layers=1), rand(2, seed=6))
    with device.capture(impl.CapturedGraph(device)):
        with pytest.raises(impl.CaptureError):
            graph.replay()
    assert device.launches == 0


def test_a_graph_replays_only_on_the_device_that_captured_it():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=1)
    graph, _ = capture(impl.SimDevice(), ops, rand(2, seed=7))
    other = impl.SimDevice()
    with pytest.raises(impl.CaptureError):
        other.replay(graph)
    assert other.launches == 0


def test_your_step2_predictions_match_what_the_reference_computes():
    x = np.random.default_rng(0).standard_normal((4, HIDDEN)).astype(np.float32)
    ops = reference.toy_model(hidden=HIDDEN, num_layers=2)
    clocks = {}
    for node_us in (1.5, 3.0):
        eager = reference.SimDevice(node_us=node_us)
        reference.run_eager(ops, eager, x)
        device = reference.SimDevice(node_us=node_us)
        graph = reference.CapturedGraph(device)
        with device.capture(graph):
            out = x
            for op in ops:
                out = device.launch(op, out)
        graph.replay()
        clocks[node_us] = (eager.clock_us, device.clock_us)
    check_predictions(
        answers,
        {
            "REPLAY_CLOCK_US": clocks[1.5][1],
            "REPLAY_BEATS_EAGER_WITH_NODE_US_3": clocks[3.0][1] < clocks[3.0][0],
        },
    )


def test_a_graph_that_changes_dtype_replays_bit_for_bit_what_eager_computes():
    ops = [
        impl.Op("scale", lambda v: v * np.float32(3.0)),
        impl.Op("to_half", lambda v: v.astype(np.float16)),
        impl.Op("argmax", lambda v: v.argmax(axis=-1)),
    ]
    device = impl.SimDevice()
    static_input = rand(5, seed=9)
    graph, ids = capture(device, ops, static_input)
    for seed in (10, 11):
        static_input[...] = rand(5, seed=seed)
        graph.replay()
        want = expected(ops, static_input)
        np.testing.assert_array_equal(graph.nodes[1].dst, expected(ops[:2], static_input))
        assert ids.dtype == want.dtype
        np.testing.assert_array_equal(ids, want)
