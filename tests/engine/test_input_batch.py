"""The array-built step inputs (mini_vllm/engine/input_batch.py) equal the readable ones.

`prepare_inputs` and `pad_inputs` (mini_vllm/engine/model_inputs.py, Phase 04's lab) build
a step's inputs as lists, a row and a token at a time; `ModelRunner._copy_in` writes them
into the host buffer. `gather_step` and `write_step` build the same with numpy. Every step
of real engine runs (chunked prefills, decodes, preemption and recompute, prefix hits,
async placeholders) is replayed through both, padded as the dispatcher would and further,
and the buffers must agree entry by entry.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from mini_vllm import LLM, SamplingParams
from mini_vllm.engine.input_batch import gather_step, write_step
from mini_vllm.engine.model_inputs import pad_inputs, prepare_inputs

NUM_TOKENS, MAX_BLOCKS, BLOCK = 64, 20, 4


def recorded_steps(**engine_options) -> list:
    """The SchedulerOutput of every step of a busy run (with preemption)."""
    llm = LLM(
        "tiny",
        max_num_seqs=8,
        max_model_len=64,
        block_size=BLOCK,
        num_kv_blocks=24,
        max_num_batched_tokens=NUM_TOKENS,
        **engine_options,
    )
    outputs = []
    runner = llm.engine.runner
    execute = runner.execute_model

    def record(output, *args, **kwargs):
        outputs.append(output)
        return execute(output, *args, **kwargs)

    runner.execute_model = record
    rng = random.Random(1)
    shared = [rng.randrange(256) for _ in range(12)]  # a common prefix: prefix-cache hits
    prompts = [
        (shared if i % 2 else []) + [rng.randrange(256) for _ in range(rng.randint(1, 40))]
        for i in range(20)
    ]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)
    assert llm.stats.num_preemptions > 0, "the run was meant to preempt"
    return outputs


def empty_buffers() -> dict[str, np.ndarray]:
    fill = -7  # any value the writers would never leave in a place they own
    return {
        "input_ids": np.full(NUM_TOKENS, fill),
        "positions": np.full(NUM_TOKENS, fill),
        "slot_mapping": np.full(NUM_TOKENS, fill),
        "seq_lens": np.full(NUM_TOKENS, fill),
        "query_start_loc": np.full(NUM_TOKENS + 1, fill),
        "block_tables": np.full((NUM_TOKENS, MAX_BLOCKS), fill),
    }


def check_step(output, num_padded: int) -> None:
    reference = pad_inputs(prepare_inputs(output), num_padded)
    buffers = empty_buffers()
    written = write_step(gather_step(output), num_padded, buffers, BLOCK)
    n, reqs = reference.num_tokens, reference.num_reqs
    assert (written.num_tokens, written.num_reqs) == (n, reqs)
    assert buffers["input_ids"][:n].tolist() == reference.input_ids
    assert buffers["positions"][:n].tolist() == reference.positions
    assert buffers["slot_mapping"][:n].tolist() == reference.slot_mapping
    assert buffers["seq_lens"][:reqs].tolist() == reference.seq_lens
    assert buffers["query_start_loc"][: reqs + 1].tolist() == reference.query_start_loc
    for row, table in enumerate(reference.block_tables):
        assert buffers["block_tables"][row, : len(table)].tolist() == table
    assert written.query_lens.tolist() == reference.query_lens
    assert written.logits_indices.tolist() == reference.logits_indices
    assert written.sampling_rows.tolist() == reference.sampling_rows
    assert written.placeholder_tokens.tolist() == reference.placeholder_tokens
    seq_ids = [output.scheduled[row].seq_id for row in written.placeholder_rows]
    assert seq_ids == reference.placeholder_seq_ids


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_array_built_inputs_equal_the_list_built_ones_on_every_step(async_scheduling):
    outputs = recorded_steps(enable_prefix_caching=True, async_scheduling=async_scheduling)
    kinds = {output.is_uniform_decode for output in outputs}
    assert kinds == {True, False}, "the run should have both decode and mixed steps"
    if async_scheduling:
        assert any(prepare_inputs(o).placeholder_tokens for o in outputs)
    for output in outputs:
        tokens = output.total_num_tokens
        for num_padded in {tokens, min(NUM_TOKENS, tokens + 3)}:
            check_step(output, num_padded)
