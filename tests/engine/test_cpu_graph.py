"""The CPU recording graph has torch.cuda.CUDAGraph's semantics, constraints included."""

import pytest
import torch

from mini_vllm.compilation.cpu_graph import CaptureError, CPUGraph, cpu_graph
from mini_vllm.compilation.cuda_graph import CUDAGraphWrapper
from mini_vllm.compilation.graph_backend import CPUGraphBackend
from mini_vllm.config.compilation import CUDAGraphMode
from mini_vllm.forward_context import BatchDescriptor, set_forward_context


@pytest.fixture
def layer():
    torch.manual_seed(0)
    return torch.nn.Linear(8, 8)


def capture(fn, static_input):
    graph = CPUGraph()
    with torch.inference_mode():
        fn(static_input)  # warm-up, as on CUDA
        with cpu_graph(graph):
            output = fn(static_input)
    return graph, output


def test_replay_reads_the_static_input_and_rewrites_the_same_output(layer):
    f = lambda x: torch.relu(layer(x)).softmax(-1) * 2  # noqa: E731
    static = torch.randn(4, 8)
    graph, output = capture(f, static)
    with torch.inference_mode():
        new = torch.randn(4, 8)
        graph.replay()  # not copied in: the graph still sees the capture-time input
        assert not torch.equal(output, f(new))
        static.copy_(new)
        graph.replay()
        assert torch.equal(output, f(new))
    assert graph.num_nodes > 0


def test_python_control_flow_is_frozen_at_capture(layer):
    use_relu = {"flag": True}

    def f(x):
        y = layer(x)
        return torch.relu(y) if use_relu["flag"] else -y

    static = torch.randn(2, 8)
    graph, output = capture(f, static)
    use_relu["flag"] = False  # the Python branch changes, the recording does not
    with torch.inference_mode():
        graph.replay()
        assert (output >= 0).all()


@pytest.mark.parametrize(
    "sync",
    [
        lambda t: t.sum().item(),
        lambda t: t.tolist(),
        lambda t: bool(t.sum() > 0),
        lambda t: t.nonzero(),
    ],
)
def test_host_sync_during_capture_raises_naming_the_op(layer, sync):
    graph = CPUGraph()
    with pytest.raises(CaptureError, match="host"):
        with torch.inference_mode(), cpu_graph(graph):
            sync(layer(torch.randn(2, 8)))


def test_random_ops_draw_fresh_numbers_on_every_replay():
    static = torch.zeros(1000)
    graph, output = capture(lambda x: x + torch.rand_like(x), static)
    with torch.inference_mode():
        first = output.clone()
        graph.replay()
        assert not torch.equal(first, output)


def test_replay_before_capture_and_double_capture_are_errors(layer):
    with pytest.raises(CaptureError):
        CPUGraph().replay()
    graph, _ = capture(layer, torch.randn(1, 8))
    with pytest.raises(CaptureError, match="reset"):
        graph.capture_begin()


def test_wrapper_keeps_one_graph_per_shape_and_passes_through_other_modes(layer):
    wrapper = CUDAGraphWrapper(layer, CUDAGraphMode.PIECEWISE, CPUGraphBackend())
    inputs = {n: torch.randn(n, 8) for n in (1, 4)}
    with torch.inference_mode():
        for n, x in inputs.items():
            with set_forward_context(CUDAGraphMode.PIECEWISE, BatchDescriptor(n)):
                wrapper(x)
        assert set(wrapper.entries) == {BatchDescriptor(1), BatchDescriptor(4)}
        with set_forward_context(CUDAGraphMode.FULL, BatchDescriptor(4)):  # another level's mode
            eager = wrapper(inputs[4] * 3)
        assert (
            torch.equal(eager, layer(inputs[4] * 3))
            and wrapper.entries[BatchDescriptor(4)].num_replays == 0
        )


def test_wrapper_debug_mode_catches_inputs_at_new_addresses(layer):
    wrapper = CUDAGraphWrapper(layer, CUDAGraphMode.FULL, CPUGraphBackend(), debug=True)
    static = torch.randn(2, 8)
    with torch.inference_mode(), set_forward_context(CUDAGraphMode.FULL, BatchDescriptor(2)):
        wrapper(static)
        wrapper(static)  # same buffer: fine
        with pytest.raises(RuntimeError, match="input addresses changed"):
            wrapper(static.clone())


def test_wrapper_refuses_none_as_its_own_mode(layer):
    with pytest.raises(ValueError, match="FULL or PIECEWISE"):
        CUDAGraphWrapper(layer, CUDAGraphMode.NONE, CPUGraphBackend())
