"""Triton kernels launched past Triton's front end (mini_vllm/kernels/launch.py).

The short path must never reach a kernel compiled for other arguments: the
specialisation it keys on is checked here on any machine, and on a GPU (GPU-REQ) a
kernel launched both ways, on aligned and misaligned rows, on a side stream and inside
a CUDA graph, gives what Triton's own launch gives.
"""

from __future__ import annotations

import pytest
import torch

from mini_vllm.kernels.launch import specialisation


def test_the_specialisation_tells_apart_what_triton_compiles_for():
    def key(*args, constexprs=frozenset()):
        return specialisation(args, constexprs)

    rows = torch.empty(4, 8)
    aligned, misaligned = rows[1:], rows[:, 1:]  # 32 bytes in: aligned; 4 bytes in: not
    assert key(rows) == key(aligned)
    assert key(rows) != key(misaligned)
    assert key(rows) != key(rows.to(torch.bfloat16))
    # Integers: 1, multiples of 16, others, and those beyond 32 bits are four kernels.
    assert len({key(1), key(2), key(32), key(2**40 + 3)}) == 4
    assert key(3) == key(5) and key(32) == key(48)
    # A float's value is an argument, not part of the kernel; a boolean's is.
    assert key(0.5) == key(2.0)
    assert key(True) != key(False)
    assert key(None) != key(0)
    # A constexpr is compiled in: each value is its own kernel.
    assert key(3, 3, constexprs=frozenset({1})) != key(3, 5, constexprs=frozenset({1}))
    assert key(3, 3, constexprs=frozenset({1})) == key(5, 3, constexprs=frozenset({1}))
    assert key(3, constexprs=None) != key(5, constexprs=None)  # unknown: every int by value


def _torch_rmsnorm(x, weight, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


@pytest.mark.gpu
def test_a_short_launch_equals_tritons_own_on_aligned_and_misaligned_rows():
    from mini_vllm.kernels import launch as triton_launch
    from mini_vllm.kernels.rms_norm import triton_rmsnorm

    torch.manual_seed(0)
    weight = torch.randn(576, device="cuda")
    padded = torch.randn(5, 577, device="cuda")
    aligned, misaligned = padded[:, :576], padded[:, 1:]
    before = len(triton_launch._launchers)
    for rows in (aligned, misaligned, aligned, misaligned):  # first Triton's path, then short
        torch.testing.assert_close(
            triton_rmsnorm(rows, weight, 1e-5), _torch_rmsnorm(rows, weight, 1e-5)
        )
    assert len(triton_launch._launchers) == before + 2  # one kernel each, kept


@pytest.mark.gpu
def test_a_short_launch_runs_on_the_current_stream_and_inside_a_cuda_graph():
    from mini_vllm.kernels.rms_norm import triton_rmsnorm

    weight = torch.randn(576, device="cuda")
    x = torch.randn(3, 576, device="cuda")
    triton_rmsnorm(x, weight, 1e-5)  # kept for the short path
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = triton_rmsnorm(x, weight, 1e-5)
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(on_side, _torch_rmsnorm(x, weight, 1e-5))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = triton_rmsnorm(x, weight, 1e-5)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.testing.assert_close(captured, _torch_rmsnorm(x, weight, 1e-5))


@pytest.mark.gpu
def test_a_host_tensor_never_reaches_a_kernel_as_an_address():
    # The short path passes addresses; a CPU tensor must not become one. Its key differs
    # (the tensor is not on the GPU), so it takes Triton's path, which refuses it.
    from mini_vllm.kernels.rms_norm import triton_rmsnorm

    weight = torch.randn(576, device="cuda")
    x = torch.randn(3, 576, device="cuda")
    triton_rmsnorm(x, weight, 1e-5)  # kept for the short path
    with pytest.raises((ValueError, RuntimeError)):
        triton_rmsnorm(x, weight.cpu(), 1e-5)
    # The GPU took no harm: the next launch computes as before.
    torch.testing.assert_close(triton_rmsnorm(x, weight, 1e-5), _torch_rmsnorm(x, weight, 1e-5))
