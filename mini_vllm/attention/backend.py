"""The interface every attention backend implements.

vLLM counterpart: vllm/attention/backends/abstract.py (`AttentionBackend`,
`AttentionImpl.forward`) and the `cudagraph_support` class attribute of the metadata
builders in vllm/v1/attention/backends/ (`AttentionCGSupport`, see
mini_vllm/config/compilation.py). vLLM splits the static description (backend class) from the
per-layer object (impl); one object plays both parts here.

A backend receives the new tokens' q, k, v as `[num_tokens, heads, head_dim]` views,
the layer's cache tensor (whose layout only the backend knows) and the per-step
metadata object it defined itself; it writes k and v into the cache and returns the
attention output `[num_tokens, num_heads, head_dim]`.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import torch

from mini_vllm.config.compilation import AttentionCGSupport

__all__ = ["AttentionBackend"]


class AttentionBackend(abc.ABC):
    name: ClassVar[str] = "abstract"
    # How much of a batch this backend can run inside a captured CUDA graph (Phase 05).
    cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER
    # Whether `forward` takes `output=` (a `[T, H, D]` tensor to write into, saving a copy).
    accepts_output: ClassVar[bool] = False
    # True: `forward(..., rope=(positions, cos_sin_cache))` takes q and k unrotated and
    # applies neox RoPE itself (the fused `mini_vllm::attention_with_rope`).
    accepts_rope: ClassVar[bool] = False

    @abc.abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor | None,
        metadata: Any,
    ) -> torch.Tensor:
        """Store k, v in `kv_cache` where `metadata` says; return attention of q over the cache."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
