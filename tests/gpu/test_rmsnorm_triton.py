"""The one-kernel Triton RMSNorm equals the torch version (GPU-REQ).

Tolerance: both round the residual sum and the normalised row to bfloat16 the same
way; only the order of the float32 sum of squares differs, which can move a value by
one bfloat16 step (2^-8 relative) where it sits on a rounding boundary.
"""

from __future__ import annotations

import pytest
import torch

from mini_vllm.layers.layernorm import RMSNorm

pytestmark = pytest.mark.gpu


def torch_rmsnorm(x, weight, eps, residual=None):
    """The arithmetic of RMSNorm.forward's torch path, restated here."""
    if residual is not None:
        x = x + residual
        residual = x
    xf = x.float()
    out = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight
    return out if residual is None else (out, residual)


@pytest.mark.parametrize("tokens", [1, 7, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triton_rmsnorm_matches_torch(tokens, dtype):
    from mini_vllm.kernels.rms_norm import triton_rmsnorm_fits

    torch.manual_seed(tokens)
    norm = RMSNorm(576, eps=1e-5).to("cuda", dtype)
    norm.weight.normal_(1.0, 0.1)
    x = torch.randn(tokens, 576, device="cuda", dtype=dtype) * 3
    residual = torch.randn(tokens, 576, device="cuda", dtype=dtype)
    assert triton_rmsnorm_fits(x, norm.weight, residual)
    tol = dict(rtol=2**-7, atol=2**-7) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norm(x), torch_rmsnorm(x, norm.weight, 1e-5), **tol)
    out, new_residual = norm(x, residual)
    ref_out, ref_residual = torch_rmsnorm(x, norm.weight, 1e-5, residual)
    assert torch.equal(new_residual, ref_residual)  # the add rounds the same way
    torch.testing.assert_close(out, ref_out, **tol)


def test_triton_rmsnorm_is_one_kernel():
    from torch.profiler import ProfilerActivity, profile

    norm = RMSNorm(576).to("cuda", torch.bfloat16)
    x, residual = (torch.randn(4, 576, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    norm(x, residual)  # compile the kernel outside the profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        norm(x, residual)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(kernels) == 1, [e.name for e in kernels]
