"""Lab 01 — what a graph cannot hold, and the errors that say so (COURSE_SPEC §4, PyTorch rules)."""

import numpy as np
import pytest

from labkit import implementation

impl = implementation(__file__, starter="cudagraph.py", reference="mini_vllm.cudagraph")

HIDDEN = 8


def rand(batch, seed, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal((batch, HIDDEN)).astype(dtype)


def model_with(extra_op):
    """A small model with `extra_op` in the middle."""
    scale = impl.Op("scale", lambda x: x * 0.5)
    shift = impl.Op("shift", lambda x: x + 1.0)
    return [scale, extra_op, shift]


def test_host_sync_inside_capture_raises_naming_the_op():
    to_host = impl.Op("read_max_to_host", lambda x: x / float(x.max()), syncs_host=True)
    runner = impl.GraphRunner(model_with(to_host), impl.SimDevice())
    with pytest.raises(impl.CaptureError, match="read_max_to_host"):
        runner(rand(2, seed=1))


def test_host_sync_outside_capture_runs_and_makes_the_host_wait():
    to_host = impl.Op(
        "read_max_to_host", lambda x: x / float(x.max()), gpu_us=50.0, syncs_host=True
    )
    device = impl.SimDevice(launch_us=5.0)
    x = rand(2, seed=2)
    impl.run_eager([to_host], device, x)
    # The host cannot go on before the GPU has produced the value it reads.
    assert device.host_us == pytest.approx(device.gpu_busy_until_us)
    assert device.host_us == pytest.approx(5.0 + 50.0)


def test_allocation_inside_capture_raises_naming_the_op():
    fresh = impl.Op(
        "fresh_buffer", lambda x: np.concatenate([x, np.zeros_like(x)])[: len(x)], allocates=True
    )
    runner = impl.GraphRunner(model_with(fresh), impl.SimDevice())
    with pytest.raises(impl.CaptureError, match="fresh_buffer"):
        runner(rand(2, seed=3))


def test_failed_capture_stores_no_graph_and_closes_the_capture():
    to_host = impl.Op("item", lambda x: x * float(x[0, 0]), syncs_host=True)
    device = impl.SimDevice()
    runner = impl.GraphRunner(model_with(to_host), device)
    with pytest.raises(impl.CaptureError):
        runner(rand(2, seed=4))
    assert runner.graphs == {}
    assert not device.is_capturing
    # The device still works for a model that can be captured.
    ok = impl.GraphRunner(model_with(impl.Op("square", lambda x: x * x)), device)
    ok(rand(2, seed=5))
    assert list(ok.graphs) == [(2, HIDDEN)]


def test_full_capture_of_an_uncapturable_op_raises_pointing_to_piecewise_or_eager():
    attention = impl.Op("attention", lambda x: x[::-1].copy(), capturable=False)
    runner = impl.GraphRunner(model_with(attention), impl.SimDevice())
    with pytest.raises(impl.CaptureError, match="attention") as info:
        runner(rand(2, seed=6))
    message = str(info.value)
    assert "PiecewiseGraphRunner" in message
    assert "eager" in message.lower()


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
    np.testing.assert_allclose(
        runner(x), impl.run_eager(ops, impl.SimDevice(), x), rtol=1e-6, atol=1e-6
    )


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
    np.testing.assert_allclose(out, impl.run_eager(ops, impl.SimDevice(), x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float64, np.int64])
def test_wrong_dtype_input_raises_naming_the_expected_dtype(dtype):
    runner = impl.GraphRunner(
        impl.toy_model(hidden=HIDDEN, num_layers=1), impl.SimDevice(), dtype=np.float32
    )
    runner(rand(2, seed=13))
    with pytest.raises(ValueError, match="float32"):
        runner(rand(2, seed=14, dtype=dtype))
    with pytest.raises(ValueError, match="float32"):
        runner(rand(5, seed=15, dtype=dtype))  # a new shape is checked before any capture
    assert set(runner.graphs) == {(2, HIDDEN)}
