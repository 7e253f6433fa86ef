"""The kernel table's switch on the GPU (GPU-REQ; the switch itself and the CPU engine:
tests/engine/test_custom_ops.py).

SmolLM2's shape on CUDA in float32, eager, with CUDA graphs and compiled with CUDA graphs:
the engine on plain torch (custom_ops="none") gives the tokens the kernels give.
"""

from __future__ import annotations

import pytest
import torch

from mini_vllm import LLM
from mini_vllm.attention.paged import PagedAttentionBackend
from tests.engine.test_custom_ops import tokens


@pytest.mark.gpu
@pytest.mark.parametrize(
    "mode",
    [
        dict(enforce_eager=True),
        dict(cudagraph_mode="full_and_piecewise"),
        dict(cudagraph_mode="full_and_piecewise", compilation_mode="vllm_compile"),
    ],
    ids=["eager", "graphs", "compiled+graphs"],
)
def test_on_cuda_torch_alone_gives_the_kernels_tokens_in_float32(mode):
    """The torch-only engine (CUDA graphs and compilation still on) against the kernels, in
    float32 on the GPU, greedy: the same tokens."""
    options = dict(device="cuda", dtype="float32", max_num_seqs=4, **mode)
    with_kernels = LLM("smollm2-135m", custom_ops="all", **options)
    assert type(with_kernels.engine.runner.attn_backend).__name__ == "TritonPagedAttentionBackend"
    expected = tokens(with_kernels)
    del with_kernels
    torch.cuda.empty_cache()
    without = LLM("smollm2-135m", custom_ops="none", **options)
    assert type(without.engine.runner.attn_backend) is PagedAttentionBackend
    assert tokens(without) == expected
