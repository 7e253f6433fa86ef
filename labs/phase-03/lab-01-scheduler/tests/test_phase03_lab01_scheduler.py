"""Phase 03, lab 01 — the scheduler, driven by a fake paged model.

The fake model uses only the SchedulerOutput: it writes each new token into a fake KV
cache through the slot mapping, reads each row's context back through its block
table, and picks the next token as a fixed function of that context. So every
request must end with exactly the tokens it gets when run alone, however the
scheduler batched, chunked or preempted it.
"""

import pytest

from labkit import implementation
from mini_vllm.engine.block_manager import BlockManager, slot_mapping, slot_of
from mini_vllm.engine.sequence import FinishReason, Sequence, SequenceStatus
from mini_vllm.sampling_params import SamplingParams

impl = implementation(__file__, starter="scheduler.py", reference="mini_vllm.engine.scheduler")

VOCAB, EOS = 24, 0


def next_token(context):
    h = 7
    for t in context:
        h = (h * 1_000_003 + t + 1) % (2**61 - 1)
    return h % VOCAB


def alone(seq, max_model_len, num_blocks, block_size):
    """(output tokens, finish reason) of the request run by itself."""
    blocks = lambda n: -(-n // block_size)  # noqa: E731
    tokens, out = list(seq.prompt_token_ids), []
    if len(tokens) > max_model_len or blocks(len(tokens)) > num_blocks:
        return [], FinishReason.ERROR
    while True:
        tokens.append(next_token(tokens))
        out.append(tokens[-1])
        if tokens[-1] == EOS and not seq.sampling_params.ignore_eos:
            return out, FinishReason.STOP
        if len(out) >= seq.sampling_params.max_tokens or len(tokens) >= max_model_len:
            return out, FinishReason.LENGTH
        if blocks(len(tokens)) > num_blocks:
            return out, FinishReason.ERROR


class FakeModel:
    def __init__(self, num_blocks, block_size):
        self.kv = [None] * (num_blocks * block_size)

    def forward(self, out):
        for row in out.scheduled:
            slots = slot_mapping(
                row.block_table, row.num_computed_tokens, row.context_len, out.block_size
            )
            for token, slot in zip(row.new_token_ids, slots):
                self.kv[slot] = token
        sampled = []
        for row in out.scheduled:
            context = [
                self.kv[slot_of(row.block_table, p, out.block_size)] for p in range(row.context_len)
            ]
            assert context == row.seq.tokens(0, row.context_len), f"KV of {row.seq_id!r} is corrupt"
            sampled.append(next_token(context) if row.samples_token else None)
        return sampled


class Engine:
    def __init__(self, num_blocks=64, block_size=4, caching=False, eos=EOS, **config):
        bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching)
        self.sched = impl.Scheduler(impl.SchedulerConfig(**config), bm, eos_token_id=eos)
        self.model = FakeModel(num_blocks, block_size)
        self.outputs, self.finished = [], []

    def run(self, requests, arrivals=None):
        arrivals = arrivals or [0] * len(requests)
        step = 0
        while step <= max(arrivals) or self.sched.has_unfinished_requests():
            for seq, at in zip(requests, arrivals):
                if at == step:
                    self.sched.add_request(seq)
            out = self.sched.schedule()
            self.outputs.append(out)
            self.finished += self.sched.update_from_output(out, self.model.forward(out))
            step += 1
            assert step < 2000, "the scheduler stopped making progress"
        return self.outputs

    def assert_all_done_as_if_alone(self, requests):
        bm = self.sched.block_manager
        assert sorted(map(id, self.finished)) == sorted(map(id, requests)), (
            "a request was lost or reported twice"
        )
        for seq in requests:
            expected = alone(seq, self.sched.config.max_model_len, bm.num_blocks, bm.block_size)
            assert (list(seq.output_token_ids), seq.finish_reason) == expected, seq
            assert seq.block_table == []
        assert bm.num_free_blocks == bm.num_blocks, "blocks leaked"


def req(seq_id, prompt_len, max_tokens=8, ignore_eos=True, offset=0):
    prompt = [(offset + 3 * i + 1) % VOCAB or 1 for i in range(prompt_len)]
    return Sequence(seq_id, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos))


# -- steps 1-2: one step ------------------------------------------------------------


def test_budget_and_max_num_seqs_are_never_exceeded():
    engine = Engine(max_num_seqs=3, max_num_batched_tokens=10, max_model_len=64)
    requests = [req(i, 3 + 2 * i, max_tokens=5, offset=i) for i in range(8)]
    outputs = engine.run(requests)
    assert max(o.num_reqs for o in outputs) == 3
    assert max(o.total_num_tokens for o in outputs) == 10
    engine.assert_all_done_as_if_alone(requests)


def test_decode_steps_after_the_prefill_are_uniform_decode():
    engine = Engine(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    requests = [req(i, 5, max_tokens=4, offset=i) for i in range(3)]
    outputs = engine.run(requests)
    assert not outputs[0].is_uniform_decode and outputs[0].total_num_tokens == 15
    assert len(outputs) == 4
    assert all(o.is_uniform_decode and o.total_num_tokens == 3 for o in outputs[1:])
    engine.assert_all_done_as_if_alone(requests)


def test_new_request_joining_decodes_makes_a_mixed_batch_with_decodes_first():
    engine = Engine(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    requests = [req("a", 4), req("b", 4), req("late", 6)]
    outputs = engine.run(requests, arrivals=[0, 0, 2])
    joined = outputs[2]
    assert not joined.is_uniform_decode
    assert [(r.seq_id, r.num_new_tokens) for r in joined.scheduled] == [
        ("a", 1),
        ("b", 1),
        ("late", 6),
    ]
    assert outputs[3].is_uniform_decode
    engine.assert_all_done_as_if_alone(requests)


def test_chunked_prefill_covers_the_whole_prompt_and_samples_only_at_its_end():
    engine = Engine(max_num_batched_tokens=16, max_model_len=128)
    long = req("long", 50, max_tokens=3)
    outputs = engine.run([long])
    chunks = [
        (r.num_computed_tokens, r.num_new_tokens, r.samples_token)
        for o in outputs[:4]
        for r in o.scheduled
    ]
    assert chunks == [(0, 16, False), (16, 16, False), (32, 16, False), (48, 2, True)]
    engine.assert_all_done_as_if_alone([long])


def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room():
    engine = Engine(
        max_num_seqs=4, max_num_batched_tokens=32, max_model_len=32, enable_chunked_prefill=False
    )
    requests = [req("a", 10, max_tokens=4), req("b", 30, max_tokens=2)]
    outputs = engine.run(requests)
    assert outputs[0].seq_ids == ("a",)
    assert [(r.seq_id, r.num_new_tokens) for r in outputs[1].scheduled] == [("a", 1), ("b", 30)]
    engine.assert_all_done_as_if_alone(requests)


def test_schedule_twice_without_update_is_an_error():
    engine = Engine(max_num_batched_tokens=16, max_model_len=64)
    engine.sched.add_request(req("a", 3))
    engine.sched.schedule()
    with pytest.raises(RuntimeError):
        engine.sched.schedule()


# -- step 3: finishing ---------------------------------------------------------------


def test_stops_at_eos_unless_ignore_eos():
    prompt = next(p for p in ([i, i + 1] for i in range(1, 500)) if next_token(p) == EOS)
    engine = Engine(max_num_batched_tokens=16, max_model_len=64)
    stops = Sequence("stops", prompt, SamplingParams(max_tokens=5))
    goes_on = Sequence("goes_on", prompt, SamplingParams(max_tokens=5, ignore_eos=True))
    engine.run([stops, goes_on])
    assert stops.output_token_ids == (EOS,) and stops.finish_reason is FinishReason.STOP
    assert goes_on.num_output_tokens == 5 and goes_on.finish_reason is FinishReason.LENGTH
    engine.assert_all_done_as_if_alone([stops, goes_on])


def test_max_model_len_caps_prompt_plus_output():
    engine = Engine(max_num_batched_tokens=16, max_model_len=12)
    seq = req("a", 9, max_tokens=100)
    engine.run([seq])
    assert seq.num_tokens == 12 and seq.finish_reason is FinishReason.LENGTH
    engine.assert_all_done_as_if_alone([seq])


# -- step 4: preemption -------------------------------------------------------------


def test_preemption_under_a_small_cache_keeps_every_output_exact():
    engine = Engine(
        num_blocks=10, block_size=4, max_num_seqs=4, max_num_batched_tokens=32, max_model_len=64
    )
    requests = [req(i, 6 + i, max_tokens=14, offset=i) for i in range(6)]
    outputs = engine.run(requests)
    assert engine.sched.num_preemptions > 0
    assert sum(len(o.preempted_ids) for o in outputs) == engine.sched.num_preemptions
    engine.assert_all_done_as_if_alone(requests)


def test_victim_is_the_latest_admitted_and_returns_first_to_recompute_everything():
    engine = Engine(
        num_blocks=4, block_size=4, max_num_seqs=2, max_num_batched_tokens=32, max_model_len=64
    )
    a, b, c = req("a", 6, max_tokens=6), req("b", 5, max_tokens=6), req("c", 3, max_tokens=2)
    outputs = engine.run([a, b, c])
    first = next(i for i, o in enumerate(outputs) if o.preempted_ids)
    assert outputs[first].preempted_ids == ("b",) and outputs[first].seq_ids == ("a",)
    resumed = [r for o in outputs[first + 1 :] for r in o.scheduled if r.num_computed_tokens == 0]
    assert [r.seq_id for r in resumed] == ["b", "c"]  # b jumps ahead of c, who waited longer
    assert resumed[0].is_prefill and resumed[0].samples_token
    assert resumed[0].num_new_tokens > b.num_prompt_tokens  # prompt + the tokens it had generated
    assert (a.num_preemptions, b.num_preemptions) == (0, 1)
    engine.assert_all_done_as_if_alone([a, b, c])


def test_nobody_is_admitted_in_a_step_that_preempted():
    engine = Engine(
        num_blocks=7,
        block_size=2,
        caching=True,
        max_num_seqs=4,
        max_num_batched_tokens=7,
        max_model_len=64,
    )
    requests = [req(0, 5, max_tokens=4), req(1, 5, max_tokens=5), req(2, 2, max_tokens=6)]
    outputs = engine.run(requests)
    assert outputs[2].preempted_ids == (2,)
    assert outputs[2].seq_ids == (0, 1)  # 2's blocks are still cached, yet it waits a step
    engine.assert_all_done_as_if_alone(requests)


def test_prefix_cached_tokens_are_not_computed_again():
    engine = Engine(
        num_blocks=32, block_size=4, caching=True, max_num_batched_tokens=32, max_model_len=64
    )
    shared = [(3 * i + 1) % VOCAB for i in range(10)]
    first = Sequence("first", shared + [2], SamplingParams(max_tokens=4, ignore_eos=True))
    second = Sequence("second", shared + [5, 6], SamplingParams(max_tokens=4, ignore_eos=True))
    outputs = engine.run([first, second], arrivals=[0, 2])
    row = next(r for o in outputs for r in o.scheduled if r.seq_id == "second")
    assert (row.num_computed_tokens, row.num_new_tokens) == (8, 4)
    engine.assert_all_done_as_if_alone([first, second])


# -- step 5: requests that can never run --------------------------------------------


def test_prompt_longer_than_max_model_len_fails_alone_with_a_clear_error():
    engine = Engine(max_num_batched_tokens=16, max_model_len=16)
    requests = [req("ok1", 5), req("too_long", 17), req("ok2", 7)]
    outputs = engine.run(requests)
    bad = requests[1]
    assert bad.finish_reason is FinishReason.ERROR and "max_model_len" in bad.error
    assert outputs[0].failed == (bad,)
    engine.assert_all_done_as_if_alone(requests)


def test_prompt_bigger_than_the_whole_cache_fails_alone_with_a_clear_error():
    engine = Engine(num_blocks=4, block_size=4, max_num_batched_tokens=16, max_model_len=128)
    requests = [req("big", 17), req("ok", 5, max_tokens=3)]
    engine.run(requests)
    assert requests[0].finish_reason is FinishReason.ERROR and "block" in requests[0].error
    engine.assert_all_done_as_if_alone(requests)


def test_request_that_outgrows_the_cache_fails_and_keeps_its_tokens():
    engine = Engine(num_blocks=2, block_size=4, max_num_batched_tokens=16, max_model_len=128)
    grower, short = req("grower", 6, max_tokens=20), req("short", 2, max_tokens=1)
    engine.run([grower, short])
    assert grower.finish_reason is FinishReason.ERROR and grower.num_output_tokens == 3
    assert grower.status is SequenceStatus.FINISHED
    engine.assert_all_done_as_if_alone([grower, short])
