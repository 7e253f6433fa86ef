"""The token embedding table and the LM head (logits), which a tied model shares; both split
by vocabulary rows over the tensor-parallel ranks.

vLLM counterpart: vllm/model_executor/layers/vocab_parallel_embedding.py
(`VocabParallelEmbedding`, `ParallelLMHead`); the tying itself is in
vllm/model_executor/models/llama.py (`LlamaForCausalLM.__init__`, `tie_word_embeddings`);
the logits' gather in vllm/model_executor/layers/logits_processor.py.

Rank r holds the rows of token ids `[r * V / tp, (r + 1) * V / tp)` (the vocabulary padded
to a multiple of tp with zero rows). The embedding looks up the ids it holds, gives zeros for
the others, and an all-reduce adds the ranks' rows: each id is found on exactly one rank.
The head computes the logits of its ids and the ranks' slices are gathered side by side.
With one rank both are the plain table and the plain product.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mini_vllm import _custom_ops as ops
from mini_vllm.distributed.communication_op import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from mini_vllm.distributed.parallel_state import get_tp_group
from mini_vllm.layers.linear import LinearBase, _check_shape

__all__ = ["LMHead", "ParallelLMHead", "VocabEmbedding", "VocabParallelEmbedding"]


# ANCHOR: vocab_range
def _vocab_range(vocab_size: int, tp_size: int, tp_rank: int) -> tuple[int, int, int]:
    """(first id, one past the last id, rows a rank holds) of this rank's vocabulary shard."""
    per_partition = math.ceil(vocab_size / tp_size)
    start = min(tp_rank * per_partition, vocab_size)
    return start, min(start + per_partition, vocab_size), per_partition


def _load_vocab_shard(param: nn.Parameter, loaded: torch.Tensor, start: int, end: int, what: str):
    rows = param.data.narrow(0, 0, end - start)
    shard = loaded.narrow(0, start, end - start)
    _check_shape(rows, shard, what)
    rows.copy_(shard)
    if end - start < param.shape[0]:
        param.data[end - start :].zero_()  # padding rows: never looked up, logits cut off


# ANCHOR_END: vocab_range


# ANCHOR: vocab_parallel_embedding
class VocabParallelEmbedding(nn.Module):
    """Token id -> row of the embedding table."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        group = get_tp_group()
        self.tp_size, self.tp_rank = group.world_size, group.rank_in_group
        self.vocab_size = vocab_size
        self.vocab_start_index, self.vocab_end_index, rows = _vocab_range(
            vocab_size, self.tp_size, self.tp_rank
        )
        self.weight = nn.Parameter(torch.empty(rows, hidden_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        start, end = self.vocab_start_index, self.vocab_end_index
        elsewhere = (input_ids < start) | (input_ids >= end)  # ids another rank holds
        local_ids = torch.where(elsewhere, 0, input_ids - start)
        embedded = F.embedding(local_ids, self.weight).masked_fill(elsewhere.unsqueeze(-1), 0)
        return tensor_model_parallel_all_reduce(embedded)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        start, end = self.vocab_start_index, self.vocab_end_index
        _load_vocab_shard(param, loaded, start, end, type(self).__name__)


# ANCHOR_END: vocab_parallel_embedding


# ANCHOR: parallel_lm_head
class ParallelLMHead(LinearBase):
    """Hidden state -> logits over the vocabulary: a linear layer `[vocab, hidden]`, whose
    weight a tied model shares with the embedding table; each rank computes the logits of
    its vocabulary shard and the shards are gathered."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        group = get_tp_group()
        start, end, rows = _vocab_range(vocab_size, group.world_size, group.rank_in_group)
        self.vocab_start_index, self.vocab_end_index = start, end
        super().__init__(hidden_size, vocab_size, output_size_per_partition=rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)
        if self.tp_size == 1:
            return logits
        # Every rank gets all the logits (vLLM gathers them to rank 0 only): simpler, and
        # the copy is one row a sampled request.
        logits = tensor_model_parallel_all_gather(logits, dim=-1)
        return logits[..., : self.output_size]  # without the padding rows' logits

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        start, end = self.vocab_start_index, self.vocab_end_index
        _load_vocab_shard(param, loaded, start, end, type(self).__name__)

    def process_weights_after_loading(self) -> None:
        # The kernels may read the head in another layout than the embedding lookup's rows
        # (column-major on the CPU): a tied head then gets its own copy here, once the
        # shared table is loaded; nothing writes to either afterwards.
        if self.use_kernels:
            shared = self.weight.data
            weight = ops.linear_layout(shared)
            if weight is not shared:
                self.weight = nn.Parameter(weight, requires_grad=False)


# ANCHOR_END: parallel_lm_head

# The names of the single-GPU course, kept: with one rank they are these layers.
VocabEmbedding = VocabParallelEmbedding
LMHead = ParallelLMHead
