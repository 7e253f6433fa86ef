"""Phase 04, lab 01 — from a scheduler's batch to the flat inputs of one forward (your code).

Mirrors mini_vllm/engine/model_inputs.py, the course's version of the input
preparation in vLLM's vllm/v1/worker/gpu_model_runner.py (`GPUModelRunner._prepare_inputs`:
query_start_loc, positions, slot mapping, logits indices; the padding to a CUDA-graph
size) and of nano-vllm's nanovllm/engine/model_runner.py (`prepare_prefill`,
`prepare_decode`).
Run: pytest labs/phase-04/lab-01-model-inputs

The model sees no batch dimension. Every scheduled row's new tokens are laid end to
end, in row order, so `input_ids`, `positions` and `slot_mapping` have one entry per
token; the per-row facts attention needs (query lengths, sequence lengths, block
tables) travel beside them.

What you read from a `SchedulerOutput` (mini_vllm/engine/scheduler_output.py):
- `output.scheduled`: the rows, in order (running requests first, new ones after);
- `output.block_size`;
- `output.is_uniform_decode`: every row decodes exactly one token, none in prefill.
And from each row (a `ScheduledSequence`, a snapshot taken at schedule time):
- `row.new_token_ids`: the tokens this row feeds (a tuple);
- `row.num_computed_tokens`: K/V already cached = the position of the first new token;
- `row.num_new_tokens`: the row's query length;
- `row.context_len`: num_computed_tokens + num_new_tokens (its sequence length after
  this step's K/V write);
- `row.block_table`: its physical KV blocks, in order (already covers context_len);
- `row.samples_token`: whether this step reaches the end of the sequence, so the
  row's last token's logits give the next token.
Read only these: the live request (`row.seq`) moves on once the step is applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace  # noqa: F401  (replace: for pad_inputs)
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mini_vllm.engine.scheduler_output import SchedulerOutput

PAD_SLOT_ID = -1  # given: the slot of a padded token; the KV write skips it


@dataclass(frozen=True)
class ModelInputs:
    """Given: one forward's inputs, flattened. Lists index tokens or rows as their names say."""

    input_ids: list[int]  # per token
    positions: list[int]  # per token: its position in its own sequence
    slot_mapping: list[int]  # per token: where its K/V goes; -1 writes nothing
    query_lens: list[int]  # per row: new tokens this step
    seq_lens: list[int]  # per row: tokens in the cache after this step (0 for a padded row)
    block_tables: list[list[int]]  # per row: its physical blocks, in order
    logits_indices: list[int]  # token index whose hidden state samples, one per sampling row
    sampling_rows: list[int]  # the rows that sample this step, in order
    uniform_decode: bool  # every real row decodes exactly one token
    num_real_tokens: int = field(default=-1)  # before padding (-1: no padding applied)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_reqs(self) -> int:
        return len(self.query_lens)

    @property
    def query_start_loc(self) -> list[int]:
        """Where each row's tokens start in the flat arrays, plus the end:
        [0, q0, q0 + q1, ...], num_reqs + 1 entries (vLLM's name; FlashAttention
        calls it cu_seqlens_q). Row r's tokens are [query_start_loc[r], query_start_loc[r + 1])."""
        raise NotImplementedError("TODO: a running sum of query_lens, starting at 0")


def prepare_inputs(output: SchedulerOutput) -> ModelInputs:
    """Flatten the scheduled rows, in row order, into one forward's inputs.

    Per token (all rows end to end):
    - input_ids: the row's new_token_ids;
    - positions: num_computed_tokens, num_computed_tokens + 1, ... (one per new token);
    - slot_mapping: block_table[p // block_size] * block_size + p % block_size for each
      position p (mini_vllm.engine.block_manager.slot_mapping does this for a range,
      if you would rather not write it again).
    Per row: query_lens (num_new_tokens), seq_lens (context_len), block_tables (as lists).
    Sampling: for each row with samples_token, logits_indices gets the flat index of
    the row's LAST new token, and sampling_rows gets the row's index. A prefill chunk
    that stops short of the end samples nothing.
    uniform_decode: the output's is_uniform_decode (a 1-token prompt has query length
    1 but is a prefill: not uniform decode).
    Leave num_real_tokens at its default (-1): nothing is padded yet.
    """
    raise NotImplementedError("TODO: one pass over output.scheduled")


def pad_inputs(inputs: ModelInputs, num_tokens: int) -> ModelInputs:
    """Pad to `num_tokens` tokens (a captured graph's size) so the padding does no harm.

    Return a NEW ModelInputs (dataclasses.replace); never change `inputs` or its lists.
    - num_tokens below inputs.num_tokens: ValueError (padding only grows a batch).
    - num_real_tokens: inputs.num_tokens, always (also when nothing needs adding).
    - every padded token: id 0, position 0, slot PAD_SLOT_ID (its K/V goes nowhere).
    - uniform-decode batch: each padded token is also a padded ROW of its own, as a
      FULL graph was captured for that many rows: query length 1, sequence length 0
      (attention reads nothing for it), an empty block table.
    - mixed batch: the rows stay exactly as they are; only the token arrays grow (a
      piecewise graph's pieces see tokens only; attention runs eagerly on real rows).
    - sampling (logits_indices, sampling_rows) and uniform_decode are unchanged: a
      padded token is never sampled from.
    """
    raise NotImplementedError("TODO: grow the token arrays; for uniform decode, the row arrays too")
