"""The scheduler (Phase 03) driven by a fake paged model.

`FakePagedModel` stands in for the model runner and the model. It uses only the
SchedulerOutput: it writes each new token into a fake KV cache through the slot
mapping, reads every row's context back through its block table, and "predicts"
the next token as a fixed function of that context. A wrong slot, a block handed
out twice, or a bad recompute after preemption therefore changes the generated
tokens, and every test compares them with the tokens the request gets alone.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mini_vllm.engine.block_manager import BlockManager, slot_mapping, slot_of
from mini_vllm.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from mini_vllm.engine.sequence import FinishReason, Sequence, SequenceStatus
from mini_vllm.sampling_params import SamplingParams

VOCAB = 24
EOS = 0


def next_token(context: list[int]) -> int:
    """The fake model: a rolling hash of the whole context (EOS about 1 time in 24)."""
    h = 7
    for t in context:
        h = (h * 1_000_003 + t + 1) % (2**61 - 1)
    return h % VOCAB


def alone(prompt, params: SamplingParams, *, max_model_len: int, num_blocks: int, block_size: int):
    """(output tokens, finish reason) of a request run by itself on the same limits."""
    blocks = lambda n: -(-n // block_size)  # noqa: E731
    if len(prompt) >= max_model_len or blocks(len(prompt)) > num_blocks:
        return [], FinishReason.ERROR
    tokens, out = list(prompt), []
    while True:
        token = next_token(tokens)
        tokens.append(token)
        out.append(token)
        if token == EOS and not params.ignore_eos:
            return out, FinishReason.STOP
        if len(out) >= params.max_tokens or len(tokens) >= max_model_len:
            return out, FinishReason.LENGTH
        if blocks(len(tokens)) > num_blocks:  # its next token's K/V would not fit anywhere
            return out, FinishReason.ERROR


class FakePagedModel:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.kv: list[tuple[int, int] | None] = [None] * (num_blocks * block_size)

    def forward(self, output: SchedulerOutput) -> list[int | None]:
        bs = output.block_size
        written: set[int] = set()
        for row in output.scheduled:  # the KV write of every layer
            slots = slot_mapping(row.block_table, row.num_computed_tokens, row.context_len, bs)
            for token, position, slot in zip(row.new_token_ids, row.positions, slots):
                assert slot not in written, f"two tokens of one step write slot {slot}"
                written.add(slot)
                self.kv[slot] = (token, position)
        sampled: list[int | None] = []
        for row in output.scheduled:  # attention reads the whole context through the block table
            context = [self.kv[slot_of(row.block_table, p, bs)] for p in range(row.context_len)]
            assert [pos for _, pos in context] == list(range(row.context_len))
            tokens = [tok for tok, _ in context]
            assert tokens == row.seq.tokens(0, row.context_len), f"KV of {row.seq_id!r} is corrupt"
            sampled.append(next_token(tokens) if row.samples_token else None)
        return sampled


def make(
    num_blocks=64, block_size=4, *, caching=False, eos=EOS, **config
) -> tuple[Scheduler, FakePagedModel]:
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching)
    return Scheduler(SchedulerConfig(**config), bm, eos_token_id=eos), FakePagedModel(
        num_blocks, block_size
    )


def check_output(sched: Scheduler, out: SchedulerOutput, was_running: set[int]) -> None:
    """Invariants of one step, checked before update_from_output advances anything.
    `was_running` holds id() of the requests that were running before schedule()."""
    cfg = sched.config
    admitted = [id(r.seq) not in was_running for r in out.scheduled]
    assert admitted == sorted(admitted), "rows: running requests first, then the newly admitted"
    if out.preempted_ids:
        assert not any(admitted), "a request was admitted in a step that had to preempt"
    assert out.total_num_tokens <= cfg.max_num_batched_tokens
    assert out.num_reqs <= cfg.max_num_seqs
    assert len(set(out.seq_ids)) == out.num_reqs, "a request scheduled twice in one step"
    for row in out.scheduled:
        seq = row.seq
        assert seq.status is SequenceStatus.RUNNING
        assert row.num_new_tokens >= 1 and len(row.new_token_ids) == row.num_new_tokens
        assert row.num_computed_tokens == seq.num_computed_tokens
        assert len(row.block_table) == sched.block_manager.blocks_needed(row.context_len)
        assert row.is_prefill == (
            row.num_computed_tokens < max(seq.num_prompt_tokens, seq.num_tokens - 1)
        )
        assert row.samples_token == (row.context_len == seq.num_tokens)
        if not cfg.enable_chunked_prefill and row.is_prefill:
            assert row.samples_token, "a prompt was chunked although chunked prefill is off"
    uniform = bool(out.scheduled) and all(
        r.num_new_tokens == 1 and not r.is_prefill for r in out.scheduled
    )
    assert out.is_uniform_decode == uniform


def drive(sched: Scheduler, model: FakePagedModel, requests, arrivals=None, max_steps=3000):
    """Run to completion; requests[i] is added at step arrivals[i] (default: all at 0)."""
    arrivals = arrivals or [0] * len(requests)
    pending = sorted(zip(arrivals, range(len(requests))), reverse=True)
    finished: list[Sequence] = []
    outputs: list[SchedulerOutput] = []
    step = 0
    while pending or sched.has_unfinished_requests():
        while pending and pending[-1][0] <= step:
            sched.add_request(requests[pending.pop()[1]])
        was_running = {id(s) for s in requests if s.status is SequenceStatus.RUNNING}
        out = sched.schedule()
        check_output(sched, out, was_running)
        finished += sched.update_from_output(out, model.forward(out))
        outputs.append(out)
        step += 1
        assert step < max_steps, f"no end in sight: {sched!r}"
    return finished, outputs


def assert_all_done_as_if_alone(sched: Scheduler, requests, finished) -> None:
    bm = sched.block_manager
    assert sorted(map(id, finished)) == sorted(map(id, requests)), (
        "a request was lost or reported twice"
    )
    for seq in requests:
        expected = alone(
            seq.prompt_token_ids,
            seq.sampling_params,
            max_model_len=sched.config.max_model_len,
            num_blocks=bm.num_blocks,
            block_size=bm.block_size,
        )
        assert (list(seq.output_token_ids), seq.finish_reason) == expected, seq
        assert seq.is_finished and seq.block_table == []
        assert (seq.error is not None) == (seq.finish_reason is FinishReason.ERROR)
    assert bm.num_free_blocks == bm.num_blocks and bm.num_used_blocks == 0
    assert sched.get_request_counts() == (0, 0)


def req(seq_id, prompt_len, max_tokens=8, ignore_eos=True, offset=0):
    prompt = [(offset + 3 * i + 1) % VOCAB or 1 for i in range(prompt_len)]
    return Sequence(seq_id, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos))


# -- batches ----------------------------------------------------------------------


def test_budget_and_max_num_seqs_are_never_exceeded():
    sched, model = make(max_num_seqs=3, max_num_batched_tokens=10, max_model_len=64)
    requests = [req(i, 3 + 2 * i, max_tokens=5, offset=i) for i in range(8)]
    finished, outputs = drive(sched, model, requests)  # check_output asserts the limits
    assert max(o.num_reqs for o in outputs) == 3
    assert max(o.total_num_tokens for o in outputs) == 10
    assert_all_done_as_if_alone(sched, requests, finished)


def test_prefill_step_is_mixed_and_the_decode_steps_after_it_are_uniform():
    sched, model = make(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    requests = [req(i, 5, max_tokens=4, offset=i) for i in range(3)]
    finished, outputs = drive(sched, model, requests)
    assert not outputs[0].is_uniform_decode and outputs[0].num_prefills == 3
    assert outputs[0].total_num_tokens == 15
    for out in outputs[1:]:
        assert out.is_uniform_decode
        assert (out.num_reqs, out.total_num_tokens, out.max_query_len) == (3, 3, 1)
    assert len(outputs) == 4
    assert_all_done_as_if_alone(sched, requests, finished)


def test_request_joining_running_decodes_makes_the_batch_mixed_with_decodes_first():
    sched, model = make(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    requests = [req("a", 4), req("b", 4), req("late", 6)]
    _, outputs = drive(sched, model, requests, arrivals=[0, 0, 2])
    assert outputs[1].is_uniform_decode
    joined = outputs[2]
    assert not joined.is_uniform_decode
    assert joined.seq_ids == ("a", "b", "late")
    assert [r.num_new_tokens for r in joined.scheduled] == [1, 1, 6]
    assert (joined.num_decodes, joined.num_prefills) == (2, 1)
    assert outputs[3].is_uniform_decode and outputs[3].num_reqs == 3


def test_one_token_prompt_is_a_prefill_so_its_batch_is_mixed():
    sched, model = make(max_num_batched_tokens=16, max_model_len=64)
    _, outputs = drive(sched, model, [req("a", 1, max_tokens=2)])
    assert outputs[0].num_reqs == 1 and outputs[0].total_num_tokens == 1
    assert not outputs[0].is_uniform_decode
    assert outputs[1].is_uniform_decode


def test_the_output_alone_gives_the_flat_inputs_of_the_forward():
    sched, _ = make(num_blocks=8, block_size=4, max_num_batched_tokens=16, max_model_len=64)
    sched.add_request(Sequence("a", [5, 6, 7, 8, 9], SamplingParams(max_tokens=3)))
    out = sched.schedule()
    sched.update_from_output(out, [11])
    sched.add_request(Sequence("b", [1, 2, 3], SamplingParams(max_tokens=3)))
    out = sched.schedule()
    input_ids = [t for r in out.scheduled for t in r.new_token_ids]
    positions = [p for r in out.scheduled for p in r.positions]
    slots = [
        s
        for r in out.scheduled
        for s in slot_mapping(r.block_table, r.num_computed_tokens, r.context_len, 4)
    ]
    a_blocks, b_blocks = (r.block_table for r in out.scheduled)
    assert input_ids == [11, 1, 2, 3]
    assert positions == [5, 0, 1, 2]
    assert slots == [a_blocks[1] * 4 + 1] + [b_blocks[0] * 4 + i for i in range(3)]
    assert [r.context_len for r in out.scheduled] == [6, 3]
    assert [r.samples_token for r in out.scheduled] == [True, True]


def test_uniform_decode_steps_replay_full_graphs_and_mixed_steps_piecewise():
    from mini_vllm.config.capture_sizes import default_capture_sizes
    from mini_vllm.config.compilation import CUDAGraphMode
    from mini_vllm.engine.cudagraph_dispatcher import CudagraphDispatcher

    sched, model = make(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=64)
    dispatcher = CudagraphDispatcher(
        CUDAGraphMode.FULL_AND_PIECEWISE, default_capture_sizes(4, 32), max_num_seqs=4
    )
    requests = [req("a", 3), req("b", 2), req("c", 3), req("long", 12, max_tokens=1)]
    _, outputs = drive(sched, model, requests, arrivals=[0, 0, 3, 6])
    modes = [dispatcher.dispatch(o.total_num_tokens, o.is_uniform_decode)[0] for o in outputs]
    full, piecewise, eager = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE
    # prefill, decode x2, c joins, decode x2, a 15-token step above the largest capture size (8)
    assert modes[:7] == [piecewise, full, full, piecewise, full, full, eager]
    assert all((m is full) == o.is_uniform_decode for m, o in zip(modes, outputs))


# -- chunked prefill --------------------------------------------------------------


def test_chunked_prefill_covers_the_whole_prompt_in_budget_sized_chunks():
    sched, model = make(max_num_batched_tokens=16, max_model_len=128)
    long = req("long", 50, max_tokens=3)
    finished, outputs = drive(sched, model, [long])
    chunks = [
        (r.num_computed_tokens, r.num_new_tokens, r.samples_token)
        for o in outputs
        for r in o.scheduled
    ][:4]
    assert chunks == [(0, 16, False), (16, 16, False), (32, 16, False), (48, 2, True)]
    assert all(o.scheduled[0].is_prefill for o in outputs[:4])
    assert_all_done_as_if_alone(sched, [long], finished)


def test_prefill_chunk_shares_the_step_with_running_decodes():
    sched, model = make(max_num_seqs=4, max_num_batched_tokens=8, max_model_len=128)
    requests = [req("a", 3, max_tokens=12), req("b", 30, max_tokens=2)]
    finished, outputs = drive(sched, model, requests, arrivals=[0, 1])
    step = outputs[2]
    assert [(r.seq_id, r.num_new_tokens) for r in step.scheduled] == [("a", 1), ("b", 7)]
    assert_all_done_as_if_alone(sched, requests, finished)


def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room():
    sched, model = make(
        max_num_seqs=4, max_num_batched_tokens=32, max_model_len=32, enable_chunked_prefill=False
    )
    requests = [req("a", 10, max_tokens=4), req("b", 30, max_tokens=2)]
    finished, outputs = drive(sched, model, requests)
    assert outputs[0].seq_ids == ("a",)  # 22 tokens left: b does not fit and is not cut
    assert outputs[1].seq_ids == ("a", "b") and outputs[1].scheduled[1].num_new_tokens == 30
    assert_all_done_as_if_alone(sched, requests, finished)


def test_config_refuses_limits_that_could_deadlock():
    with pytest.raises(ValueError, match="max_num_seqs"):
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=4)
    with pytest.raises(ValueError, match="chunked prefill"):
        SchedulerConfig(max_num_batched_tokens=64, max_model_len=128, enable_chunked_prefill=False)
    with pytest.raises(ValueError, match="max_model_len"):
        SchedulerConfig(max_model_len=0)


# -- preemption -------------------------------------------------------------------


def test_preemption_under_a_small_cache_keeps_every_output_exact():
    sched, model = make(
        num_blocks=10, block_size=4, max_num_seqs=4, max_num_batched_tokens=32, max_model_len=64
    )
    requests = [req(i, 6 + i, max_tokens=14, offset=i) for i in range(6)]
    finished, outputs = drive(sched, model, requests)
    assert sched.num_preemptions > 0
    assert sum(len(o.preempted_ids) for o in outputs) == sched.num_preemptions
    assert sum(s.num_preemptions for s in requests) == sched.num_preemptions
    assert_all_done_as_if_alone(sched, requests, finished)


def test_victim_is_the_latest_admitted_and_recomputes_prompt_plus_generated():
    # 4 blocks of 4 tokens. a and b take 2 blocks each; a's 9th token needs a third.
    sched, model = make(
        num_blocks=4, block_size=4, max_num_seqs=4, max_num_batched_tokens=32, max_model_len=64
    )
    a, b = req("a", 6, max_tokens=6), req("b", 5, max_tokens=6)
    sched.add_request(a)
    sched.add_request(b)
    preempted_at = None
    for step in range(30):
        out = sched.schedule()
        if out.preempted_ids and preempted_at is None:
            preempted_at = step
            assert out.preempted_ids == ("b",)
            assert out.seq_ids == ("a",) and b.status is SequenceStatus.WAITING
            assert b.num_computed_tokens == 0 and b.block_table == [] and b.num_output_tokens > 0
            generated = b.num_tokens
        if preempted_at is not None and "b" in out.seq_ids and out.scheduled[-1].seq_id == "b":
            row = out.scheduled[-1]
            if row.num_computed_tokens == 0:
                assert row.is_prefill and row.num_new_tokens == generated and row.samples_token
                assert not out.is_uniform_decode
                break
        sched.update_from_output(out, model.forward(out))
    else:
        pytest.fail("b was never preempted and resumed")
    assert b.num_preemptions == 1 and a.num_preemptions == 0


def test_preempted_request_goes_back_to_the_front_of_the_waiting_queue():
    sched, model = make(
        num_blocks=4, block_size=4, max_num_seqs=2, max_num_batched_tokens=32, max_model_len=64
    )
    requests = [req("a", 6, max_tokens=6), req("b", 5, max_tokens=6), req("c", 3, max_tokens=2)]
    finished, outputs = drive(sched, model, requests)
    first_preempt = next(i for i, o in enumerate(outputs) if o.preempted_ids)
    # c waited since the start, yet b (preempted) is admitted again before it.
    admitted_after = [
        r.seq_id
        for o in outputs[first_preempt + 1 :]
        for r in o.scheduled
        if r.num_computed_tokens == 0
    ]
    assert admitted_after == ["b", "c"]
    assert_all_done_as_if_alone(sched, requests, finished)


def test_no_request_is_admitted_in_a_step_that_preempted():
    # With prefix caching the request just preempted could come straight back from its
    # still-cached blocks; the scheduler waits a step instead (check_output asserts it).
    sched, model = make(
        num_blocks=7,
        block_size=2,
        caching=True,
        max_num_seqs=4,
        max_num_batched_tokens=7,
        max_model_len=64,
    )
    requests = [req(0, 5, max_tokens=4), req(1, 5, max_tokens=5), req(2, 2, max_tokens=6)]
    finished, outputs = drive(sched, model, requests)
    assert outputs[2].preempted_ids == (2,) and outputs[2].seq_ids == (0, 1)
    # 1 has 0's prompt: it shares 0's blocks from the first step on, which spares a preemption.
    assert sched.num_preemptions == 1
    assert_all_done_as_if_alone(sched, requests, finished)


# -- impossible requests ----------------------------------------------------------


def test_prompt_longer_than_max_model_len_fails_alone_with_a_clear_error():
    sched, model = make(max_num_batched_tokens=16, max_model_len=16)
    requests = [req("ok1", 5), req("too_long", 17), req("ok2", 7)]
    finished, outputs = drive(sched, model, requests)
    bad = requests[1]
    assert bad.finish_reason is FinishReason.ERROR and bad.output_token_ids == ()
    assert "max_model_len=16" in bad.error and "17 tokens" in bad.error
    assert outputs[0].failed == (bad,)
    assert_all_done_as_if_alone(sched, requests, finished)


def test_prompt_bigger_than_the_whole_cache_fails_alone_with_a_clear_error():
    sched, model = make(num_blocks=4, block_size=4, max_num_batched_tokens=16, max_model_len=128)
    requests = [req("big", 17), req("ok", 5, max_tokens=3)]
    finished, _ = drive(sched, model, requests)
    assert requests[0].finish_reason is FinishReason.ERROR
    assert "5 KV blocks" in requests[0].error and "has 4" in requests[0].error
    assert requests[1].finish_reason is FinishReason.LENGTH
    assert_all_done_as_if_alone(sched, requests, finished)


def test_request_that_outgrows_the_cache_while_decoding_fails_and_keeps_its_tokens():
    sched, model = make(num_blocks=2, block_size=4, max_num_batched_tokens=16, max_model_len=128)
    grower = req("grower", 6, max_tokens=20)
    finished, _ = drive(sched, model, [grower])
    assert grower.finish_reason is FinishReason.ERROR
    assert grower.num_output_tokens == 3  # 9 tokens: the 9th would need a third block
    assert "3 KV blocks" in grower.error
    assert_all_done_as_if_alone(sched, [grower], finished)


def test_only_failures_pending_still_count_as_unfinished_work():
    sched, _ = make(max_num_batched_tokens=16, max_model_len=8)
    sched.add_request(req("x", 9))
    assert sched.has_unfinished_requests()
    out = sched.schedule()
    assert out.is_empty and not out.is_uniform_decode
    assert [s.seq_id for s in sched.update_from_output(out, [])] == ["x"]
    assert not sched.has_unfinished_requests()


# -- stopping ---------------------------------------------------------------------


def test_stops_at_eos_unless_ignore_eos():
    prompt = next(p for p in ([i, i + 1] for i in range(1, 500)) if next_token(p) == EOS)
    sched, model = make(max_num_batched_tokens=16, max_model_len=64)
    stops = Sequence("stops", prompt, SamplingParams(max_tokens=5))
    goes_on = Sequence("goes_on", prompt, SamplingParams(max_tokens=5, ignore_eos=True))
    finished, _ = drive(sched, model, [stops, goes_on])
    assert stops.output_token_ids == (EOS,) and stops.finish_reason is FinishReason.STOP
    assert goes_on.num_output_tokens == 5 and goes_on.finish_reason is FinishReason.LENGTH
    assert_all_done_as_if_alone(sched, [stops, goes_on], finished)


def test_no_eos_token_means_only_lengths_stop():
    sched, model = make(max_num_batched_tokens=16, max_model_len=64, eos=None)
    seq = Sequence("a", [1, 2], SamplingParams(max_tokens=30))
    drive(sched, model, [seq])
    assert seq.num_output_tokens == 30 and seq.finish_reason is FinishReason.LENGTH


def test_max_model_len_caps_prompt_plus_output():
    sched, model = make(max_num_batched_tokens=16, max_model_len=12)
    seq = req("a", 9, max_tokens=100)
    finished, _ = drive(sched, model, [seq])
    assert seq.num_tokens == 12 and seq.finish_reason is FinishReason.LENGTH
    assert_all_done_as_if_alone(sched, [seq], finished)


# -- prefix caching ---------------------------------------------------------------


def test_prefix_cached_blocks_are_skipped_and_outputs_do_not_change():
    sched, model = make(
        num_blocks=32, block_size=4, caching=True, max_num_batched_tokens=32, max_model_len=64
    )
    shared = [(3 * i + 1) % VOCAB for i in range(10)]
    first = Sequence("first", shared + [2], SamplingParams(max_tokens=4, ignore_eos=True))
    second = Sequence("second", shared + [5, 6], SamplingParams(max_tokens=4, ignore_eos=True))
    finished, outputs = drive(sched, model, [first, second], arrivals=[0, 2])
    row = next(r for o in outputs for r in o.scheduled if r.seq_id == "second")
    assert (row.num_computed_tokens, row.num_new_tokens) == (8, 4)  # 2 full blocks shared
    assert_all_done_as_if_alone(sched, [first, second], finished)


# -- protocol errors --------------------------------------------------------------


def test_schedule_twice_without_update_is_an_error():
    sched, _ = make(max_num_batched_tokens=16, max_model_len=64)
    sched.add_request(req("a", 3))
    sched.schedule()
    with pytest.raises(RuntimeError, match="update_from_output"):
        sched.schedule()


def test_update_checks_the_output_and_the_token_count():
    sched, _ = make(max_num_batched_tokens=16, max_model_len=64)
    sched.add_request(req("a", 3))
    out = sched.schedule()
    with pytest.raises(ValueError, match="1 scheduled row"):
        sched.update_from_output(out, [1, 2])
    with pytest.raises(ValueError, match="no token was sampled"):
        sched.update_from_output(out, [None])
    with pytest.raises(ValueError, match=">= 0"):
        sched.update_from_output(out, [-1])
    assert out.scheduled[0].seq.num_computed_tokens == 0  # nothing half-applied
    stale = SchedulerOutput(step=out.step, scheduled=out.scheduled, block_size=out.block_size)
    with pytest.raises(RuntimeError, match="not the step in flight"):
        sched.update_from_output(stale, [1])
    sched.update_from_output(out, [1])
    assert sched.get_request_counts()[0] == 1


def test_a_live_request_id_cannot_be_reused_and_a_sequence_not_added_twice():
    sched, _ = make(max_num_batched_tokens=16, max_model_len=64)
    a = req("a", 3)
    sched.add_request(a)
    with pytest.raises(ValueError, match="already in use"):
        sched.add_request(req("a", 4))
    out = sched.schedule()
    with pytest.raises(ValueError, match="not new"):
        sched.add_request(a)
    sched.update_from_output(out, [1])


# -- everything at once -----------------------------------------------------------

requests_strategy = st.lists(
    st.tuples(
        st.lists(
            st.integers(1, 3), min_size=1, max_size=14
        ),  # prompt (small alphabet: shared prefixes)
        st.integers(1, 12),  # max_tokens
        st.booleans(),  # ignore_eos
        st.integers(0, 6),  # arrival step
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cache_tokens=st.integers(6, 48),
    block_size=st.integers(1, 4),
    max_num_seqs=st.integers(1, 4),
    extra_budget=st.integers(0, 20),
    max_model_len=st.integers(4, 32),
    chunked=st.booleans(),
    caching=st.booleans(),
    specs=requests_strategy,
)
def test_any_workload_finishes_every_request_exactly_as_if_alone(
    cache_tokens, block_size, max_num_seqs, extra_budget, max_model_len, chunked, caching, specs
):
    num_blocks = max(1, cache_tokens // block_size)
    budget = max_num_seqs + extra_budget
    if not chunked:
        budget = max(budget, max_model_len)
    sched, model = make(
        num_blocks,
        block_size,
        caching=caching,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
    )
    requests = [
        Sequence(i, prompt, SamplingParams(max_tokens=m, ignore_eos=ig))
        for i, (prompt, m, ig, _) in enumerate(specs)
    ]
    finished, _ = drive(sched, model, requests, arrivals=[a for *_, a in specs])
    assert_all_done_as_if_alone(sched, requests, finished)
