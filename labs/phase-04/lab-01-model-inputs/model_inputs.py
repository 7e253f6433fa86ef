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

What a `SchedulerOutput` gives you:
- `output.scheduled`: the rows, in order (running requests first, new ones after);
- `output.block_size`: tokens per KV block;
- `output.is_uniform_decode`: the scheduler's verdict on whether the step is a pure decode.
And each row (a `ScheduledSequence`, a snapshot taken at schedule time):
- `row.new_token_ids`: the tokens this row feeds this step (a tuple);
- `row.num_computed_tokens`: tokens of this sequence whose K/V is already cached;
- `row.num_new_tokens`: how many tokens it feeds this step;
- `row.context_len`: num_computed_tokens + num_new_tokens;
- `row.block_table`: its physical KV blocks, in order, enough for context_len tokens;
- `row.samples_token`: whether this step reaches the end of the sequence's known
  tokens, so that it predicts the sequence's next token;
- `row.seq`: the live request, which moves on when the step is applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace  # noqa: F401  (you may use replace)
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mini_vllm.engine.scheduler_output import SchedulerOutput

PAD_SLOT_ID = -1  # given: a slot the attention backend's KV write skips (writes nowhere)


@dataclass(frozen=True)
class ModelInputs:
    """Given: one forward's inputs, flattened. Lists index tokens or rows as their names say."""

    input_ids: list[int]  # per token
    positions: list[int]  # per token: its position in its own sequence
    slot_mapping: list[int]  # per token: the cache slot its K/V is written to
    query_lens: list[int]  # per row: new tokens this step
    seq_lens: list[int]  # per row: tokens attention reads from the cache this step
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

        Guarantees: num_reqs + 1 entries; the first is 0, the last is the sum of the
        query lengths; row r's tokens are the half-open range
        [query_start_loc[r], query_start_loc[r + 1]). vLLM's name; FlashAttention calls
        it cu_seqlens_q. Does not change the object.

        Example: query_lens [1, 3, 2] -> [0, 1, 4, 6]; no rows -> [0].
        """
        raise NotImplementedError("TODO: step 1")


def prepare_inputs(output: SchedulerOutput) -> ModelInputs:
    """One forward's inputs for the rows of `output`, in row order, unpadded.

    Guarantees:
    - per token (every row's new tokens, rows end to end, tokens in order): its id; its
      position in its own sequence; and the slot of the paged KV cache where the forward
      writes its key and value, which is the slot the block manager gave that position
      of that sequence (its block table says which physical block holds it);
    - per row: its query length (tokens fed this step), its sequence length (tokens in
      the cache once this step has written its K/V), its block table (a list of its own);
    - sampling: one entry per row whose next token this step predicts, in row order:
      `sampling_rows` holds the row's index in the batch, `logits_indices` the flat
      index of the token whose hidden state predicts that next token;
    - `uniform_decode`: True exactly when every row decodes one token (the batches a
      FULL decode graph serves);
    - num_real_tokens stays -1 (nothing is padded); the placeholder lists stay empty;
    - the result is the same whether it is built before or after the scheduler applies
      the step.

    Example (block size 4): row 0 decodes token 99 with 5 tokens cached, block table
    (0, 1); row 1 is the first chunk, [20, 21, 22], of a 6-token prompt, block table
    (2,). Then input_ids [99, 20, 21, 22], positions [5, 0, 1, 2], slot_mapping
    [5, 8, 9, 10], query_lens [1, 3], seq_lens [6, 3], block_tables [[0, 1], [2]],
    logits_indices [0], sampling_rows [0], uniform_decode False.
    """
    raise NotImplementedError("TODO: step 2")


def pad_inputs(inputs: ModelInputs, num_tokens: int) -> ModelInputs:
    """`inputs` padded to `num_tokens` tokens (the size of a captured CUDA graph), harmlessly.

    Guarantees:
    - returns a NEW ModelInputs; `inputs` and every list in it stay exactly as they were;
    - num_tokens below inputs.num_tokens: ValueError (padding only grows a batch);
    - num_real_tokens of the result is the number of real tokens, also when nothing is
      added;
    - the real tokens and rows come first, unchanged, and every padded token is one the
      model can embed and rotate (a token id and a position it accepts);
    - the padding does no harm: a padded token writes no key or value where any
      request's K/V lives, nothing is read on its behalf, and it is never sampled;
    - the padded batch is one the graph captured for `num_tokens` can run (the chapter's
      padding rules say what a FULL graph and a piecewise graph were captured with).

    What a padded token (and a padded row, if you add rows) carries is your decision:
    the tests show what each wrong choice breaks.

    Example: 6 real tokens padded to 8 -> num_tokens 8, num_real_tokens 6, and the
    first 6 entries of every per-token list as they were.
    """
    raise NotImplementedError("TODO: step 3")
