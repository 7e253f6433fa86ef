"""Lab 01, step 1 — `SimDevice.launch`: run a kernel now, or record it into the open graph."""

import numpy as np
import pytest

import mini_vllm.teaching.cudagraph as reference
from labkit import implementation
from labpredict import check_predictions

impl = implementation(__file__, starter="cudagraph.py", reference="mini_vllm.teaching.cudagraph")
answers = implementation(
    __file__, starter="predictions.py", reference="tests.course.lab_checks.phase05_lab01_answers"
)

pytestmark = pytest.mark.step1

HIDDEN = 16


def rand(batch, seed, width=HIDDEN):
    return np.random.default_rng(seed).standard_normal((batch, width)).astype(np.float32)


def expected(ops, x):
    """The model computed directly from the ops' functions, with no device in between."""
    for op in ops:
        x = op.fn(x)
    return x


def record(device, ops, x):
    """Launch `ops` one after another on `device` (inside a capture, that records them)."""
    for op in ops:
        x = device.launch(op, x)
    return x


def test_eager_run_launches_one_kernel_per_op_and_computes_the_model():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2)
    device = impl.SimDevice()
    x = rand(4, seed=1)
    out = impl.run_eager(ops, device, x)
    assert device.launches == len(ops)
    assert device.trace == [("kernel", op.name) for op in ops]
    np.testing.assert_allclose(out, expected(ops, x), rtol=1e-6, atol=1e-6)


def test_eager_launch_charges_the_host_and_queues_the_kernel_on_the_gpu():
    device = impl.SimDevice(launch_us=5.0)
    long = impl.Op("long", lambda v: v + 1, gpu_us=20.0)
    short = impl.Op("short", lambda v: v * 2, gpu_us=2.0)
    x = rand(2, seed=2)
    device.launch(long, x)
    assert (device.host_us, device.gpu_busy_until_us) == pytest.approx((5.0, 25.0))
    # The host runs ahead; the second kernel waits for the GPU, not for its launch.
    device.launch(short, x)
    assert (device.host_us, device.gpu_busy_until_us) == pytest.approx((10.0, 27.0))


@pytest.mark.parametrize("flag", ["syncs_host", "copies_from_host"])
def test_a_synchronous_op_outside_capture_runs_and_makes_the_host_wait(flag):
    op = impl.Op("sync_op", lambda v: v / float(np.abs(v).max()), gpu_us=50.0, **{flag: True})
    device = impl.SimDevice(launch_us=5.0)
    x = rand(2, seed=3)
    out = impl.run_eager([op], device, x)
    np.testing.assert_allclose(out, op.fn(x), rtol=1e-6)
    # The host cannot go on before the GPU has finished the synchronous op.
    assert device.host_us == pytest.approx(device.gpu_busy_until_us)
    assert device.host_us == pytest.approx(5.0 + 50.0)


def test_capture_records_each_op_as_a_node_and_launches_nothing():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2)
    device = impl.SimDevice()
    graph = impl.CapturedGraph(device)
    x = rand(4, seed=4)
    with device.capture(graph):
        h = record(device, ops, x)
    assert device.launches == 0, "capturing records kernels; it must not launch them"
    assert device.trace == []
    assert (device.host_us, device.gpu_busy_until_us) == (0.0, 0.0)
    assert [node.op.name for node in graph.nodes] == [op.name for op in ops]
    assert h.shape == (4, HIDDEN) and h.dtype == np.float32


def test_captured_nodes_chain_through_the_buffers_they_were_given():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2)
    device = impl.SimDevice()
    graph = impl.CapturedGraph(device)
    x = rand(3, seed=5)
    with device.capture(graph):
        h = record(device, ops, x)
    # A node reads the very array it was launched on (not a copy of it): the first one
    # reads `x`, each later one the output buffer of the node before.
    assert graph.nodes[0].src is x
    for before, node in zip(graph.nodes, graph.nodes[1:]):
        assert node.src is before.dst
    assert graph.nodes[-1].dst is h


def test_captured_outputs_are_new_buffers_of_the_graph_pool():
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2)
    device = impl.SimDevice()
    graph = impl.CapturedGraph(device)
    x = rand(4, seed=6)
    with device.capture(graph):
        record(device, ops, x)
    outputs = [node.dst for node in graph.nodes]
    assert len({id(buf) for buf in outputs}) == len(ops), "one new buffer per recorded kernel"
    for node in graph.nodes:
        assert any(buf is node.dst for buf in device.pool.buffers), (
            f"the output of {node.op.name} is not a buffer of the device's graph pool"
        )
        assert node.dst.shape == node.op.fn(node.src).shape
    # up_proj and gelu are (4, 32); rmsnorm and down_proj are (4, 16); float32
    assert device.pool.nbytes == 2 * (2 * 4 * 16 + 2 * 4 * 32) * 4


def test_allocating_inside_capture_is_allowed_the_pool_provides_the_memory():
    # Every kernel that returns a new tensor allocates; during capture that memory comes
    # from the graph's private pool and stays there, at a fixed address.
    widen = impl.Op("widen", lambda v: np.concatenate([v, v * v], axis=1))
    device = impl.SimDevice()
    graph = impl.CapturedGraph(device)
    x = rand(2, seed=7)
    with device.capture(graph):
        out = device.launch(widen, x)
    assert out.shape == (2, 2 * HIDDEN) and out.dtype == np.float32
    assert device.pool.buffers[-1] is out
    assert len(graph.nodes) == 1


def capture_model_with(device, middle, seed):
    """Capture scale -> middle -> shift; return the graph (or let the error through)."""
    scale = impl.Op("scale", lambda v: v * 0.5)
    shift = impl.Op("shift", lambda v: v + 1.0)
    graph = impl.CapturedGraph(device)
    with device.capture(graph):
        record(device, [scale, middle, shift], rand(2, seed=seed))
    return graph


@pytest.mark.parametrize(
    "op",
    [
        # .item(), printing a tensor, a device-to-host copy: the host waits for a value
        ("read_max_to_host", {"syncs_host": True}),
        # torch.tensor(list, device="cuda"): a blocking copy of host data to the device
        ("positions_from_list", {"copies_from_host": True}),
    ],
    ids=["host sync", "copy from host"],
)
def test_a_synchronous_op_inside_capture_raises_naming_the_op_and_records_nothing(op):
    name, flags = op
    device = impl.SimDevice()
    bad = impl.Op(name, lambda v: v + float(v.max()), **flags)
    graph = impl.CapturedGraph(device)
    with pytest.raises(impl.CaptureError, match=name):
        with device.capture(graph):
            record(device, [impl.Op("scale", lambda v: v * 0.5), bad], rand(2, seed=8))
    assert [node.op.name for node in graph.nodes] == ["scale"], "the refused op is not recorded"
    assert device.launches == 0
    assert not device.is_capturing


def test_full_capture_of_an_uncapturable_op_raises_pointing_to_piecewise_or_eager():
    attention = impl.Op("attention", lambda v: v[::-1].copy(), capturable=False)
    with pytest.raises(impl.CaptureError, match="attention") as info:
        capture_model_with(impl.SimDevice(), attention, seed=9)
    message = str(info.value)
    assert "PiecewiseGraphRunner" in message
    assert "eager" in message.lower()


def test_your_step1_predictions_match_what_the_reference_computes():
    # The README's scenario: the 8-op toy model on one (4, 16) float32 input.
    x = np.random.default_rng(0).standard_normal((4, HIDDEN)).astype(np.float32)
    ops = reference.toy_model(hidden=HIDDEN, num_layers=2)
    eager = reference.SimDevice()
    reference.run_eager(ops, eager, x)
    device = reference.SimDevice()
    graph = reference.CapturedGraph(device)
    with device.capture(graph):
        out = x
        for op in ops:
            out = device.launch(op, out)
    check_predictions(
        answers,
        {
            "EAGER_HOST_US": eager.host_us,
            "EAGER_CLOCK_US": eager.clock_us,
            "CAPTURE_POOL_BYTES": device.pool.nbytes,
            "OUTPUT_IS_NAN_AFTER_CAPTURE": bool(np.isnan(out).all()),
        },
    )


def test_capture_computes_nothing_the_buffers_hold_no_result_until_a_replay():
    # On a GPU the kernels of a capture do not run: reading an output right after the
    # capture gives whatever the memory held. The pool fills new buffers with NaN so
    # that such a read is visible.
    ops = impl.toy_model(hidden=HIDDEN, num_layers=2)
    device = impl.SimDevice()
    graph = impl.CapturedGraph(device)
    with device.capture(graph):
        record(device, ops, rand(4, seed=7))
    for node in graph.nodes:
        assert np.isnan(node.dst).all(), (
            f"{node.op.name}'s output buffer holds values right after the capture: the "
            "capture ran the kernel instead of recording it"
        )


def test_an_op_that_changes_the_dtype_inside_the_capture_gets_a_buffer_of_its_own_dtype():
    # Casting to half precision and a greedy argmax (token ids) inside the graph: each
    # output buffer must hold what the kernel returns, not the dtype it was launched on.
    ops = [
        impl.Op("to_half", lambda v: v.astype(np.float16)),
        impl.Op("argmax", lambda v: v.argmax(axis=-1)),
    ]
    device = impl.SimDevice()
    graph = impl.CapturedGraph(device)
    x = rand(3, seed=8)
    with device.capture(graph):
        ids = record(device, ops, x)
    half = graph.nodes[0].dst
    assert half.dtype == np.float16 and half.shape == (3, HIDDEN)
    assert ids.dtype == expected(ops, x).dtype and ids.shape == (3,)
    assert device.pool.nbytes == 3 * HIDDEN * 2 + ids.nbytes
