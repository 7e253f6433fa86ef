"""Phase 05's one-graph-by-hand example, on a machine without CUDA (its GPU side:
tests/gpu/test_cuda_graph_basics_cuda.py).

Without a GPU the example refuses clearly instead of failing inside torch, refuses inputs
of two shapes before it looks for a GPU, and its demo step is capturable: the same four
steps on the CPU recording graph give eager's answers, and a replay without the copy gives
the stale one.
"""

import pytest
import torch

from mini_vllm.compilation.cpu_graph import CPUGraph, cpu_graph
from mini_vllm.errors import UserError
from mini_vllm.teaching.cuda_graph_basics import make_step, replay_with_graph


def test_without_cuda_it_refuses_with_a_message_that_says_what_is_missing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    step = make_step(hidden=8, device="cpu")
    with pytest.raises(UserError, match="needs an NVIDIA GPU") as refused:
        replay_with_graph(step, [torch.randn(2, 8)])
    assert "mini_vllm/teaching/cudagraph.py" in str(refused.value)  # where to go instead


def test_a_graph_is_recorded_for_one_shape_so_two_shapes_are_refused():
    step = make_step(hidden=8, device="cpu")
    with pytest.raises(ValueError, match="one shape"):
        replay_with_graph(step, [torch.randn(2, 8), torch.randn(3, 8)])
    with pytest.raises(ValueError, match="at least one input"):
        replay_with_graph(step, [])


def test_the_demo_step_replays_eagers_answers_on_the_cpu_recording_graph():
    torch.manual_seed(0)
    step = make_step(hidden=8, device="cpu")
    inputs = [torch.randn(2, 8) for _ in range(3)]
    with torch.inference_mode():
        static_x = inputs[0].clone()
        step(static_x)  # warm-up
        graph = CPUGraph()
        with cpu_graph(graph):  # a host sync in the step would raise here
            static_out = step(static_x)
        for x in inputs:
            static_x.copy_(x)
            graph.replay()
            torch.testing.assert_close(static_out, step(x))
        new = torch.randn(2, 8)
        graph.replay()  # `new` never copied in: the graph reads the last input again
        torch.testing.assert_close(static_out, step(inputs[-1]))
        assert not torch.allclose(static_out, step(new))
