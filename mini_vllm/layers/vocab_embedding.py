"""The token embedding table and the LM head (logits), which a tied model shares.

vLLM counterpart: vllm/model_executor/layers/vocab_parallel_embedding.py
(`VocabParallelEmbedding`, `ParallelLMHead`); the tying itself is in
vllm/model_executor/models/llama.py (`LlamaForCausalLM.__init__`, `tie_word_embeddings`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mini_vllm import _custom_ops as ops
from mini_vllm.layers.linear import LinearBase

__all__ = ["LMHead", "VocabEmbedding"]


class VocabEmbedding(nn.Module):
    """Token id -> row of the embedding table (vLLM: `VocabParallelEmbedding`)."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)


class LMHead(LinearBase):
    """Hidden state -> logits over the vocabulary (vLLM: `ParallelLMHead`): a linear layer
    `[vocab, hidden]`, whose weight a tied model shares with the embedding table."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__(hidden_size, vocab_size)

    def process_weights_after_loading(self) -> None:
        # The kernels may read the head in another layout than the embedding lookup's rows
        # (column-major on the CPU): a tied head then gets its own copy here, once the
        # shared table is loaded; nothing writes to either afterwards.
        if self.use_kernels:
            shared = self.weight.data
            weight = ops.linear_layout(shared)
            if weight is not shared:
                self.weight = nn.Parameter(weight, requires_grad=False)
