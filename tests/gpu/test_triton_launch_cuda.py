"""Triton kernels launched past Triton's front end, on a GPU (GPU-REQ; the specialisation
the short path keys on, on any machine: tests/engine/test_triton_launch.py).

A kernel launched both ways, on aligned and misaligned rows, on a side stream and inside
a CUDA graph, gives what Triton's own launch gives; a host tensor never reaches a kernel
as an address.
"""

from __future__ import annotations

import pytest
import torch


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
