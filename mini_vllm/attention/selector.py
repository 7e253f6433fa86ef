"""Which attention backend a model runner uses.

vLLM counterpart: vllm/attention/selector.py (`get_attn_backend`, which picks a backend
class from the platform, the model and the user's choice).

Here there are two, one extending the other: the paged backend in plain torch
(mini_vllm/attention/paged.py), and where the `custom_ops` setting turns on
`paged_attention` and Triton runs on the device, the same backend with its decode and its
cache writes on Triton kernels (mini_vllm/kernels/paged_attention.py, through the table of
mini_vllm/_custom_ops.py).
"""

from __future__ import annotations

import torch

from mini_vllm import _custom_ops as ops
from mini_vllm.attention.backend import AttentionBackend
from mini_vllm.attention.paged import PagedAttentionBackend

__all__ = ["get_attn_backend"]


def get_attn_backend(device: torch.device, custom_ops: frozenset[str]) -> AttentionBackend:
    if ops.enabled("paged_attention", custom_ops):
        backend = ops.paged_attention_backend(device)
        if backend is not None:
            return backend
    return PagedAttentionBackend()
