"""Phase 04, lab 01 — from a scheduler's batch to the flat inputs of one forward (your code).

The course's version of the input preparation in vLLM's vllm/v1/worker/gpu_model_runner.py
(`GPUModelRunner._prepare_inputs`: query_start_loc, positions, slot mapping, logits
indices; the padding to a CUDA-graph size) and of nano-vllm's
nanovllm/engine/model_runner.py (`prepare_prefill`, `prepare_decode`).
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
    # Async scheduling (a later chapter): tokens not sampled yet when the step was planned.
    # Not used in this lab: leave both empty.
    placeholder_tokens: list[int] = field(default_factory=list)  # token indices
    placeholder_seq_ids: list = field(default_factory=list)  # whose token each one is

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_reqs(self) -> int:
        return len(self.query_lens)

    @property
    def query_start_loc(self) -> list[int]:
        """Where each row's tokens start in the flat arrays, plus where the last one ends.

        Guarantees: num_reqs + 1 entries; the first is 0, the last is num_tokens (the
        sum of query_lens); row r's tokens are the half-open range
        [query_start_loc[r], query_start_loc[r + 1]). vLLM's name; FlashAttention calls
        it cu_seqlens_q. Does not change the object.

        Example: query_lens [1, 3, 2] -> [0, 1, 4, 6]; no rows -> [0].
        """
        raise NotImplementedError("TODO: step 1")


def prepare_inputs(output: SchedulerOutput) -> ModelInputs:
    """One forward's inputs for the rows of `output`, in row order, unpadded.

    Per token (every row's new tokens, rows end to end, tokens in order):
    - input_ids: the row's new_token_ids;
    - positions: the token's position in its own sequence (a row's first new token
      sits at num_computed_tokens);
    - slot_mapping: the cache slot of that position,
      block_table[p // block_size] * block_size + p % block_size.
    Per row: query_lens (num_new_tokens), seq_lens (context_len), block_tables (each
    a new list).
    Sampling: one entry per row with samples_token, in row order: logits_indices holds
    the flat index of that row's LAST new token, sampling_rows the row's index. A
    prompt chunk that stops short of the prompt's end samples nothing.
    uniform_decode: the output's is_uniform_decode (a 1-token prompt has query length
    1 but is a prefill: not uniform decode; an empty batch is not uniform either).
    num_real_tokens stays -1 (nothing is padded); placeholder lists stay empty.
    Reads only the rows' snapshot fields: the result is the same before and after the
    scheduler applies the step.

    Example (block size 4): row 0 decodes token 99 with 5 tokens cached, block table
    [0, 1]; row 1 is a new 3-token prompt [20, 21, 22] on block table [2], all of it
    scheduled. Then input_ids [99, 20, 21, 22], positions [5, 0, 1, 2],
    slot_mapping [5, 8, 9, 10], query_lens [1, 3], seq_lens [6, 3],
    block_tables [[0, 1], [2]], logits_indices [0, 3], sampling_rows [0, 1],
    uniform_decode False.
    """
    raise NotImplementedError("TODO: step 2")


def pad_inputs(inputs: ModelInputs, num_tokens: int) -> ModelInputs:
    """`inputs` padded to `num_tokens` tokens (a captured graph's size), harmlessly.

    - Returns a NEW ModelInputs; `inputs` and its lists are left exactly as they were.
    - num_tokens below inputs.num_tokens: ValueError (padding only grows a batch).
    - num_real_tokens of the result: inputs.num_tokens, always (also when nothing is added).
    - The real tokens and rows come first, unchanged. Every padded token has id 0,
      position 0 and slot PAD_SLOT_ID (its K/V is written nowhere).
    - Uniform-decode batch: each padded token is also a padded ROW of its own (a FULL
      graph was captured for that many decode rows): query length 1, sequence length
      0 (attention reads nothing for it), an empty block table.
    - Mixed batch: the rows are unchanged; only the per-token lists grow (a piecewise
      graph's pieces see tokens only; attention runs eagerly on the real rows).
    - logits_indices, sampling_rows and uniform_decode are unchanged: a padded token
      is never sampled from.

    Example: a uniform decode of 3 rows (input_ids [50, 50, 50], slots [5, 10, 15],
    seq_lens [6, 3, 4]) padded to 4 -> input_ids [50, 50, 50, 0], slots
    [5, 10, 15, -1], query_lens [1, 1, 1, 1], seq_lens [6, 3, 4, 0], one more block
    table [], num_real_tokens 3. The same 3 tokens as a mixed batch of 2 rows padded
    to 4 keep their 2 rows.
    """
    raise NotImplementedError("TODO: step 3")
