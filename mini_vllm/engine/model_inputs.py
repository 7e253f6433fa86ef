"""From a scheduler's batch to the flat inputs of one forward, and the padding rules.

vLLM counterpart: vllm/v1/worker/gpu_model_runner.py (`GPUModelRunner._prepare_inputs`:
query_start_loc, positions, slot mapping, the logits indices; and the padding for a
CUDA graph size in `execute_model`). nano-vllm: nanovllm/engine/model_runner.py
(`prepare_prefill`, `prepare_decode`).

The model sees no batch dimension: every row's new tokens are laid end to end
(`input_ids`, `positions`, `slot_mapping` have one entry per token), and the per-row
facts attention needs (query lengths, sequence lengths, block tables) travel beside
them. This file is pure Python on purpose: it is the part a student writes in
Phase 04's lab, and the model runner turns its lists into device tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from mini_vllm.engine.block_manager import PAD_SLOT_ID, slot_mapping
from mini_vllm.engine.scheduler_output import SchedulerOutput
from mini_vllm.engine.sequence import PLACEHOLDER

__all__ = ["ModelInputs", "pad_inputs", "prepare_inputs"]


# ANCHOR: model_inputs
@dataclass(frozen=True)
class ModelInputs:
    """One forward's inputs, flattened. Lists index tokens or rows as their names say."""

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
    # Async scheduling: tokens not sampled yet when the step was planned (their ids are
    # 0 here; the runner copies them from the previous step's samples on the device).
    placeholder_tokens: list[int] = field(default_factory=list)  # token indices
    placeholder_seq_ids: list = field(default_factory=list)  # whose token each one is
    # ANCHOR_END: model_inputs

    @property
    def num_tokens(self) -> int:
        """Rows of the flattened batch: one a token
        computed (padding rows included, once padded)."""
        return len(self.input_ids)

    @property
    def num_reqs(self) -> int:
        return len(self.query_lens)

    # ANCHOR: query_start_loc
    @property
    def query_start_loc(self) -> list[int]:
        """Where each row's tokens start in the flat arrays, plus the end: [0, q0, q0+q1, ...]."""
        starts = [0]
        for q in self.query_lens:
            starts.append(starts[-1] + q)
        return starts
        # ANCHOR_END: query_start_loc


# ANCHOR: prepare_inputs
def prepare_inputs(output: SchedulerOutput) -> ModelInputs:
    """Flatten the scheduled rows, in row order, into one forward's inputs."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    logits_indices: list[int] = []
    sampling_rows: list[int] = []
    placeholders: list[int] = []
    placeholder_seq_ids: list = []
    for row_index, row in enumerate(output.scheduled):
        if PLACEHOLDER in row.new_token_ids:  # only under async scheduling
            for offset, token in enumerate(row.new_token_ids):
                if token == PLACEHOLDER:
                    placeholders.append(len(input_ids) + offset)
                    placeholder_seq_ids.append(row.seq_id)
            input_ids.extend(0 if t == PLACEHOLDER else t for t in row.new_token_ids)
        else:
            input_ids.extend(row.new_token_ids)
        positions.extend(row.positions)
        slots.extend(
            slot_mapping(
                row.block_table, row.num_computed_tokens, row.context_len, output.block_size
            )
        )
        if row.samples_token:
            # The hidden state of the row's last new token predicts the next token.
            logits_indices.append(len(input_ids) - 1)
            sampling_rows.append(row_index)
    return ModelInputs(
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slots,
        query_lens=[row.num_new_tokens for row in output.scheduled],
        seq_lens=[row.context_len for row in output.scheduled],
        block_tables=[list(row.block_table) for row in output.scheduled],
        logits_indices=logits_indices,
        sampling_rows=sampling_rows,
        uniform_decode=output.is_uniform_decode,
        placeholder_tokens=placeholders,
        placeholder_seq_ids=placeholder_seq_ids,
    )


# ANCHOR_END: prepare_inputs


# ANCHOR: pad_inputs
def pad_inputs(inputs: ModelInputs, num_tokens: int) -> ModelInputs:
    """Pad to `num_tokens` tokens (a captured graph's size) so padding does no harm.

    Padded tokens: id 0, position 0, slot -1 (their K/V is written nowhere that
    matters). For a uniform-decode batch each padded token is a padded row of its own
    with sequence length 0 (a FULL graph was captured for that many rows); for a
    mixed batch the rows stay as they are and only the token arrays grow (a piecewise
    graph's pieces see only tokens; attention runs eagerly on the real rows).
    Sampling is untouched: padded tokens are never sampled from.
    """
    extra = num_tokens - inputs.num_tokens
    if extra < 0:
        raise ValueError(f"cannot pad {inputs.num_tokens} tokens down to {num_tokens}")
    if extra == 0:
        return replace(inputs, num_real_tokens=inputs.num_tokens)
    padded = replace(
        inputs,
        input_ids=inputs.input_ids + [0] * extra,
        positions=inputs.positions + [0] * extra,
        slot_mapping=inputs.slot_mapping + [PAD_SLOT_ID] * extra,
        num_real_tokens=inputs.num_tokens,
    )
    if inputs.uniform_decode:
        padded = replace(
            padded,
            query_lens=inputs.query_lens + [1] * extra,
            seq_lens=inputs.seq_lens + [0] * extra,
            block_tables=inputs.block_tables + [[] for _ in range(extra)],
        )
    return padded


# ANCHOR_END: pad_inputs
