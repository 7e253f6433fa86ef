"""Phase 04, lab 01 — the model runner's inputs: flattening a scheduled batch, and the
padding rules.

Every batch here comes from the real scheduler (mini_vllm's `Scheduler` over its
`BlockManager`), so the rows look exactly as they do in the engine: decodes first,
new prefills after, chunks that stop short of the prompt's end, preemptions. The
expected slots are computed in this file from each row's block table, independently
of your code.
"""

import pytest

import mini_vllm.engine.model_inputs as reference
from labkit import implementation
from labpredict import check_predictions
from mini_vllm.engine.block_manager import BlockManager
from mini_vllm.engine.scheduler import Scheduler, SchedulerConfig
from mini_vllm.engine.sequence import Sequence
from mini_vllm.sampling_params import SamplingParams

impl = implementation(
    __file__, starter="model_inputs.py", reference="mini_vllm.engine.model_inputs"
)
answers = implementation(
    __file__, starter="predictions.py", reference="tests.course.lab_checks.phase04_lab01_answers"
)

BLOCK = 4


def slot(table, position, block_size=BLOCK):
    """Where a position's K/V lives, computed here, not by the code under test."""
    return table[position // block_size] * block_size + position % block_size


def make_scheduler(num_blocks=32, **config):
    config.setdefault("max_model_len", 64)
    return Scheduler(SchedulerConfig(**config), BlockManager(num_blocks, BLOCK))


def request(seq_id, prompt, max_tokens=8):
    return Sequence(seq_id, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def apply(scheduler, out, token=99):
    """Finish a step: every row that samples gets `token`."""
    scheduler.update_from_output(
        out, [token if row.samples_token else None for row in out.scheduled]
    )


def expected_slots(out):
    return [
        slot(row.block_table, p)
        for row in out.scheduled
        for p in range(row.num_computed_tokens, row.context_len)
    ]


def readme_scenario(prepare):
    """The README's scenario, its steps S1 to S4 as (scheduler output, `prepare(out)`).

    Block size 4, max_num_seqs 2, a budget of 6 tokens; `a` (prompt 1..5) is prefilled
    alone and samples 99; then `b` (prompt 10..20) arrives. `a` samples 90, 91, 92, 93
    in S1 to S4; `b` samples 50 in S3 and 51 in S4."""
    sched = make_scheduler(max_num_seqs=2, max_num_batched_tokens=6)
    sched.add_request(request("a", [1, 2, 3, 4, 5]))
    apply(sched, sched.schedule(), token=99)
    sched.add_request(request("b", list(range(10, 21))))
    steps = []
    for a_token, b_token in ((90, None), (91, None), (92, 50), (93, 51)):
        out = sched.schedule()
        steps.append((out, prepare(out)))
        tokens = {"a": a_token, "b": b_token}
        sampled = [tokens[row.seq_id] if row.samples_token else None for row in out.scheduled]
        sched.update_from_output(out, sampled)
    return steps


# -- query_start_loc -----------------------------------------------------------------


@pytest.mark.step1
def test_query_start_loc_is_the_running_sum_of_query_lengths():
    inputs = impl.ModelInputs(
        input_ids=[5, 6, 7, 8, 9, 10],
        positions=[4, 0, 1, 2, 7, 8],
        slot_mapping=[0, 1, 2, 3, 4, 5],
        query_lens=[1, 3, 2],
        seq_lens=[5, 3, 9],
        block_tables=[[0, 1], [2], [3, 4, 5]],
        logits_indices=[0, 3, 5],
        sampling_rows=[0, 1, 2],
        uniform_decode=False,
    )
    assert inputs.query_start_loc == [0, 1, 4, 6]
    assert inputs.query_lens == [1, 3, 2], "reading query_start_loc changed the inputs"


@pytest.mark.step1
def test_query_start_loc_of_no_rows_is_a_single_zero():
    inputs = impl.ModelInputs(
        input_ids=[],
        positions=[],
        slot_mapping=[],
        query_lens=[],
        seq_lens=[],
        block_tables=[],
        logits_indices=[],
        sampling_rows=[],
        uniform_decode=False,
    )
    assert inputs.query_start_loc == [0]


# -- flattening ----------------------------------------------------------------------


@pytest.mark.step2
def test_your_step2_predictions_match_what_the_reference_computes():
    (_, s1), (_, s2), (_, s3), (_, s4) = readme_scenario(reference.prepare_inputs)
    check_predictions(
        answers,
        {
            "S2_POSITIONS": s2.positions,
            "S2_SLOT_MAPPING": s2.slot_mapping,
            "S3_LOGITS_INDICES": s3.logits_indices,
            "S3_UNIFORM_DECODE": s3.uniform_decode,
            "S4_SLOT_MAPPING": s4.slot_mapping,
        },
    )


@pytest.mark.step2
def test_prefill_batch_lays_the_prompts_end_to_end():
    sched = make_scheduler(max_num_seqs=4, max_num_batched_tokens=32)
    a, b = request("a", [10, 11, 12, 13, 14]), request("b", [20, 21, 22])
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()
    inputs = impl.prepare_inputs(out)
    assert inputs.input_ids == [10, 11, 12, 13, 14, 20, 21, 22]
    assert inputs.positions == [0, 1, 2, 3, 4, 0, 1, 2]
    assert inputs.query_lens == [5, 3] and inputs.seq_lens == [5, 3]
    assert inputs.block_tables == [list(a.block_table), list(b.block_table)]
    assert inputs.query_start_loc == [0, 5, 8]
    assert inputs.num_tokens == 8 and inputs.num_reqs == 2 and inputs.num_real_tokens == -1


@pytest.mark.step2
def test_mixed_batch_has_the_decode_rows_first_then_the_new_prompt():
    sched = make_scheduler(max_num_seqs=4, max_num_batched_tokens=32)
    sched.add_request(request("a", [10, 11, 12, 13, 14]))
    sched.add_request(request("b", [20, 21, 22]))
    apply(sched, sched.schedule(), token=99)  # both prefill, both sample 99
    sched.add_request(request("c", [30, 31, 32, 33, 34, 35]))
    out = sched.schedule()  # a and b decode the 99 they sampled, c prefills
    inputs = impl.prepare_inputs(out)
    assert inputs.input_ids == [99, 99, 30, 31, 32, 33, 34, 35]
    assert inputs.positions == [5, 3, 0, 1, 2, 3, 4, 5]
    assert inputs.query_lens == [1, 1, 6] and inputs.seq_lens == [6, 4, 6]
    assert inputs.query_start_loc == [0, 1, 2, 8]
    assert inputs.logits_indices == [0, 1, 7] and inputs.sampling_rows == [0, 1, 2]
    assert inputs.uniform_decode is False


@pytest.mark.step2
def test_slot_mapping_is_block_id_times_block_size_plus_offset():
    # An empty cache hands out blocks 0, 1, 2, ... in order: a (5 tokens) gets
    # blocks [0, 1], b (3 tokens) gets [2].
    sched = make_scheduler(max_num_seqs=4, max_num_batched_tokens=32)
    sched.add_request(request("a", [10, 11, 12, 13, 14]))
    sched.add_request(request("b", [20, 21, 22]))
    out = sched.schedule()
    assert [list(row.block_table) for row in out.scheduled] == [[0, 1], [2]]
    assert impl.prepare_inputs(out).slot_mapping == [0, 1, 2, 3, 4, 8, 9, 10]


@pytest.mark.step2
def test_slot_mapping_follows_every_rows_block_table_across_block_boundaries():
    # Block size 4: decoding crosses block boundaries, the 4-token budget chunks
    # prompts, and 7 blocks force preemptions. Every step's slots must match the
    # block tables.
    sched = make_scheduler(num_blocks=7, max_num_seqs=3, max_num_batched_tokens=6)
    for i, length in enumerate((5, 9, 3, 7)):
        sched.add_request(request(i, [(7 * i + k) % 50 + 1 for k in range(length)], max_tokens=6))
    steps = 0
    while sched.has_unfinished_requests():
        out = sched.schedule()
        if not out.is_empty:
            inputs = impl.prepare_inputs(out)
            assert inputs.slot_mapping == expected_slots(out), f"step {out.step}: {out}"
            assert len(set(inputs.slot_mapping)) == len(inputs.slot_mapping), (
                "two tokens share a slot"
            )
        apply(sched, out, token=1 + out.step % 40)
        steps += 1
        assert steps < 500
    assert sched.num_preemptions > 0


@pytest.mark.step2
def test_chunked_prompt_samples_only_in_its_last_chunk():
    sched = make_scheduler(max_num_seqs=4, max_num_batched_tokens=8)
    sched.add_request(request("a", [1, 2, 3]))
    apply(sched, sched.schedule(), token=40)
    sched.add_request(request("b", list(range(10, 20))))  # 10 tokens, only 7 fit beside a's decode
    first = impl.prepare_inputs(out := sched.schedule())
    assert first.input_ids == [40, 10, 11, 12, 13, 14, 15, 16]
    assert first.positions == [3, 0, 1, 2, 3, 4, 5, 6]
    assert first.query_lens == [1, 7] and first.seq_lens == [4, 7]
    assert first.logits_indices == [0] and first.sampling_rows == [0], (
        "a chunk short of the prompt's end samples nothing"
    )
    apply(sched, out, token=41)
    second = impl.prepare_inputs(sched.schedule())
    assert second.input_ids == [41, 17, 18, 19]
    assert second.positions == [4, 7, 8, 9]
    assert second.query_lens == [1, 3] and second.seq_lens == [5, 10]
    assert second.logits_indices == [0, 3] and second.sampling_rows == [0, 1]


@pytest.mark.step2
def test_uniform_flag_is_set_only_when_every_row_decodes_one_token():
    sched = make_scheduler(max_num_seqs=4, max_num_batched_tokens=32)
    sched.add_request(request("a", [1, 2, 3, 4], max_tokens=4))
    sched.add_request(request("b", [5, 6], max_tokens=4))
    flags = []
    for step in range(4):
        if step == 2:
            sched.add_request(request("c", [7, 8, 9], max_tokens=4))
        out = sched.schedule()
        flags.append(impl.prepare_inputs(out).uniform_decode)
        apply(sched, out)
    # prefill, decode, decode + c's prefill, decode
    assert flags == [False, True, False, True]


@pytest.mark.step2
def test_a_one_token_prompt_is_a_prefill_not_a_uniform_decode():
    sched = make_scheduler(max_num_seqs=4, max_num_batched_tokens=32)
    sched.add_request(request("a", [1, 2, 3, 4]))
    apply(sched, sched.schedule())
    sched.add_request(request("b", [7]))
    inputs = impl.prepare_inputs(sched.schedule())
    assert inputs.query_lens == [1, 1]
    assert inputs.uniform_decode is False


@pytest.mark.step2
def test_empty_batch_gives_empty_inputs():
    inputs = impl.prepare_inputs(
        make_scheduler(max_num_seqs=2, max_num_batched_tokens=8).schedule()
    )
    assert inputs.num_tokens == 0 and inputs.num_reqs == 0
    assert inputs.logits_indices == [] and inputs.block_tables == []
    assert inputs.uniform_decode is False


@pytest.mark.step2
def test_inputs_come_from_the_scheduled_snapshot_not_the_live_request():
    # `a` finishes in this very step (max_tokens=1): applying the step frees its blocks
    # and moves its counters on. The batch that was scheduled must not change.
    sched = make_scheduler(max_num_seqs=2, max_num_batched_tokens=16)
    a = request("a", [3, 4, 5, 6, 7], max_tokens=1)
    sched.add_request(a)
    out = sched.schedule()
    before = impl.prepare_inputs(out)
    apply(sched, out)
    assert a.block_table == [] and a.num_computed_tokens == 5
    after = impl.prepare_inputs(out)
    assert after == before
    assert after.positions == [0, 1, 2, 3, 4] and after.block_tables == [[0, 1]]


# -- padding -------------------------------------------------------------------------


def decode_batch():
    """Three requests, all decoding: a uniform-decode batch of 3 tokens."""
    sched = make_scheduler(max_num_seqs=4, max_num_batched_tokens=32)
    for i, prompt in enumerate(([1, 2, 3, 4, 5], [6, 7], [8, 9, 10])):
        sched.add_request(request(i, prompt))
    apply(sched, sched.schedule(), token=50)
    out = sched.schedule()
    assert out.is_uniform_decode
    return impl.prepare_inputs(out)


def mixed_batch():
    """One decode row and one prefill row: 4 tokens, 2 rows, not uniform."""
    sched = make_scheduler(max_num_seqs=4, max_num_batched_tokens=32)
    sched.add_request(request("a", [1, 2, 3, 4, 5]))
    apply(sched, sched.schedule(), token=50)
    sched.add_request(request("b", [6, 7, 8]))
    return impl.prepare_inputs(sched.schedule())


def one_token_prompts():
    """Two fresh one-token prompts: every query length is 1, and both rows are prefills."""
    sched = make_scheduler(max_num_seqs=4, max_num_batched_tokens=32)
    sched.add_request(request("a", [7]))
    sched.add_request(request("b", [8]))
    return impl.prepare_inputs(sched.schedule())


BATCHES = [decode_batch, mixed_batch, one_token_prompts]
BATCH_IDS = ["uniform", "mixed", "one-token-prompts"]


@pytest.mark.step3
def test_your_step3_predictions_match_what_the_reference_computes():
    steps = readme_scenario(reference.prepare_inputs)
    s3, s4 = steps[2][1], steps[3][1]
    padded3, padded4 = reference.pad_inputs(s3, 4), reference.pad_inputs(s4, 4)
    check_predictions(
        answers,
        {
            "S3_PADDED_NUM_REQS": padded3.num_reqs,
            "S4_PADDED_NUM_REQS": padded4.num_reqs,
            "S4_PADDED_SEQ_LENS": padded4.seq_lens,
        },
    )


@pytest.mark.step3
def test_padding_a_uniform_decode_batch_gives_each_padded_token_a_decode_row():
    inputs = decode_batch()
    padded = impl.pad_inputs(inputs, 4)
    assert padded.num_tokens == 4 and padded.num_real_tokens == 3
    assert padded.input_ids[:3] == inputs.input_ids
    assert padded.positions[:3] == inputs.positions
    # A FULL graph captured for 4 decode rows: the padded token is a row of its own, and
    # every token belongs to exactly one row.
    assert padded.num_reqs == 4, "a FULL decode graph for 4 tokens was captured with 4 rows"
    assert padded.query_start_loc == [0, 1, 2, 3, 4], (
        "each row of a decode graph feeds one token: the padded row too"
    )
    assert padded.seq_lens[:3] == inputs.seq_lens
    assert len(padded.block_tables) == 4 and padded.block_tables[:3] == inputs.block_tables
    assert padded.uniform_decode is True


@pytest.mark.step3
@pytest.mark.parametrize("batch", BATCHES, ids=BATCH_IDS)
def test_a_padded_token_writes_no_kv_where_a_request_keeps_its_own(batch):
    inputs = batch()
    padded = impl.pad_inputs(inputs, 8)
    assert padded.slot_mapping[: inputs.num_tokens] == inputs.slot_mapping
    for i, where in enumerate(padded.slot_mapping[inputs.num_tokens :], inputs.num_tokens):
        assert where == impl.PAD_SLOT_ID, (
            f"padded token {i} writes its K/V to slot {where}: that is offset "
            f"{where % BLOCK} of block {where // BLOCK}, which a request may hold. "
            "Which slot does the KV write skip?"
        )


@pytest.mark.step3
def test_a_padded_decode_row_reads_no_kv():
    inputs = decode_batch()
    padded = impl.pad_inputs(inputs, 8)
    for r in range(inputs.num_reqs, padded.num_reqs):
        assert padded.seq_lens[r] == 0, (
            f"padded row {r} has sequence length {padded.seq_lens[r]}: attention would "
            f"read that many keys through its block table {padded.block_tables[r]}"
        )


@pytest.mark.step3
@pytest.mark.parametrize("batch", BATCHES, ids=BATCH_IDS)
def test_padded_tokens_carry_an_id_and_a_position_the_model_can_embed(batch):
    inputs = batch()
    padded = impl.pad_inputs(inputs, 8)
    highest = max(inputs.positions)
    for i in range(inputs.num_tokens, 8):
        token, position = padded.input_ids[i], padded.positions[i]
        assert isinstance(token, int) and token >= 0, (
            f"padded token {i} has id {token}: the embedding looks every id up, padded or not"
        )
        assert isinstance(position, int) and 0 <= position <= highest, (
            f"padded token {i} has position {position}: RoPE looks every position up"
        )


@pytest.mark.step3
def test_padding_a_mixed_batch_pads_tokens_only():
    inputs = mixed_batch()
    padded = impl.pad_inputs(inputs, 8)
    assert padded.num_tokens == 8 and padded.num_real_tokens == 4
    assert padded.input_ids[:4] == inputs.input_ids and padded.positions[:4] == inputs.positions
    # The rows are untouched: attention runs eagerly on the real rows only.
    assert padded.num_reqs == 2, "a piecewise graph sees tokens; attention sees the real rows"
    assert (padded.query_lens, padded.seq_lens, padded.block_tables) == (
        inputs.query_lens,
        inputs.seq_lens,
        inputs.block_tables,
    )
    assert padded.uniform_decode is False


@pytest.mark.step3
def test_a_batch_of_one_token_prompts_is_padded_like_a_mixed_batch():
    # Every query length is 1, yet both rows are prefills: the batch runs piecewise, and a
    # FULL decode graph never serves it.
    inputs = one_token_prompts()
    assert inputs.query_lens == [1, 1] and inputs.uniform_decode is False
    padded = impl.pad_inputs(inputs, 4)
    assert padded.num_reqs == 2, "rows were added to a batch that is not a uniform decode"
    assert padded.seq_lens == [1, 1] and padded.uniform_decode is False


@pytest.mark.step3
@pytest.mark.parametrize("batch", BATCHES, ids=BATCH_IDS)
def test_padded_tokens_are_never_sampled(batch):
    inputs = batch()
    padded = impl.pad_inputs(inputs, 16)
    assert padded.logits_indices == inputs.logits_indices
    assert padded.sampling_rows == inputs.sampling_rows
    assert all(i < padded.num_real_tokens for i in padded.logits_indices)


@pytest.mark.step3
def test_padding_to_the_batch_own_size_changes_nothing_but_records_the_real_count():
    inputs = mixed_batch()
    padded = impl.pad_inputs(inputs, inputs.num_tokens)
    assert padded.num_real_tokens == inputs.num_tokens == 4
    assert padded.input_ids == inputs.input_ids and padded.slot_mapping == inputs.slot_mapping
    assert padded.query_lens == inputs.query_lens


@pytest.mark.step3
def test_padding_below_the_batch_size_is_an_error():
    with pytest.raises(ValueError):
        impl.pad_inputs(mixed_batch(), 3)


@pytest.mark.step3
@pytest.mark.parametrize("batch", BATCHES, ids=BATCH_IDS)
def test_padding_returns_new_inputs_and_leaves_the_original_alone(batch):
    inputs = batch()
    snapshot = (
        list(inputs.input_ids),
        list(inputs.positions),
        list(inputs.slot_mapping),
        list(inputs.query_lens),
        list(inputs.seq_lens),
        [list(t) for t in inputs.block_tables],
    )
    impl.pad_inputs(inputs, 8)
    assert (
        inputs.input_ids,
        inputs.positions,
        inputs.slot_mapping,
        inputs.query_lens,
        inputs.seq_lens,
        inputs.block_tables,
    ) == snapshot
    assert inputs.num_real_tokens == -1


# -- a whole run ---------------------------------------------------------------------

VOCAB = 50
LADDER = (1, 2, 4, 8, 16, 32)  # capture sizes; a batch above 32 tokens runs unpadded


def next_token(context):
    h = 7
    for t in context:
        h = (h * 1_000_003 + t + 1) % (2**61 - 1)
    return 1 + h % (VOCAB - 1)


class FakeModel:
    """Uses only the ModelInputs. It writes each token's id into a fake KV cache
    through the slot mapping (a -1 slot goes to a scratch list nobody reads), reads
    each row's context back through its block table and sequence length, and
    "samples" a fixed function of the context up to each logits index's position.
    Its row boundaries are its own running sum of the query lengths, not your
    query_start_loc, so a bug there cannot hide one here."""

    def __init__(self, num_blocks):
        self.kv = [None] * (num_blocks * BLOCK)
        self.scratch = []

    def forward(self, inputs):
        for token, where in zip(inputs.input_ids, inputs.slot_mapping):
            if where == -1:
                self.scratch.append(token)
            else:
                self.kv[where] = token
        starts = [0]
        for q in inputs.query_lens:
            starts.append(starts[-1] + q)
        contexts, row_of_token = [], {}
        for r, (seq_len, table) in enumerate(zip(inputs.seq_lens, inputs.block_tables)):
            assert seq_len <= len(table) * BLOCK, (
                f"row {r} reads {seq_len} keys through a block table of {len(table)} blocks"
            )
            contexts.append([self.kv[slot(table, p)] for p in range(seq_len)])
            row_of_token.update(dict.fromkeys(range(starts[r], starts[r + 1]), r))
        sampled = [
            next_token(contexts[row_of_token[j]][: inputs.positions[j] + 1])
            for j in inputs.logits_indices
        ]
        return contexts, sampled


@pytest.mark.step3
def test_a_whole_padded_run_through_the_scheduler_keeps_every_kv_cache_intact():
    num_blocks = 12
    sched = make_scheduler(num_blocks=num_blocks, max_num_seqs=4, max_num_batched_tokens=10)
    model = FakeModel(num_blocks)
    prompts = [
        [(5 * i + 3 * k) % (VOCAB - 1) + 1 for k in range(n)]
        for i, n in enumerate((6, 14, 3, 9, 5, 11))
    ]
    requests = [request(i, p, max_tokens=10) for i, p in enumerate(prompts)]
    for seq in requests:
        sched.add_request(seq)
    padded_rows = 0
    while sched.has_unfinished_requests():
        out = sched.schedule()
        assert out.step < 500, "no progress"
        if out.is_empty:
            apply(sched, out)
            continue
        inputs = impl.prepare_inputs(out)
        rung = next((size for size in LADDER if size >= inputs.num_tokens), inputs.num_tokens)
        padded = impl.pad_inputs(inputs, rung)
        padded_rows += padded.num_reqs - inputs.num_reqs
        contexts, tokens = model.forward(padded)
        for r, row in enumerate(out.scheduled):
            assert contexts[r] == row.seq.tokens(0, row.context_len), (
                f"step {out.step}: the KV cache of request {row.seq_id} is corrupt"
            )
        sampled = [None] * out.num_reqs
        for r, token in zip(padded.sampling_rows, tokens):
            sampled[r] = token
        sched.update_from_output(out, sampled)
    assert sched.num_preemptions > 0 and padded_rows > 0  # the run exercised both
    for seq, prompt in zip(requests, prompts):
        alone = list(prompt)
        for _ in range(10):
            alone.append(next_token(alone))
        assert list(seq.token_ids) == alone, f"request {seq.seq_id} differs from its run alone"
