"""Phase 03, lab 01 — the scheduler, driven by a fake paged model.

The fake model uses only the SchedulerOutput: it writes each new token into a fake KV
cache through the slot mapping, reads each row's context back through its block
table, and picks the next token as a fixed function of that context. It returns a
token for every row, as a runner may: a row that does not sample (a prompt chunk short
of the prompt's end) gets one too, which the scheduler must ignore. So every request
must end with exactly the tokens it gets when run alone, however the scheduler
batched, chunked or preempted it.

Every step of the engine is also checked against the invariants any correct scheduler
keeps: the token budget and max_num_seqs hold, no request has two rows, a request is
either running or waiting (never both), a step that preempted admits nobody, and
without prefix caching no two rows share a KV block.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mini_vllm.engine.scheduler as reference
from labkit import implementation
from labpredict import check_predictions
from mini_vllm.engine.block_manager import BlockManager, slot_mapping, slot_of
from mini_vllm.engine.sequence import FinishReason, Sequence, SequenceStatus
from mini_vllm.sampling_params import SamplingParams

impl = implementation(__file__, starter="scheduler.py", reference="mini_vllm.engine.scheduler")
answers = implementation(
    __file__, starter="predictions.py", reference="tests.course.lab_checks.phase03_lab01_answers"
)

VOCAB, EOS = 24, 0

# Deterministic property tests: the same examples on every run and every machine.
PROPERTY = settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def next_token(context):
    h = 7
    for t in context:
        h = (h * 1_000_003 + t + 1) % (2**61 - 1)
    return h % VOCAB


def blocks_for(num_tokens, block_size):
    return -(-num_tokens // block_size)


def alone(seq, max_model_len, num_blocks, block_size):
    """(output tokens, finish reason) of the request run by itself."""
    tokens, out = list(seq.prompt_token_ids), []
    if len(tokens) >= max_model_len or blocks_for(len(tokens), block_size) > num_blocks:
        return [], FinishReason.ERROR  # no room for an output token, or for the prompt
    while True:
        tokens.append(next_token(tokens))
        out.append(tokens[-1])
        if tokens[-1] == EOS and not seq.sampling_params.ignore_eos:
            return out, FinishReason.STOP
        if len(out) >= seq.sampling_params.max_tokens or len(tokens) >= max_model_len:
            return out, FinishReason.LENGTH
        if blocks_for(len(tokens), block_size) > num_blocks:
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
            sampled.append(next_token(context))  # for every row: the scheduler picks
        return sampled


class Engine:
    """A scheduler, a block manager and the fake model, with every step checked."""

    def __init__(self, num_blocks=64, block_size=4, caching=False, eos=EOS, **config):
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching)
        self.sched = impl.Scheduler(impl.SchedulerConfig(**config), self.bm, eos_token_id=eos)
        self.model = FakeModel(num_blocks, block_size)
        self.outputs, self.finished, self.added = [], [], []
        self.running = set()  # ids running, as the outputs tell it

    def add(self, *seqs):
        for seq in seqs:
            self.sched.add_request(seq)
            self.added.append(seq)

    def schedule(self):
        out = self.sched.schedule()
        self.outputs.append(out)
        self._check_step(out)
        return out

    def update(self, out, sampled=None):
        if sampled is None:
            sampled = self.model.forward(out)
        done = self.sched.update_from_output(out, sampled)
        for seq in done:
            assert seq.is_finished and seq.block_table == [], f"{seq!r} is not cleanly finished"
        self.running -= {seq.seq_id for seq in done}
        self.finished += done
        self._check_queues()
        return done

    def step(self):
        return self.update(self.schedule())

    def run(self, requests, arrivals=None):
        arrivals = arrivals or [0] * len(requests)
        step = 0
        while step <= max(arrivals, default=-1) or self.sched.has_unfinished_requests():
            self.add(*(seq for seq, at in zip(requests, arrivals) if at == step))
            self.step()
            step += 1
            assert step < 2000, "the scheduler stopped making progress"
        return self.outputs

    def _check_step(self, out):
        config, ids = self.sched.config, out.seq_ids
        assert out.total_num_tokens <= config.max_num_batched_tokens, (
            f"{out}: more tokens than max_num_batched_tokens={config.max_num_batched_tokens}"
        )
        assert out.num_reqs <= config.max_num_seqs, f"{out}: more rows than max_num_seqs"
        assert len(set(ids)) == len(ids), f"{out}: a request has two rows"
        assert all(row.num_new_tokens >= 1 for row in out.scheduled), f"{out}: an empty row"
        preempted = set(out.preempted_ids)
        assert not preempted & set(ids), f"{out}: a request preempted in it is scheduled in it"
        if preempted:
            admitted = [i for i in ids if i not in self.running]
            assert not admitted, (
                f"{out}: admitted {admitted} in a step that preempted {sorted(preempted)}: "
                "the blocks just freed go to requests that will want them back next step"
            )
        self.running = (self.running | set(ids)) - preempted - {s.seq_id for s in out.failed}
        bs = out.block_size
        for row in out.scheduled:
            assert len(row.block_table) * bs >= row.context_len, f"{row.seq_id!r} lacks blocks"
        if not self.bm.enable_prefix_caching:
            held = [b for row in out.scheduled for b in row.block_table]
            assert len(held) == len(set(held)), f"{out}: two rows share a KV block"
        self._check_queues()

    def _check_queues(self):
        live = [s for s in self.added if not s.is_finished]
        running = {s.seq_id for s in live if s.status is SequenceStatus.RUNNING}
        waiting = [s for s in live if s.status is SequenceStatus.WAITING]
        assert running == self.running, f"running {sorted(running)}, outputs say {self.running}"
        assert len(running) + len(waiting) == len(live)
        assert self.sched.get_request_counts() == (len(running), len(waiting)), (
            "get_request_counts() disagrees with the requests' statuses"
        )
        for seq in waiting:
            assert seq.block_table == [] and seq.num_computed_tokens == 0, f"{seq!r} waits"

    def assert_all_done_as_if_alone(self, requests):
        bm = self.bm
        assert sorted(map(id, self.finished)) == sorted(map(id, requests)), (
            "a request was lost or reported twice"
        )
        for seq in requests:
            expected = alone(seq, self.sched.config.max_model_len, bm.num_blocks, bm.block_size)
            assert (list(seq.output_token_ids), seq.finish_reason) == expected, seq
            assert seq.block_table == []
        assert bm.num_free_blocks == bm.num_blocks, "blocks leaked"
        assert not self.sched.has_unfinished_requests()
        assert sum(seq.num_preemptions for seq in self.added) == self.sched.num_preemptions, (
            "each request counts its own preemptions; the scheduler counts them all"
        )


def req(seq_id, prompt_len, max_tokens=8, ignore_eos=True, offset=0):
    prompt = [(offset + 3 * i + 1) % VOCAB or 1 for i in range(prompt_len)]
    return Sequence(seq_id, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos))


def rows(out):
    return [(r.seq_id, r.num_computed_tokens, r.num_new_tokens) for r in out.scheduled]


def drive(scheduler, config, num_blocks, requests, block_size=4):
    """Run `requests` to the end on `scheduler` (a module with Scheduler and
    SchedulerConfig), every sampled token a 7; returns the scheduler and its outputs."""
    sched = scheduler.Scheduler(
        scheduler.SchedulerConfig(**config), BlockManager(num_blocks, block_size)
    )
    for seq in requests:
        sched.add_request(seq)
    outputs = []
    while sched.has_unfinished_requests():
        outputs.append(sched.schedule())
        sched.update_from_output(outputs[-1], [7] * outputs[-1].num_reqs)
        assert len(outputs) < 200, "the scheduler stopped making progress"
    return sched, outputs


def step2_questions(scheduler):
    """The README's step 2 questions, answered by `scheduler`: a, b, c and d (prompts of
    4, 7, 2 and 3 tokens) arrive together; max_num_seqs=3, chunked prefill, 64 blocks of
    4; the first step with a budget of 10 tokens, then with one of 32."""
    found = []
    for budget in (10, 32):
        config = scheduler.SchedulerConfig(
            max_num_seqs=3, max_num_batched_tokens=budget, max_model_len=64
        )
        sched = scheduler.Scheduler(config, BlockManager(64, 4))
        for name, prompt_len in (("a", 4), ("b", 7), ("c", 2), ("d", 3)):
            sched.add_request(req(name, prompt_len))
        found.append((sched.schedule(), sched.get_request_counts()))
    (first, counts), (_, roomy_counts) = found
    b = next((row for row in first.scheduled if row.seq_id == "b"), None)
    b_tokens, b_samples = (b.num_new_tokens, b.samples_token) if b else (0, False)
    return b_tokens, b_samples, list(counts), roomy_counts[0]


def step3_questions(scheduler):
    """The README's step 3 questions: max_model_len=16, a budget of 32, prompts of 16
    (w), 15 (x) and 12 (z) tokens, max_tokens=8; one step, every sampled token a 7."""
    config = scheduler.SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=16)
    sched = scheduler.Scheduler(config, BlockManager(64, 4))
    x = req("x", 15)
    for seq in (req("w", 16), x, req("z", 12)):
        sched.add_request(seq)
    out = sched.schedule()
    done = sched.update_from_output(out, [7] * out.num_reqs)
    reason = None if x.finish_reason is None else str(x.finish_reason)
    return [seq.seq_id for seq in done], reason, list(sched.get_request_counts())


def step5_questions(scheduler):
    """The README's step 5 questions: the run of question 1, then the run of the
    decision (two blocks of 4, a budget of 5)."""
    sched, outputs = drive(
        scheduler,
        dict(max_num_seqs=2, max_num_batched_tokens=32, max_model_len=64),
        4,
        [req("a", 6, max_tokens=6), req("b", 5, max_tokens=6), req("c", 3, max_tokens=6)],
    )
    first = next((i for i, out in enumerate(outputs) if out.preempted_ids), None)
    victim = outputs[first].preempted_ids[0] if first is not None else None
    back = [
        row.num_new_tokens
        for out in outputs[(first or 0) + 1 :]
        for row in out.scheduled
        if row.seq_id == victim and row.num_computed_tokens == 0
    ]
    two_blocks, two_block_outputs = drive(
        scheduler,
        dict(max_num_seqs=3, max_num_batched_tokens=5, max_model_len=64),
        2,
        [req("a", 3, max_tokens=5), req("b", 6, max_tokens=2)],
    )
    computed = sum(out.total_num_tokens for out in two_block_outputs)
    return first, victim, back[0] if back else None, sched.num_preemptions, computed


# -- step 1: requests that can never run ---------------------------------------------


@pytest.mark.step1
def test_prompt_longer_than_max_model_len_fails_at_once_with_a_clear_error():
    engine = Engine(max_num_batched_tokens=16, max_model_len=16)
    ok1, bad, ok2 = req("ok1", 5), req("too_long", 17), req("ok2", 15)
    engine.add(ok1, bad, ok2)
    assert bad.finish_reason is FinishReason.ERROR and bad.status is SequenceStatus.FINISHED
    assert "max_model_len" in bad.error and "17" in bad.error and "16" in bad.error
    # A prompt one short of max_model_len is allowed: it has room for one output token.
    assert ok1.status is ok2.status is SequenceStatus.WAITING and ok2.error is None
    assert engine.sched.get_request_counts() == (0, 2)
    assert engine.sched.has_unfinished_requests()


@pytest.mark.step1
def test_a_prompt_that_fills_max_model_len_fails_at_once():
    engine = Engine(max_num_batched_tokens=16, max_model_len=16)
    full, ok = req("fills_the_context", 16), req("ok", 15)
    engine.add(full, ok)
    assert full.finish_reason is FinishReason.ERROR, (
        "a 16-token prompt under max_model_len=16 leaves no room for an output token: "
        "prompt + output would pass max_model_len (vLLM refuses such a prompt too)"
    )
    assert "max_model_len" in full.error and "16" in full.error
    assert ok.status is SequenceStatus.WAITING and ok.error is None


@pytest.mark.step1
def test_request_bigger_than_the_whole_cache_fails_at_once_with_a_clear_error():
    engine = Engine(num_blocks=4, block_size=4, max_num_batched_tokens=16, max_model_len=128)
    big, full = req("big", 17), req("fills_the_cache", 16)
    engine.add(big, full)
    assert big.finish_reason is FinishReason.ERROR and "block" in big.error
    assert "5" in big.error and "4" in big.error  # the blocks it needs, the blocks there are
    assert full.status is SequenceStatus.WAITING and full.error is None
    assert engine.sched.get_request_counts() == (0, 1)


# -- step 2: one step: who gets in ---------------------------------------------------


@pytest.mark.step2
def test_your_step2_predictions_match_what_the_reference_computes():
    b_tokens, b_samples, counts, running = step2_questions(reference)
    check_predictions(
        answers,
        {
            "S2_B_FIRST_CHUNK": b_tokens,
            "S2_B_SAMPLES": b_samples,
            "S2_REQUEST_COUNTS": counts,
            "S2_RUNNING_WITH_BUDGET_32": running,
        },
    )


@pytest.mark.step2
def test_the_readme_questions_come_out_the_same_on_your_scheduler():
    assert step2_questions(impl) == step2_questions(reference)


@pytest.mark.step2
def test_first_step_admits_in_arrival_order_and_chunks_the_one_that_meets_the_budget():
    engine = Engine(max_num_seqs=4, max_num_batched_tokens=10, max_model_len=64)
    engine.add(req("a", 4), req("b", 4), req("c", 4), req("d", 4))
    out = engine.schedule()
    assert rows(out) == [("a", 0, 4), ("b", 0, 4), ("c", 0, 2)]
    assert [r.samples_token for r in out.scheduled] == [True, True, False]
    assert all(r.is_prefill for r in out.scheduled) and not out.is_uniform_decode
    assert out.scheduled[2].new_token_ids == engine.added[2].prompt_token_ids[:2]
    assert engine.sched.get_request_counts() == (3, 1)


@pytest.mark.step2
def test_max_num_seqs_caps_the_requests_admitted():
    engine = Engine(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64)
    engine.add(req("a", 3), req("b", 3), req("c", 3))
    out = engine.schedule()
    assert out.seq_ids == ("a", "b")
    assert engine.sched.get_request_counts() == (2, 1)


@pytest.mark.step2
def test_without_chunking_a_prompt_that_exactly_fills_the_budget_goes_in():
    engine = Engine(
        max_num_seqs=4, max_num_batched_tokens=32, max_model_len=32, enable_chunked_prefill=False
    )
    engine.add(req("a", 10), req("b", 22), req("c", 1))
    out = engine.schedule()
    assert rows(out) == [("a", 0, 10), ("b", 0, 22)]  # 32 tokens: the whole budget
    assert engine.sched.get_request_counts() == (2, 1)


@pytest.mark.step2
def test_without_chunking_the_head_waits_and_nobody_overtakes_it():
    engine = Engine(
        max_num_seqs=4, max_num_batched_tokens=32, max_model_len=32, enable_chunked_prefill=False
    )
    engine.add(req("a", 10), req("b", 30), req("c", 2))
    out = engine.schedule()
    assert out.seq_ids == ("a",)  # b does not fit in the 22 tokens left; c must not pass it
    assert engine.sched.get_request_counts() == (1, 2)


@pytest.mark.step2
def test_a_prompt_waits_while_its_blocks_are_short_and_nobody_overtakes_it():
    engine = Engine(num_blocks=4, block_size=4, max_num_batched_tokens=64, max_model_len=64)
    engine.add(req("a", 10), req("b", 8), req("c", 2))
    out = engine.schedule()
    assert out.seq_ids == ("a",)  # a holds 3 blocks; b needs 2, only 1 is free
    assert engine.bm.num_free_blocks == 1
    assert engine.sched.get_request_counts() == (1, 2)


@pytest.mark.step2
def test_prefix_cached_tokens_count_as_computed_on_admission():
    engine = Engine(
        num_blocks=32, block_size=4, caching=True, max_num_batched_tokens=32, max_model_len=64
    )
    shared = [(3 * i + 1) % VOCAB for i in range(10)]
    # Someone computed the same 10 leading tokens earlier and left: 2 full blocks cached.
    earlier = Sequence("earlier", shared)
    engine.bm.allocate(earlier, 10)
    earlier.num_computed_tokens = 10
    engine.bm.cache_full_blocks(earlier)
    engine.bm.free(earlier)
    second = Sequence("second", shared + [5, 6], SamplingParams(max_tokens=4, ignore_eos=True))
    engine.add(second)
    out = engine.schedule()
    assert rows(out) == [("second", 8, 4)]
    assert out.scheduled[0].new_token_ids == (shared[8], shared[9], 5, 6)


@pytest.mark.step2
def test_requests_that_failed_on_arrival_are_reported_in_the_next_output():
    engine = Engine(max_num_batched_tokens=16, max_model_len=16)
    bad, ok = req("too_long", 17), req("ok", 5)
    engine.add(bad, ok)
    out = engine.schedule()
    assert out.failed == (bad,) and out.seq_ids == ("ok",)


@pytest.mark.step2
def test_schedule_twice_without_update_is_an_error():
    engine = Engine(max_num_batched_tokens=16, max_model_len=64)
    engine.add(req("a", 3))
    engine.schedule()
    with pytest.raises(RuntimeError):
        engine.sched.schedule()


# -- step 3: after the forward -------------------------------------------------------


@pytest.mark.step3
def test_your_step3_predictions_match_what_the_reference_computes():
    finished, x_reason, counts = step3_questions(reference)
    check_predictions(
        answers,
        {
            "S3_FINISHED": finished,
            "S3_X_FINISH_REASON": x_reason,
            "S3_REQUEST_COUNTS": counts,
        },
    )


@pytest.mark.step3
def test_the_readme_step3_questions_come_out_the_same_on_your_scheduler():
    assert step3_questions(impl) == step3_questions(reference)


@pytest.mark.step3
def test_every_eos_id_stops_a_request():
    engine = Engine(max_num_batched_tokens=16, max_model_len=64, eos=(EOS, 5))
    first, second, third = (
        Sequence(name, [1, 2, 3], SamplingParams(max_tokens=5)) for name in ("f", "s", "t")
    )
    engine.add(first, second, third)
    done = engine.update(engine.schedule(), [EOS, 5, 6])
    assert done == [first, second], "every id of eos_token_id ends a request"
    assert second.finish_reason is FinishReason.STOP and third.status is SequenceStatus.RUNNING


@pytest.mark.step3
def test_a_finished_requests_id_can_be_used_again():
    engine = Engine(max_num_batched_tokens=16, max_model_len=64)
    first = req("same", 4, max_tokens=1)
    engine.add(first)
    engine.step()
    assert first.is_finished
    again = req("same", 5, max_tokens=1)
    engine.add(again)  # the id is free again once its request has finished
    assert again.status is SequenceStatus.WAITING
    engine.step()
    assert again.num_output_tokens == 1 and again.finish_reason is FinishReason.LENGTH


@pytest.mark.step3
def test_a_whole_prefill_samples_the_first_token_and_decodes_next():
    engine = Engine(max_num_batched_tokens=16, max_model_len=64)
    seq = req("a", 5, max_tokens=3)
    engine.add(seq)
    out = engine.schedule()
    assert engine.update(out, [7]) == []
    assert seq.output_token_ids == (7,) and seq.num_computed_tokens == 5
    assert seq.status is SequenceStatus.RUNNING and seq.num_new_tokens == 1
    assert not seq.is_prefill


@pytest.mark.step3
def test_a_chunk_short_of_the_prompt_end_takes_no_token_even_if_one_is_given():
    engine = Engine(max_num_seqs=4, max_num_batched_tokens=10, max_model_len=64)
    a, b = req("a", 6), req("b", 9)
    engine.add(a, b)
    out = engine.schedule()
    assert rows(out) == [("a", 0, 6), ("b", 0, 4)]
    engine.update(out, [7, 9])  # the runner may sample every row; b's row must be ignored
    assert a.output_token_ids == (7,) and b.output_token_ids == ()
    assert (a.num_computed_tokens, b.num_computed_tokens) == (6, 4)
    assert b.is_prefill and b.num_new_tokens == 5


@pytest.mark.step3
def test_max_tokens_counts_the_token_just_sampled():
    engine = Engine(max_num_batched_tokens=16, max_model_len=64)
    one, two = req("one", 4, max_tokens=1), req("two", 4, max_tokens=2)
    engine.add(one, two)
    out = engine.schedule()
    done = engine.update(out, [7, 7])
    assert done == [one]
    assert one.output_token_ids == (7,) and one.finish_reason is FinishReason.LENGTH
    assert two.status is SequenceStatus.RUNNING
    assert engine.sched.get_request_counts() == (1, 0)
    assert engine.bm.num_free_blocks == engine.bm.num_blocks - 1  # only two holds a block


@pytest.mark.step3
def test_eos_stops_unless_ignore_eos_and_wins_over_max_tokens():
    engine = Engine(max_num_batched_tokens=16, max_model_len=64)
    params = dict(max_tokens=1), dict(max_tokens=5), dict(max_tokens=5, ignore_eos=True)
    last, stops, goes_on = (
        Sequence(name, [1, 2, 3], SamplingParams(**p))
        for name, p in zip(("last", "stops", "goes_on"), params)
    )
    engine.add(last, stops, goes_on)
    out = engine.schedule()
    done = engine.update(out, [EOS, EOS, EOS])
    assert done == [last, stops]
    assert last.finish_reason is FinishReason.STOP  # EOS on the last allowed token: a STOP
    assert stops.finish_reason is FinishReason.STOP and stops.output_token_ids == (EOS,)
    assert goes_on.status is SequenceStatus.RUNNING and goes_on.output_token_ids == (EOS,)


@pytest.mark.step3
def test_max_model_len_caps_prompt_plus_output():
    engine = Engine(max_num_batched_tokens=32, max_model_len=12)
    at_cap, below = req("at_cap", 11, max_tokens=100), req("below", 10, max_tokens=100)
    engine.add(at_cap, below)
    done = engine.update(engine.schedule(), [7, 7])
    assert done == [at_cap] and at_cap.num_tokens == 12
    assert at_cap.finish_reason is FinishReason.LENGTH
    assert below.status is SequenceStatus.RUNNING


@pytest.mark.step3
def test_a_finished_request_gives_its_blocks_to_the_next_one():
    engine = Engine(num_blocks=4, block_size=4, max_num_batched_tokens=32, max_model_len=64)
    first, second = req("first", 16, max_tokens=1), req("second", 13, max_tokens=1)
    engine.add(first, second)
    out = engine.schedule()
    assert out.seq_ids == ("first",)  # the cache is full
    engine.update(out)
    out = engine.schedule()
    assert rows(out) == [("second", 0, 13)]
    engine.update(out)
    engine.assert_all_done_as_if_alone([first, second])


@pytest.mark.step3
def test_update_returns_the_requests_that_failed_on_arrival():
    engine = Engine(max_num_batched_tokens=16, max_model_len=16)
    bad, ok = req("too_long", 17), req("ok", 5, max_tokens=3)
    engine.add(bad, ok)
    out = engine.schedule()
    assert engine.update(out) == [bad]


@pytest.mark.step3
def test_update_refuses_a_stale_output_and_a_wrong_number_of_tokens():
    engine = Engine(max_num_batched_tokens=16, max_model_len=64)
    engine.add(req("a", 3), req("b", 3))
    out = engine.schedule()
    with pytest.raises(ValueError):
        engine.sched.update_from_output(out, [7])
    stranger = impl.SchedulerOutput(step=out.step, scheduled=out.scheduled, block_size=4)
    with pytest.raises(RuntimeError):
        engine.sched.update_from_output(stranger, [7, 7])
    engine.update(out)


# -- step 4: many steps: running requests keep going ---------------------------------


@pytest.mark.step4
def test_decode_steps_after_the_prefill_are_uniform_decode():
    engine = Engine(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    requests = [req(i, 5, max_tokens=4, offset=i) for i in range(3)]
    outputs = engine.run(requests)
    assert not outputs[0].is_uniform_decode and outputs[0].total_num_tokens == 15
    assert len(outputs) == 4
    assert all(o.is_uniform_decode and o.total_num_tokens == 3 for o in outputs[1:])
    engine.assert_all_done_as_if_alone(requests)


@pytest.mark.step4
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


@pytest.mark.step4
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


@pytest.mark.step4
def test_a_running_prompt_gets_the_budget_the_decodes_leave():
    engine = Engine(max_num_seqs=4, max_num_batched_tokens=8, max_model_len=64)
    requests = [req("a", 3, max_tokens=12), req("b", 3, max_tokens=12), req("long", 20)]
    outputs = engine.run(requests)
    assert [rows(o) for o in outputs[:4]] == [
        [("a", 0, 3), ("b", 0, 3), ("long", 0, 2)],
        [("a", 3, 1), ("b", 3, 1), ("long", 2, 6)],
        [("a", 4, 1), ("b", 4, 1), ("long", 8, 6)],
        [("a", 5, 1), ("b", 5, 1), ("long", 14, 6)],
    ]
    assert outputs[3].scheduled[2].samples_token
    engine.assert_all_done_as_if_alone(requests)


@pytest.mark.step4
def test_budget_and_max_num_seqs_are_met_exactly_when_requests_queue_up():
    engine = Engine(max_num_seqs=3, max_num_batched_tokens=10, max_model_len=64)
    requests = [req(i, 3 + 2 * i, max_tokens=5, offset=i) for i in range(8)]
    outputs = engine.run(requests)
    assert max(o.num_reqs for o in outputs) == 3
    assert max(o.total_num_tokens for o in outputs) == 10
    engine.assert_all_done_as_if_alone(requests)


@pytest.mark.step4
def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room():
    engine = Engine(
        max_num_seqs=4, max_num_batched_tokens=32, max_model_len=32, enable_chunked_prefill=False
    )
    requests = [req("a", 10, max_tokens=4), req("b", 30, max_tokens=2)]
    outputs = engine.run(requests)
    assert outputs[0].seq_ids == ("a",)
    assert [(r.seq_id, r.num_new_tokens) for r in outputs[1].scheduled] == [("a", 1), ("b", 30)]
    engine.assert_all_done_as_if_alone(requests)


@pytest.mark.step4
def test_stops_at_eos_unless_ignore_eos():
    prompt = next(p for p in ([i, i + 1] for i in range(1, 500)) if next_token(p) == EOS)
    engine = Engine(max_num_batched_tokens=16, max_model_len=64)
    stops = Sequence("stops", prompt, SamplingParams(max_tokens=5))
    goes_on = Sequence("goes_on", prompt, SamplingParams(max_tokens=5, ignore_eos=True))
    engine.run([stops, goes_on])
    assert stops.output_token_ids == (EOS,) and stops.finish_reason is FinishReason.STOP
    assert goes_on.num_output_tokens == 5 and goes_on.finish_reason is FinishReason.LENGTH
    engine.assert_all_done_as_if_alone([stops, goes_on])


@pytest.mark.step4
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


@st.composite
def workloads(draw, roomy):
    """(engine settings, requests, arrivals): random prompts, limits and arrivals.
    Prompts come from a 3-token alphabet so that prefixes repeat (prefix caching hits)."""
    block_size = draw(st.sampled_from([2, 4]))
    max_num_seqs = draw(st.integers(1 if roomy else 2, 4))
    max_model_len = draw(st.integers(6, 40))
    chunked = draw(st.booleans())
    budget = draw(st.integers(max_num_seqs, 24))
    if not chunked:
        budget = max(budget, max_model_len)
    # A small cache holds a few prompts at most: requests grow into each other's blocks.
    small_cache = None if roomy else draw(st.integers(4, 10))
    longest = max_model_len + 2 if roomy else min(max_model_len + 2, small_cache * block_size // 2)
    requests, arrivals = [], []
    for i in range(draw(st.integers(1 if roomy else 2, 6))):
        prompt = draw(st.lists(st.integers(1, 3), min_size=1, max_size=longest))
        params = SamplingParams(max_tokens=draw(st.integers(1, 12)), ignore_eos=draw(st.booleans()))
        requests.append(Sequence(i, prompt, params))
        arrivals.append(draw(st.integers(0, 4 if roomy else 2)))
    # Roomy: blocks for every request at its longest, all at once, so nobody is preempted.
    num_blocks = small_cache or sum(
        blocks_for(min(s.num_prompt_tokens + s.sampling_params.max_tokens, longest), block_size)
        for s in requests
    )
    settings_ = dict(
        num_blocks=num_blocks,
        block_size=block_size,
        caching=draw(st.booleans()),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
    )
    return settings_, requests, arrivals


@pytest.mark.step4
@PROPERTY
@given(workloads(roomy=True))
def test_any_workload_with_room_ends_as_if_each_request_ran_alone(workload):
    settings_, requests, arrivals = workload
    engine = Engine(**settings_)
    outputs = engine.run(requests, arrivals)  # every step's invariants are checked
    assert not any(o.preempted_ids for o in outputs)
    engine.assert_all_done_as_if_alone(requests)


# -- step 5: preemption --------------------------------------------------------------


@pytest.mark.step5
def test_your_step5_predictions_match_what_the_reference_computes():
    first, victim, recomputed, preemptions, computed = step5_questions(reference)
    check_predictions(
        answers,
        {
            "S5_FIRST_PREEMPTION_STEP": first,
            "S5_FIRST_VICTIM": victim,
            "S5_RECOMPUTED_TOKENS": recomputed,
            "S5_PREEMPTIONS": preemptions,
            "S5_TWO_BLOCKS_TOKENS_COMPUTED": computed,
        },
    )


@pytest.mark.step5
def test_the_readme_runs_come_out_the_same_on_your_scheduler():
    assert step5_questions(impl) == step5_questions(reference)


@pytest.mark.step5
def test_a_step_that_preempted_admits_nobody_or_the_victims_work_is_thrown_away():
    """Two blocks of 4, a budget of 5: a (3-token prompt) and b (6 tokens) fill both
    blocks in step 0. In step 1 b's next chunk needs a block, and b preempts itself."""
    sched, outputs = drive(
        impl,
        dict(max_num_seqs=3, max_num_batched_tokens=5, max_model_len=64),
        2,
        [req("a", 3, max_tokens=5), req("b", 6, max_tokens=2)],
    )
    computed = sum(out.total_num_tokens for out in outputs)
    assert (computed, sched.num_preemptions) == (16, 1), (
        f"{computed} tokens computed and {sched.num_preemptions} preemption(s) for work "
        "that needs 16 and 1: a request admitted in the step that preempted took the "
        "blocks just freed, which a running request needed a step later, so it was "
        "preempted in turn and its computed tokens thrown away"
    )


@pytest.mark.step5
def test_preemption_under_a_small_cache_keeps_every_output_exact():
    engine = Engine(
        num_blocks=10, block_size=4, max_num_seqs=4, max_num_batched_tokens=32, max_model_len=64
    )
    requests = [req(i, 6 + i, max_tokens=14, offset=i) for i in range(6)]
    outputs = engine.run(requests)
    assert engine.sched.num_preemptions > 0
    assert sum(len(o.preempted_ids) for o in outputs) == engine.sched.num_preemptions
    engine.assert_all_done_as_if_alone(requests)


@pytest.mark.step5
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


@pytest.mark.step5
def test_a_request_that_must_preempt_itself_ends_the_running_loop():
    engine = Engine(
        num_blocks=3, block_size=4, max_num_seqs=2, max_num_batched_tokens=32, max_model_len=64
    )
    a, b = req("a", 6, max_tokens=3), req("b", 4, max_tokens=6)
    engine.add(a, b)
    engine.step()  # a: 2 blocks, b: 1 block (full), the cache is full
    out = engine.schedule()  # a decodes in its second block; b needs a fresh one
    assert out.preempted_ids == ("b",) and rows(out) == [("a", 6, 1)]
    assert b.status is SequenceStatus.WAITING and b.num_preemptions == 1
    engine.update(out)
    engine.run([])
    engine.assert_all_done_as_if_alone([a, b])


@pytest.mark.step5
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


@pytest.mark.step5
def test_a_request_preempted_in_a_step_is_not_scheduled_again_in_it():
    engine = Engine(
        num_blocks=2, block_size=4, max_num_seqs=3, max_num_batched_tokens=5, max_model_len=64
    )
    a, b = req("a", 3, max_tokens=5), req("b", 6, max_tokens=2)
    engine.add(a, b)
    out = engine.schedule()
    assert rows(out) == [("a", 0, 3), ("b", 0, 2)]  # one block each: the cache is full
    engine.update(out)
    # a decodes inside its block. b's next chunk (positions 2-5) needs a second block, and
    # none is free: b preempts itself. Its freed block and the 4 tokens of budget left
    # would take a fresh 4-token chunk of b, but a step that preempted admits nobody.
    out = engine.schedule()
    assert out.preempted_ids == ("b",) and rows(out) == [("a", 3, 1)]
    assert engine.sched.get_request_counts() == (1, 1)
    engine.update(out)
    engine.run([])
    engine.assert_all_done_as_if_alone([a, b])


@pytest.mark.step5
def test_request_that_outgrows_the_cache_fails_and_keeps_its_tokens():
    engine = Engine(num_blocks=2, block_size=4, max_num_batched_tokens=16, max_model_len=128)
    grower, short = req("grower", 6, max_tokens=20), req("short", 2, max_tokens=1)
    engine.run([grower, short])
    assert grower.finish_reason is FinishReason.ERROR and grower.num_output_tokens == 3
    assert grower.status is SequenceStatus.FINISHED and "block" in grower.error
    engine.assert_all_done_as_if_alone([grower, short])


@pytest.mark.step5
@settings(PROPERTY, max_examples=150)
@given(workloads(roomy=False))
def test_any_workload_on_a_small_cache_ends_as_if_each_request_ran_alone(workload):
    settings_, requests, arrivals = workload
    engine = Engine(**settings_)
    outputs = engine.run(requests, arrivals)  # every step's invariants are checked
    assert sum(len(o.preempted_ids) for o in outputs) == engine.sched.num_preemptions
    engine.assert_all_done_as_if_alone(requests)
