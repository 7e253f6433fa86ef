"""The eager CUDA layers' one-kernel paths equal their torch versions (GPU-REQ).

RoPE (mini_vllm/kernels/rotary_embedding.py) rotates q and k in place in one kernel and
SwiGLU's gate (mini_vllm/layers/activation.py) is one kernel, where the torch versions
are five and two. Both round where torch rounds; a float32 sum may still be fused into
one multiply-add by the compiler, which moves a bfloat16 result by one step (2^-8
relative) at most where it sits on a rounding boundary.
"""

from __future__ import annotations

import pytest
import torch

from mini_vllm.layers.activation import SiluAndMul, silu_and_mul_native
from mini_vllm.layers.rotary_embedding import RotaryEmbedding

pytestmark = pytest.mark.gpu

TOLERANCE = {
    torch.bfloat16: dict(rtol=2**-7, atol=2**-7),
    torch.float32: dict(rtol=1e-6, atol=1e-6),
}


def _kernels(fn) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    fn()  # compiled outside the profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("heads", [(9, 3, 64), (32, 8, 128)], ids=["smollm2", "llama-8b"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tokens", [1, 5])
def test_eager_cuda_rope_rotates_in_place_as_the_torch_version(heads, dtype, tokens):
    num_heads, num_kv_heads, head_dim = heads
    rope = RotaryEmbedding(head_dim, 4096, 10000.0).to("cuda")
    torch.manual_seed(tokens)
    qkv = torch.randn(tokens, (num_heads + 2 * num_kv_heads) * head_dim, device="cuda").to(dtype)
    q, k, _ = qkv.split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], -1
    )
    positions = torch.randint(0, 4096, (tokens,), device="cuda")
    want_q, want_k = rope.forward_native(positions, q.clone(), k.clone())
    got_q, got_k = rope(positions, q, k)  # eagerly on CUDA: forward_cuda
    assert got_q.data_ptr() == q.data_ptr() and got_k.data_ptr() == k.data_ptr()  # in place
    torch.testing.assert_close(got_q, want_q, **TOLERANCE[dtype])
    torch.testing.assert_close(got_k, want_k, **TOLERANCE[dtype])


def test_eager_cuda_rope_and_swiglu_are_one_kernel_each():
    rope = RotaryEmbedding(64, 2048, 10000.0).to("cuda")
    qkv = torch.randn(2, 15 * 64, device="cuda", dtype=torch.bfloat16)
    q, k, _ = qkv.split([9 * 64, 3 * 64, 3 * 64], -1)
    positions = torch.tensor([3, 70], device="cuda")
    assert len(_kernels(lambda: rope(positions, q, k))) == 1
    gate_up = torch.randn(2, 2 * 1536, device="cuda", dtype=torch.bfloat16)
    assert len(_kernels(lambda: SiluAndMul()(gate_up))) == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_eager_cuda_swiglu_equals_the_torch_version(dtype):
    torch.manual_seed(1)
    gate_up = torch.randn(3, 2 * 1536, device="cuda").to(dtype) * 4
    torch.testing.assert_close(
        SiluAndMul()(gate_up), silu_and_mul_native(gate_up), **TOLERANCE[dtype]
    )
