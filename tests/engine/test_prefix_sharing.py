"""Prefix caching within one step: requests admitted together share the blocks that step writes.

The scheduler registers the blocks a prefill row fills when it schedules the step, as vLLM's
`KVCacheManager.allocate_slots` does, so the `n` children of one prompt (or any requests with
a shared prefix) admitted in the same step compute the prefix once, and the later ones read
blocks that the same forward writes. Checked here: the attention backend writes the whole
step's K/V before any request reads the cache; the children take the prompt's blocks once
and get exactly the tokens they get without prefix caching (greedy and seeded, sync and
async); a chunked prompt registers only the blocks it has filled; and a step that fails, or
a `schedule()` cut short, leaves no block findable whose K/V was never written.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mini_vllm import LLM, SamplingParams
from mini_vllm.attention.paged import (
    PagedAttentionBackend,
    PagedAttentionMetadata,
    allocate_paged_kv_caches,
)
from mini_vllm.bench.reliability import InjectedFault, inject_fault
from mini_vllm.engine.block_manager import BlockManager, slot_mapping
from mini_vllm.engine.scheduler import Scheduler, SchedulerConfig
from mini_vllm.engine.sequence import Sequence, SequenceStatus
from mini_vllm.llm import sampling_children
from tests.engine.test_paged_attention import BLOCK, DIM, HEADS, KV_HEADS, reference_attention
from tests.engine.test_scheduler import FakePagedModel, assert_all_done_as_if_alone

PROMPT = [(7 * i + 3) % 256 for i in range(40)]  # 5 blocks of 8
GREEDY = SamplingParams(n=4, temperature=0, max_tokens=12, ignore_eos=True)
SEEDED = SamplingParams(n=4, temperature=0.8, top_k=50, seed=123, max_tokens=12, ignore_eos=True)
ENGINE = dict(max_num_seqs=8, max_model_len=128, block_size=8)


def completions(llm: LLM, prompts, params) -> list[list[list[int]]]:
    return [[c.token_ids for c in out.outputs] for out in llm.generate(prompts, params, False)]


# -- attention: every K/V of the step is in the cache before anyone reads it ---------


def test_a_row_reads_blocks_another_row_writes_in_the_same_step():
    """Row 0 computes tokens 0..11 into blocks [3, 7, 1]; rows 1 and 2 share its first two
    blocks (their tokens 0..7 are row 0's) and compute only what follows: 4 tokens, and 1
    token (a decode-like row of a mixed step). Both the batched path and the per-request
    reference must read row 0's keys of this very step."""
    torch.manual_seed(0)
    q = torch.randn(3, 12, HEADS, DIM)
    k = torch.randn(3, 12, KV_HEADS, DIM)
    v = torch.randn(3, 12, KV_HEADS, DIM)
    k[1:, :8], v[1:, :8] = k[0, :8], v[0, :8]  # the shared prefix
    tables = [[3, 7, 1], [3, 7, 4], [3, 7, 5]]
    spans = [(0, 12), (8, 12), (8, 9)]
    q_step = torch.cat([q[i, a:b] for i, (a, b) in enumerate(spans)])
    k_step = torch.cat([k[i, a:b] for i, (a, b) in enumerate(spans)])
    v_step = torch.cat([v[i, a:b] for i, (a, b) in enumerate(spans)])
    slots = sum((slot_mapping(t, a, b, BLOCK) for t, (a, b) in zip(tables, spans)), [])
    lens = [b for _, b in spans]
    md = PagedAttentionMetadata(
        torch.tensor(slots), torch.tensor(tables), torch.tensor(lens),
        [b - a for a, b in spans], lens, False,
    )  # fmt: skip
    backend = PagedAttentionBackend()
    cache = allocate_paged_kv_caches(1, 8, BLOCK, KV_HEADS, DIM, torch.float32, "cpu")[0]
    batched = backend.forward(q_step, k_step, v_step, cache, md)
    reference = backend.reference_forward(q_step, cache, md)  # after the step's write
    row = 0
    for i, (a, b) in enumerate(spans):
        for pos in range(a, b):
            expected = reference_attention(q[i, pos], k[i], v[i], pos)
            torch.testing.assert_close(batched[row], expected, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(reference[row], expected, rtol=1e-5, atol=1e-5)
            row += 1


# -- the scheduler ------------------------------------------------------------------


def make(num_blocks=64, block_size=4, **config) -> tuple[Scheduler, FakePagedModel]:
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=True)
    config = {"max_model_len": 64, "max_num_batched_tokens": 64, "max_num_seqs": 4, **config}
    return Scheduler(SchedulerConfig(**config), bm, eos_token_id=None), FakePagedModel(
        num_blocks, block_size
    )


def params(max_tokens=4, **kwargs) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kwargs)


def test_siblings_admitted_in_one_step_share_the_blocks_the_first_one_fills():
    sched, model = make()
    prompt = list(range(1, 11))  # 2 full blocks of 4, and 2 tokens
    seqs = [Sequence(i, prompt, params()) for i in range(3)]
    for seq in seqs:
        sched.add_request(seq)
    out = sched.schedule()
    assert [(r.num_computed_tokens, r.num_new_tokens) for r in out.scheduled] == [
        (0, 10), (8, 2), (8, 2),
    ]  # fmt: skip
    assert seqs[1].block_table[:2] == seqs[2].block_table[:2] == seqs[0].block_table[:2]
    assert sched.block_manager.num_used_blocks == 3 + 1 + 1
    finished = sched.update_from_output(out, model.forward(out))
    while sched.has_unfinished_requests():
        out = sched.schedule()
        finished += sched.update_from_output(out, model.forward(out))
    assert_all_done_as_if_alone(sched, seqs, finished)


def test_requests_that_want_prompt_logprobs_take_no_hits_in_the_same_step():
    sched, _ = make()
    prompt = list(range(1, 11))
    first, second = Sequence(0, prompt, params()), Sequence(1, prompt, params(prompt_logprobs=1))
    sched.add_request(first)
    sched.add_request(second)
    out = sched.schedule()
    assert [(r.num_computed_tokens, r.num_new_tokens) for r in out.scheduled] == [
        (0, 10), (0, 10),
    ]  # fmt: skip


def test_a_chunk_registers_only_the_blocks_it_fills():
    """A 20-token prompt in chunks of 10 (blocks of 4): the first step fills blocks 0 and 1
    and half of block 2; only the first two are findable while it is scheduled."""
    sched, model = make(max_num_batched_tokens=10)
    prompt = list(range(1, 21))
    seq = Sequence("a", prompt, params())
    sched.add_request(seq)
    probe = Sequence("probe", prompt + [5])
    out = sched.schedule()
    assert sched.block_manager.num_cached_tokens(probe) == 8
    sched.update_from_output(out, model.forward(out))
    out = sched.schedule()  # tokens 10..19: blocks 2, 3 and 4 fill up in this step
    assert sched.block_manager.num_cached_tokens(probe) == 20


def test_a_decode_rows_block_is_registered_only_after_its_step():
    """The Triton decode kernel stores a request's new K/V in the kernel that reads the
    cache: a block a decode completes must not be shared within its own step."""
    sched, model = make()
    seq = Sequence("a", list(range(1, 8)), params())  # 7 tokens: block 1 lacks one
    sched.add_request(seq)
    out = sched.schedule()
    sched.update_from_output(out, model.forward(out))
    probe = Sequence("probe", [*seq.tokens(0, 8), 3])
    out = sched.schedule()  # a decode at position 7 completes block 1
    assert out.is_uniform_decode and sched.block_manager.num_cached_tokens(probe) == 4
    sched.update_from_output(out, model.forward(out))
    assert sched.block_manager.num_cached_tokens(probe) == 8


def test_a_failed_step_leaves_none_of_its_blocks_findable():
    sched, model = make()
    prompt = list(range(1, 11))
    seq = Sequence("a", prompt, params())
    sched.add_request(seq)
    probe = Sequence("probe", prompt)
    sched.schedule()
    assert sched.block_manager.num_cached_tokens(probe) == 8
    sched.take_back_steps()  # the forward raised: nothing was written
    assert sched.block_manager.num_cached_tokens(probe) == 0
    assert sched.block_manager.num_used_blocks == 0


def test_a_schedule_cut_short_leaves_none_of_its_blocks_findable():
    """The first request's blocks are registered, then the second's allocation raises:
    no row was returned, yet the first request's blocks must leave the cache."""
    sched, _ = make(num_blocks=16)
    a, b = Sequence("a", list(range(1, 11)), params()), Sequence("b", [9] * 10, params())
    sched.add_request(a)
    sched.add_request(b)
    bm = sched.block_manager
    original, calls = bm._take_free_block, []

    def faulty():
        calls.append(1)
        if len(calls) == 4:  # a took 3 blocks; b's first one fails
            raise InjectedFault("allocation")
        return original()

    bm._take_free_block = faulty
    with pytest.raises(InjectedFault):
        sched.schedule()
    bm._take_free_block = original
    sched.take_back_steps()
    assert bm.num_cached_tokens(Sequence("probe", a.tokens(0, 10))) == 0
    assert bm.num_used_blocks == 0 and a.status is b.status is SequenceStatus.WAITING


def test_a_request_aborted_before_its_step_failed_leaves_none_of_its_blocks_findable():
    """Its table is gone, but the row of the step in flight still says which blocks the
    step was to fill."""
    sched, _ = make()
    prompt = list(range(1, 11))
    sched.add_request(Sequence("a", prompt, params()))
    sched.schedule()
    sched.finish_requests(["a"])
    sched.take_back_steps()
    assert sched.block_manager.num_cached_tokens(Sequence("probe", prompt)) == 0


def test_an_aborted_requests_blocks_stay_shared_once_its_step_has_run():
    """Abort with the step in flight: the step still writes the blocks (it runs every row),
    so a request admitted after it may hit them."""
    sched, model = make()
    prompt = list(range(1, 11))
    a = Sequence("a", prompt, params())
    sched.add_request(a)
    out = sched.schedule()
    sched.finish_requests(["a"])
    sched.update_from_output(out, model.forward(out))
    b = Sequence("b", prompt, params())
    sched.add_request(b)
    out = sched.schedule()
    assert [(r.num_computed_tokens, r.num_new_tokens) for r in out.scheduled] == [(8, 2)]
    finished = sched.update_from_output(out, model.forward(out))
    while sched.has_unfinished_requests():
        out = sched.schedule()
        finished += sched.update_from_output(out, model.forward(out))
    assert_all_done_as_if_alone(sched, [b], finished)


class FailingStep(Exception):
    pass


def corrupt(model: FakePagedModel, out) -> None:
    """A forward that fails half-way: the slots it was to write hold nothing right."""
    for row in out.scheduled:
        for slot in slot_mapping(row.block_table, row.num_computed_tokens, row.context_len, 4):
            model.kv[slot] = (-1, -1)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    num_blocks=st.integers(8, 24),
    max_num_seqs=st.integers(1, 4),
    budget=st.integers(4, 24),
    specs=st.lists(
        st.tuples(
            st.lists(st.integers(1, 2), min_size=1, max_size=14),  # shared prefixes
            st.integers(1, 8),  # max_tokens
            st.integers(0, 4),  # arrival step
        ),
        min_size=1,
        max_size=6,
    ),
    faults=st.dictionaries(st.integers(0, 30), st.sampled_from(["forward", "schedule"])),
)
def test_any_workload_with_failed_steps_ends_as_if_each_request_ran_alone(
    num_blocks, max_num_seqs, budget, specs, faults
):
    """Failed steps write garbage where their K/V should go, or cut `schedule()` short
    (a block allocation raises); after each, the scheduler takes the step back. The fake
    model checks every K/V it reads: a hit on a block of a failed step fails it."""
    sched, model = make(
        num_blocks, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=48
    )
    bm = sched.block_manager
    requests = [Sequence(i, p, params(m)) for i, (p, m, _) in enumerate(specs)]
    pending = sorted(((a, i) for i, (*_, a) in enumerate(specs)), reverse=True)
    reported, step = [], 0
    while pending or sched.has_unfinished_requests():
        while pending and pending[-1][0] <= step:
            sched.add_request(requests[pending.pop()[1]])
        fault = faults.get(step)
        step += 1
        assert step < 3000
        if fault == "schedule":
            original = bm._take_free_block

            def faulty():
                raise FailingStep

            bm._take_free_block = faulty
            try:
                out = sched.schedule()
            except FailingStep:
                out = None
            finally:
                bm._take_free_block = original
            if out is not None:  # it took no block: fail its forward instead
                corrupt(model, out)
            sched.take_back_steps()
            continue
        out = sched.schedule()
        if fault == "forward":
            corrupt(model, out)
            sched.take_back_steps()
            continue
        reported += sched.update_from_output(out, model.forward(out))
    assert len(set(map(id, reported))) == len(reported), "a request was reported twice"
    assert_all_done_as_if_alone(sched, requests, reported)


# -- the engine: LLM.generate with n > 1 ----------------------------------------------


@pytest.fixture(scope="module")
def without_caching():
    llm = LLM("tiny", **ENGINE)
    return {
        "greedy": completions(llm, [PROMPT], GREEDY),
        "seeded": completions(llm, [PROMPT], SEEDED),
    }


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
def test_n_children_compute_the_prompt_once_and_keep_their_tokens(
    async_scheduling, sampling, without_caching
):
    sp = GREEDY if sampling == "greedy" else SEEDED
    llm = LLM("tiny", enable_prefix_caching=True, async_scheduling=async_scheduling, **ENGINE)
    engine = llm.engine
    children = [engine.add_request(PROMPT, child) for child in sampling_children(sp)]
    engine.step()
    # The first child computes the 40 tokens (5 blocks); each other one shares 4 blocks
    # (a prompt's last token is always computed) and computes the last 8 tokens.
    assert engine.runner.last_step.num_prefill_tokens == 40 + 3 * 8
    assert engine.block_manager.num_used_blocks == 5 + 3 * 1
    assert all(c.block_table[:4] == children[0].block_table[:4] for c in children)
    while engine.has_unfinished_requests():
        engine.step()
    assert [list(c.output_token_ids) for c in children] == without_caching[sampling][0]
    assert engine.block_manager.num_used_blocks == 0
    # And through LLM.generate, where the prompt's blocks are found cached from above.
    assert completions(llm, [PROMPT], sp) == without_caching[sampling]


def test_two_prompts_with_a_shared_prefix_admitted_together_share_it():
    prompts = [PROMPT[:32] + [11, 12, 13], PROMPT[:32] + [21, 22, 23, 24, 25]]
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    expected = completions(LLM("tiny", **ENGINE), prompts, sp)
    llm = LLM("tiny", enable_prefix_caching=True, **ENGINE)
    assert completions(llm, prompts, sp) == expected
    assert llm.stats.prefill_tokens == 35 + (37 - 32)


def test_a_chunked_prompt_shared_in_the_step_that_completes_its_block():
    """Chunks of 28 tokens: the first fills blocks 0-2 and half of block 3. In the second
    step the child admitted behind the rest of the prompt shares blocks 0-3, block 3 half
    written by the step before and half by this one."""
    sp = SamplingParams(n=2, temperature=0, max_tokens=10, ignore_eos=True)
    kwargs = dict(ENGINE, max_num_batched_tokens=28)
    expected = completions(LLM("tiny", **kwargs), [PROMPT], sp)
    llm = LLM("tiny", enable_prefix_caching=True, **kwargs)
    engine = llm.engine
    first, second = [engine.add_request(PROMPT, child) for child in sampling_children(sp)]
    engine.step()
    probe = Sequence("probe", PROMPT)
    assert engine.block_manager.num_cached_tokens(probe) == 24  # not the half-full block 3
    engine.step()
    assert (first.num_computed_tokens, second.num_computed_tokens) == (40, 40)
    assert engine.runner.last_step.num_prefill_tokens == 12 + 8
    while engine.has_unfinished_requests():
        engine.step()
    assert [[list(first.output_token_ids), list(second.output_token_ids)]] == expected


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_forward_that_raises_leaves_no_unwritten_block_findable(
    async_scheduling, without_caching
):
    llm = LLM("tiny", enable_prefix_caching=True, async_scheduling=async_scheduling, **ENGINE)
    engine = llm.engine
    # A first prompt fills the cache with K/V that is right for it, wrong for PROMPT.
    llm.generate([[5] * 40], SamplingParams(max_tokens=2), use_tqdm=False)
    with inject_fault(engine, "forward", 1), pytest.raises(InjectedFault):
        llm.generate([PROMPT], GREEDY, use_tqdm=False)
    assert engine.block_manager.num_cached_tokens(Sequence("probe", PROMPT)) == 0
    assert engine.block_manager.num_used_blocks == 0
    assert completions(llm, [PROMPT], GREEDY) == without_caching["greedy"]
