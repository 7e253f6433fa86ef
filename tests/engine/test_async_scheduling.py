"""Async scheduling (plan step N+1 before step N's tokens arrive) changes no request's tokens.

The tiny model on CPU: the same prompts run with and without async scheduling, under
preemption, chunked prefill, prefix caching, EOS stops and per-request max_tokens, must
produce the same tokens, the same finish reasons, and leave every block free. The
scheduler-level tests check the placeholder bookkeeping step by step.
"""

import random

import pytest

from mini_vllm import LLM, SamplingParams
from mini_vllm.engine.async_scheduler import AsyncScheduler
from mini_vllm.engine.block_manager import BlockManager
from mini_vllm.engine.scheduler import SchedulerConfig
from mini_vllm.engine.sequence import PLACEHOLDER, Sequence


def prompts(n=24, seed=1, vocab=256, longest=40):
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(1, longest))] for _ in range(n)]


def run(async_scheduling, params, **engine_kwargs):
    engine_kwargs = {"max_model_len": 128, **engine_kwargs}
    llm = LLM("tiny", async_scheduling=async_scheduling, **engine_kwargs)
    assert isinstance(llm.engine.scheduler, AsyncScheduler) == async_scheduling
    outputs = llm.generate(prompts(), params, use_tqdm=False)
    bm = llm.engine.block_manager
    assert bm.num_used_blocks == 0, "blocks left allocated after every request finished"
    assert not llm.engine.has_unfinished_requests()
    return [(o.token_ids, o.finish_reason) for o in outputs], llm


VARIED = [
    SamplingParams(temperature=0, max_tokens=1 + i % 9, ignore_eos=i % 3 == 0) for i in range(24)
]


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        dict(max_num_seqs=8),
        # A small cache forces preemption; a small token budget forces chunked prefill.
        dict(
            max_num_seqs=8,
            block_size=4,
            num_kv_blocks=20,
            max_num_batched_tokens=24,
            max_model_len=64,
        ),
        dict(max_num_seqs=4, enable_prefix_caching=True, block_size=4),
    ],
    ids=["batched", "preempt+chunked", "prefix-cache"],
)
def test_async_scheduling_gives_the_same_tokens(engine_kwargs):
    sync, _ = run(False, VARIED, **engine_kwargs)
    async_, llm = run(True, VARIED, **engine_kwargs)
    assert async_ == sync
    if engine_kwargs.get("num_kv_blocks"):
        assert llm.stats.num_preemptions > 0


def test_async_tokens_reach_the_model_when_inputs_are_staged_apart():
    """On a GPU the runner writes a step's inputs into a host staging buffer and copies it
    to the device buffer the model reads; the tokens still in flight (async scheduling)
    are written into the device buffer by the device. Written before the copy, they
    would be overwritten by the staged zeros, and every async step would feed token 0.
    On the CPU the two buffers are one; this test gives the runner a staging buffer of
    its own, as on a GPU, and async must still give the tokens of sync."""
    engine_kwargs = dict(max_num_seqs=8, max_model_len=128)
    sync, _ = run(False, VARIED, **engine_kwargs)
    llm = LLM("tiny", async_scheduling=True, **engine_kwargs)
    runner = llm.engine.runner
    runner._staging = runner._ints.clone()
    runner._view_staging()
    assert runner._staging is not runner._ints
    outputs = llm.generate(prompts(), VARIED, use_tqdm=False)
    assert [(o.token_ids, o.finish_reason) for o in outputs] == sync


def test_a_prompt_one_short_of_the_context_still_runs():
    # 127 tokens with max_model_len 128, prefilled in chunks of 32: it computes, samples
    # one token and stops on length, as with synchronous scheduling. (A prompt of 128
    # tokens leaves no room for a token: it fails, as vLLM refuses it.)
    long_prompt = [[3 + i % 200 for i in range(127)], [5, 6, 7], [3] * 128]
    params = SamplingParams(temperature=0, max_tokens=8)
    results = []
    for async_scheduling in (False, True):
        llm = LLM(
            "tiny", max_model_len=128, max_num_batched_tokens=32, async_scheduling=async_scheduling
        )
        results.append(
            [
                (o.token_ids, o.finish_reason)
                for o in llm.generate(long_prompt, params, use_tqdm=False)
            ]
        )
    assert results[0] == results[1] and results[0][0][1] == "length" and len(results[0][0][0]) == 1
    assert results[0][2][1] == "error" and len(results[0][2][0]) == 0


def test_eos_stops_throw_away_only_the_step_after():
    # The tiny model's EOS id is 2; a model that often samples it needs a sampler that
    # does: seeded random sampling at high temperature gives some early stops.
    params = [SamplingParams(temperature=1.5, seed=i, max_tokens=30) for i in range(24)]
    sync, _ = run(False, params, max_num_seqs=8)
    async_, _ = run(True, params, max_num_seqs=8)
    assert async_ == sync
    assert any(reason == "stop" for _, reason in sync), (
        "no request stopped on EOS: the test checks nothing"
    )


def async_scheduler(num_blocks=16, max_tokens=(10,)):
    """An AsyncScheduler over 4-token blocks with one request per max_tokens entry (EOS id 2)."""
    bm = BlockManager(num_blocks=num_blocks, block_size=4)
    scheduler = AsyncScheduler(
        SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64),
        bm,
        eos_token_id=2,
    )
    seqs = [
        Sequence(name, [5 + i, 6, 7], SamplingParams(temperature=0, max_tokens=n))
        for i, (name, n) in enumerate(zip("ab", max_tokens))
    ]
    for seq in seqs:
        scheduler.add_request(seq)
    return scheduler, bm, seqs


def test_placeholders_are_planned_on_and_resolved_in_order():
    scheduler, bm, (seq,) = async_scheduler(max_tokens=(3,))
    step0 = scheduler.schedule()  # prefill
    assert seq.token_ids == (5, 6, 7, PLACEHOLDER) and seq.num_computed_tokens == 3
    step1 = scheduler.schedule()  # planned before step 0's token is known
    assert (
        step1.scheduled[0].new_token_ids == (PLACEHOLDER,)
        and step1.scheduled[0].num_computed_tokens == 3
    )
    assert seq.token_ids == (5, 6, 7, PLACEHOLDER, PLACEHOLDER)
    with pytest.raises(RuntimeError, match="still in flight"):
        scheduler.schedule()  # two steps in flight at most
    with pytest.raises(RuntimeError, match="not the step in flight"):
        scheduler.update_from_output(step1, [9])  # oldest first
    assert scheduler.update_from_output(step0, [9]) == []
    assert seq.token_ids == (5, 6, 7, 9, PLACEHOLDER)
    step2 = scheduler.schedule()
    assert seq.num_output_tokens == 3  # 9 and two in flight: max_tokens is reached ...
    assert scheduler.update_from_output(step1, [10]) == []
    step3 = scheduler.schedule()
    assert step3.is_empty  # ... so the request is not planned again
    finished = scheduler.update_from_output(step2, [11])
    assert (
        finished == [seq]
        and seq.output_token_ids == (9, 10, 11)
        and seq.finish_reason.value == "length"
    )
    assert scheduler.update_from_output(step3, []) == []
    assert bm.num_used_blocks == 0


def test_eos_drops_the_token_in_flight():
    scheduler, bm, (seq,) = async_scheduler()
    step0 = scheduler.schedule()
    step1 = scheduler.schedule()
    assert scheduler.update_from_output(step0, [2]) == [seq]  # EOS
    assert seq.output_token_ids == (2,) and seq.finish_reason.value == "stop"
    assert bm.num_used_blocks == 0
    assert scheduler.update_from_output(step1, [4]) == []  # step 1's token is thrown away
    assert seq.output_token_ids == (2,)
    assert not scheduler.has_unfinished_requests()


def test_a_request_preempted_with_a_token_in_flight_can_still_stop():
    # Two 3-token prompts fill one 4-token block each; the cache has two blocks.
    scheduler, bm, (a, b) = async_scheduler(num_blocks=2, max_tokens=(10, 10))
    step0 = scheduler.schedule()  # both prefill
    step1 = scheduler.schedule()  # both decode their placeholder (position 3: no new block)
    assert scheduler.update_from_output(step0, [11, 12]) == []
    step2 = scheduler.schedule()  # a's next position needs a block: b, the newest, is preempted
    assert step2.preempted_ids == ("b",) and b.num_computed_tokens == 0
    assert b.token_ids == (6, 6, 7, 12, PLACEHOLDER)  # its step-1 token is still in flight
    assert scheduler.update_from_output(step1, [13, 2]) == [b]  # ... and it is EOS
    assert b.finish_reason.value == "stop" and b.output_token_ids == (12, 2)
    assert scheduler.get_request_counts() == (1, 0)
    assert scheduler.update_from_output(step2, [14]) == []
    assert a.output_token_ids == (11, 13, 14)


GRAPHS = dict(cudagraph_mode="full_and_piecewise", cudagraph_capture_sizes=[1, 2, 4, 8])
COMPILE_FULL = dict(
    cudagraph_mode="full_decode_only",
    cudagraph_capture_sizes=[1, 2, 4, 8],
    compilation_mode="vllm_compile",
)


# The compiled engine runs on the GPU only here: on CPU, tests/engine/test_compile.py covers it.
@pytest.mark.parametrize(
    "device, modes",
    [
        pytest.param("cpu", GRAPHS, id="cpu-graphs"),
        pytest.param("cuda", GRAPHS, id="cuda-graphs", marks=pytest.mark.gpu),
        pytest.param("cuda", COMPILE_FULL, id="cuda-compile+full", marks=pytest.mark.gpu),
    ],
)
def test_async_scheduling_under_graphs_gives_the_same_tokens(device, modes):
    # Placeholder tokens are copied into the graph's input buffer on the device, before
    # replay; the padded rows of a FULL graph and the rows of a piecewise one must not mind.
    params = [SamplingParams(temperature=0, max_tokens=2 + i % 7) for i in range(12)]
    results = []
    for async_scheduling in (False, True):
        llm = LLM(
            "tiny",
            device=device,
            dtype="float32",
            max_num_seqs=8,
            max_model_len=128,
            block_size=4,
            async_scheduling=async_scheduling,
            **modes,
        )
        outputs = llm.generate(prompts(12, seed=3), params, use_tqdm=False)
        results.append([(o.token_ids, o.finish_reason) for o in outputs])
        assert "FULL" in llm.stats.steps_per_runtime_mode
    assert results[0] == results[1]


def drive(scheduler, next_token):
    """Run a scheduler to the end as the engine does, with tokens from `next_token(seq)`.

    Synchronous: schedule, then update with that step's tokens. Async: schedule step N+1
    first, then update step N (the engine's one-step lag, LLMEngine._step_async).
    """
    in_flight = None
    while scheduler.has_unfinished_requests() or in_flight is not None:
        output = scheduler.schedule()
        tokens = [next_token(row.seq) if row.samples_token else None for row in output.scheduled]
        if not isinstance(scheduler, AsyncScheduler):
            scheduler.update_from_output(output, tokens)
            continue
        if in_flight is not None:
            scheduler.update_from_output(*in_flight)
        if output.is_empty:
            scheduler.update_from_output(output, [])
            in_flight = None
        else:
            in_flight = (output, tokens)


@pytest.mark.parametrize("prompt_len", [1, 5, 8, 13])
def test_a_request_that_outgrows_the_cache_keeps_the_same_tokens_as_with_sync(prompt_len):
    from mini_vllm.engine.scheduler import Scheduler

    results = []
    for scheduler_class in (Scheduler, AsyncScheduler):
        # 4 blocks of 4 tokens: the request fails when its 17th token needs a fifth block.
        scheduler = scheduler_class(
            SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64),
            BlockManager(num_blocks=4, block_size=4),
        )
        seq = Sequence(0, list(range(3, 3 + prompt_len)), SamplingParams(max_tokens=40))
        scheduler.add_request(seq)
        tokens = iter(range(100, 200))
        drive(scheduler, lambda s, tokens=tokens: next(tokens))
        results.append((seq.output_token_ids, seq.finish_reason, seq.error))
    assert results[0] == results[1]
    tokens, reason, error = results[0]
    assert reason == "error" and "the whole cache has 4" in error
    assert prompt_len + len(tokens) == 17  # failed when the 17th token needed a 5th block
