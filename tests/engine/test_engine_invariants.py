"""The engine's invariants under random add / abort / step / fault sequences (hypothesis).

Whatever the order of requests (bad ones included), aborts, steps and faults injected
in the middle of steps, in synchronous and async scheduling, with and without prefix
caching:
- every KV block is free or held, and a held block's reference count is the number of
  unfinished requests whose table holds it (shared only through prefix caching);
- a finished request holds no block; every request ends exactly once;
- at the end every block is free, and every greedy request that finished normally has
  the tokens it gets when served alone.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from functools import cache

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from mini_vllm import LLM, SamplingParams
from mini_vllm.bench.reliability import FAULT_POINTS, InjectedFault, inject_fault
from mini_vllm.engine.sequence import SequenceStatus
from mini_vllm.errors import UserError

ENGINE = dict(
    max_num_seqs=4, max_model_len=40, block_size=4, num_kv_blocks=12, max_num_batched_tokens=16
)
VOCAB = 260  # the tiny model's; ids from VOCAB on are refused


@cache
def solo_tokens(prompt: tuple[int, ...], max_tokens: int) -> list[int]:
    llm = _solo_engine()
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    return llm.generate([list(prompt)], params, use_tqdm=False)[0].token_ids


@cache
def _solo_engine() -> LLM:
    return LLM("tiny", max_num_seqs=1, max_model_len=ENGINE["max_model_len"])


prompts = st.lists(st.integers(0, VOCAB + 3), min_size=0, max_size=44)


class EngineMachine(RuleBasedStateMachine):
    @initialize(async_scheduling=st.booleans(), prefix_caching=st.booleans())
    def build(self, async_scheduling, prefix_caching):
        self.llm = LLM(
            "tiny",
            async_scheduling=async_scheduling,
            enable_prefix_caching=prefix_caching,
            **ENGINE,
        )
        self.engine = self.llm.engine
        self.requests = {}  # id -> Sequence, every request ever added
        self.ended = Counter()  # id -> times it was reported finished or aborted

    def _note_ended(self, seqs):
        for seq in seqs:
            assert seq.seq_id in self.requests, f"request {seq.seq_id} ended but was never added"
            assert seq.is_finished
            self.ended[seq.seq_id] += 1

    @rule(prompt=prompts, max_tokens=st.integers(1, 10), seed=st.none() | st.integers(0, 9))
    def add(self, prompt, max_tokens, seed):
        params = SamplingParams(
            temperature=0 if seed is None else 0.9, seed=seed, max_tokens=max_tokens
        )
        if not prompt or max(prompt) >= VOCAB:
            before = self.engine.scheduler.get_request_counts()
            with pytest.raises(UserError):
                self.engine.add_request(prompt, params)
            assert self.engine.scheduler.get_request_counts() == before
            return
        seq = self.engine.add_request(prompt, params)
        assert seq.seq_id not in self.requests
        self.requests[seq.seq_id] = seq

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def abort(self, data):
        request_id = data.draw(st.sampled_from(sorted(self.requests)), label="request")
        was_open = not self.requests[request_id].is_finished
        aborted = self.engine.abort_request(request_id)
        assert len(aborted) == int(was_open)
        self._note_ended(aborted)

    @precondition(lambda self: self.engine.has_unfinished_requests())
    @rule()
    def step(self):
        self._note_ended(self.engine.step())

    @precondition(lambda self: self.engine.has_unfinished_requests())
    @rule(point=st.sampled_from(sorted(FAULT_POINTS)), at_call=st.integers(1, 3))
    def step_with_a_fault(self, point, at_call):
        with inject_fault(self.engine, point, at_call):
            try:
                self._note_ended(self.engine.step())
            except InjectedFault:
                pass

    @invariant()
    def every_block_is_held_by_exactly_its_tables(self):
        bm = self.engine.block_manager
        holders = defaultdict(list)
        for seq in self.requests.values():
            if seq.is_finished:
                assert seq.block_table == [], f"finished request {seq.seq_id} holds blocks"
            for block in seq.block_table:
                holders[block].append(seq)
        for block in range(bm.num_blocks):
            assert bm.ref_count(block) == len(holders.get(block, ()))
            if len(holders.get(block, ())) > 1:
                assert bm.enable_prefix_caching, f"block {block} given to two requests"
        assert bm.num_used_blocks == len(holders)
        assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks

    @invariant()
    def every_request_ends_at_most_once(self):
        assert all(count == 1 for count in self.ended.values()), self.ended
        for request_id, seq in self.requests.items():
            if seq.status is not SequenceStatus.FINISHED:
                assert self.ended[request_id] == 0

    def teardown(self):
        if not hasattr(self, "engine"):
            return
        for _ in range(1000):
            if not self.engine.has_unfinished_requests():
                break
            self._note_ended(self.engine.step())
        assert not self.engine.has_unfinished_requests(), "the engine does not drain"
        assert self.engine.block_manager.num_used_blocks == 0
        assert set(self.ended) == set(self.requests), "a request never ended"
        assert all(count == 1 for count in self.ended.values())
        for seq in self.requests.values():
            params = seq.sampling_params
            if params.greedy and seq.finish_reason.value in ("stop", "length"):
                expected = solo_tokens(seq.prompt_token_ids, params.max_tokens)
                assert list(seq.output_token_ids) == expected, f"request {seq.seq_id}"


EngineMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestEngineInvariants = EngineMachine.TestCase
