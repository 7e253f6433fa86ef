"""The engine end to end on the tiny model: continuous batching changes nothing a request sees.

32 prompts of random lengths run together under a KV budget small enough to force
preemption; each output must equal the same prompt run alone, no request may be lost
or duplicated, and every block must be free afterwards.
"""

import random

import pytest

from mini_vllm import LLM, SamplingParams
from mini_vllm.engine.model_inputs import pad_inputs, prepare_inputs

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def random_prompts(n=32, seed=0, vocab=256, longest=40):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(1, longest))] for _ in range(n)]


@pytest.fixture(scope="module")
def alone_outputs():
    llm = LLM("tiny", max_num_seqs=1, max_model_len=128)
    return [llm.generate([p], GREEDY, use_tqdm=False)[0].token_ids for p in random_prompts()]


def test_batched_with_preemption_equals_each_prompt_alone(alone_outputs):
    # 20 blocks of 4 tokens hold 80 tokens: the longest request (40 + 24) fits alone,
    # but eight running together do not, so the scheduler must preempt.
    llm = LLM(
        "tiny",
        max_num_seqs=8,
        max_model_len=64,
        block_size=4,
        num_kv_blocks=20,
        max_num_batched_tokens=64,
    )
    outputs = llm.generate(random_prompts(), GREEDY, use_tqdm=False)
    assert llm.stats.num_preemptions > 0
    assert [o.token_ids for o in outputs] == alone_outputs
    assert [
        o.prompt_token_ids for o in outputs
    ] == random_prompts()  # prompt order, none lost or duplicated
    assert len({o.request_id for o in outputs}) == len(outputs)
    assert all(o.finish_reason == "length" and len(o.token_ids) == 24 for o in outputs)
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == 20 and bm.num_used_blocks == 0


def test_batching_actually_batches_and_stats_add_up(alone_outputs):
    llm = LLM("tiny", max_num_seqs=8, max_model_len=128)
    outputs = llm.generate(random_prompts(), GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outputs] == alone_outputs
    stats = llm.stats
    assert max(stats.batch_size_histogram) == 8
    assert sum(stats.batch_size_histogram.values()) == stats.num_steps
    assert stats.prefill_tokens == sum(len(p) for p in random_prompts())
    # Every generated token but each request's first comes from a decode row.
    assert stats.decode_tokens == 32 * (24 - 1)
    assert stats.steps_per_runtime_mode == {"NONE": stats.num_steps}


def test_bad_prompts_fail_alone_with_a_reason():
    llm = LLM("tiny", max_num_seqs=4, max_model_len=64)
    outputs = llm.generate(
        [[5, 6, 7], [], [1] * 100, [8, 9]],
        SamplingParams(temperature=0, max_tokens=4),
        use_tqdm=False,
    )
    assert [o.finish_reason for o in outputs] == ["length", "error", "error", "length"]
    assert "empty" in outputs[1].error
    assert "100 tokens" in outputs[2].error and "max_model_len=64" in outputs[2].error
    assert len(outputs[0].token_ids) == 4 and len(outputs[3].token_ids) == 4
    assert llm.stats.num_failed_requests == 2


@pytest.mark.parametrize(
    "bad", [dict(max_tokens=0), dict(temperature=-1), dict(top_p=0), dict(beam_width=4)]
)
def test_bad_sampling_options_are_rejected_up_front(bad):
    with pytest.raises(ValueError) as info:
        SamplingParams(**bad)
    assert next(iter(bad)) in str(info.value)


def test_unknown_engine_option_lists_the_known_ones():
    with pytest.raises(ValueError, match="max_num_seqs"):
        LLM("tiny", max_num_sequences=4)


def test_text_prompts_use_the_model_tokenizer():
    llm = LLM("tiny", max_num_seqs=2, max_model_len=64)
    out = llm.generate("hello", SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)[0]
    assert out.prompt == "hello" and out.prompt_token_ids and len(out.token_ids) == 3


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch():
    params = SamplingParams(temperature=1.0, top_k=20, seed=7, max_tokens=8, ignore_eos=True)
    prompts = random_prompts(n=6, seed=3)
    alone = LLM("tiny", max_num_seqs=1, max_model_len=128).generate(
        [prompts[2]], params, use_tqdm=False
    )[0]
    batched = LLM("tiny", max_num_seqs=6, max_model_len=128).generate(
        prompts, params, use_tqdm=False
    )[2]
    assert alone.token_ids == batched.token_ids


def test_prepare_and_pad_inputs_of_a_mixed_batch():
    from mini_vllm.engine.block_manager import BlockManager
    from mini_vllm.engine.scheduler import Scheduler, SchedulerConfig
    from mini_vllm.engine.sequence import Sequence

    scheduler = Scheduler(
        SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64),
        BlockManager(16, 4),
    )
    scheduler.add_request(Sequence(0, [10, 11, 12, 13, 14], GREEDY))
    out = scheduler.schedule()
    scheduler.update_from_output(out, [99])
    scheduler.add_request(Sequence(1, [20, 21, 22], GREEDY))
    out = scheduler.schedule()  # request 0 decodes one token, request 1 prefills three
    inputs = prepare_inputs(out)
    table0, table1 = (list(row.block_table) for row in out.scheduled)
    assert inputs.input_ids == [99, 20, 21, 22]
    assert inputs.positions == [5, 0, 1, 2]
    assert inputs.slot_mapping == [
        table0[1] * 4 + 1,
        table1[0] * 4,
        table1[0] * 4 + 1,
        table1[0] * 4 + 2,
    ]
    assert inputs.query_lens == [1, 3] and inputs.seq_lens == [6, 3]
    assert inputs.query_start_loc == [0, 1, 4]
    assert inputs.logits_indices == [0, 3] and not inputs.uniform_decode
    padded = pad_inputs(inputs, 8)
    assert padded.slot_mapping[4:] == [-1] * 4 and padded.input_ids[4:] == [0] * 4
    assert padded.query_lens == [1, 3] and padded.num_real_tokens == 4


@pytest.mark.real_weights
def test_real_smollm2_batched_with_preemption_equals_each_prompt_alone(smollm2):
    """The same check on the real SmolLM2-135M weights (float32, CPU)."""
    model, tokenizer, _ = smollm2
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = random_prompts(seed=1, vocab=model.config.vocab_size)
    alone = LLM.from_model(model, tokenizer, max_num_seqs=1, max_model_len=64)
    expected = [alone.generate([p], params, use_tqdm=False)[0].token_ids for p in prompts]
    # 16 blocks of 4 tokens: the longest request (40 + 12) fits alone, eight together do not.
    llm = LLM.from_model(
        model,
        tokenizer,
        max_num_seqs=8,
        max_model_len=64,
        block_size=4,
        num_kv_blocks=16,
        max_num_batched_tokens=64,
    )
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.stats.num_preemptions > 0
    assert [o.token_ids for o in outputs] == expected
    assert [o.prompt_token_ids for o in outputs] == prompts
    assert llm.engine.block_manager.num_free_blocks == 16


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_an_engine_that_cannot_progress_says_so_instead_of_looping(async_scheduling):
    llm = LLM("tiny", max_model_len=64, async_scheduling=async_scheduling)
    llm.engine.scheduler._may_schedule = lambda seq: False  # a scheduler that never plans anything
    with pytest.raises(RuntimeError, match="planned nothing"):
        llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)


# Every engine mode the CPU runs; the compiled ones are where a process-wide registry of
# layers (or a backend that holds the model) would keep a dropped engine's cache alive.
LIFETIME_MODES = {
    "eager": dict(),
    "cpu graphs": dict(cudagraph_mode="full_and_piecewise"),
    "async": dict(async_scheduling=True),
    "vllm_compile": dict(compilation_mode="vllm_compile", cudagraph_mode="full_and_piecewise"),
    "stock_torch_compile": dict(compilation_mode="stock_torch_compile", cudagraph_mode="none"),
}


@pytest.mark.parametrize("mode", LIFETIME_MODES)
def test_dropping_an_engine_frees_its_model_and_kv_cache(mode):
    import gc
    import weakref

    llm = LLM("tiny", max_num_seqs=2, max_model_len=64, **LIFETIME_MODES[mode])
    llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)
    caches = [weakref.ref(cache) for cache in llm.engine.runner.kv_caches]
    model = weakref.ref(llm.engine.model)
    del llm
    gc.collect()
    assert model() is None, "something outside the engine still holds its model"
    assert all(cache() is None for cache in caches), "the KV cache outlived its engine"


def test_a_model_that_outlives_its_engine_lets_the_cache_go(tiny):
    import gc
    import weakref

    model, _, _ = tiny
    first = LLM.from_model(model, max_num_seqs=2, max_model_len=64)
    expected = first.generate([[1, 2, 3]], GREEDY, use_tqdm=False)[0].token_ids
    caches = [weakref.ref(cache) for cache in first.engine.runner.kv_caches]
    del first
    gc.collect()
    assert all(cache() is None for cache in caches), (
        "the shared model's layers kept the dropped engine's cache"
    )
    second = LLM.from_model(model, max_num_seqs=2, max_model_len=64)  # the model still serves
    assert second.generate([[1, 2, 3]], GREEDY, use_tqdm=False)[0].token_ids == expected


# The equality tests above prove something only if a wrong KV cache changes the output.
def test_the_tiny_models_output_depends_on_the_whole_prompt():
    llm = LLM("tiny", max_num_seqs=8, max_model_len=128)
    prompts = random_prompts(n=16, seed=5, longest=20)
    prompts = [p + [7, 8] for p in prompts]  # the same last tokens everywhere
    first_changed = [[(p[0] + 1) % 256, *p[1:]] for p in prompts]
    a = llm.generate(prompts, GREEDY, use_tqdm=False)
    b = llm.generate(first_changed, GREEDY, use_tqdm=False)
    assert sum(x.token_ids != y.token_ids for x, y in zip(a, b)) >= 12


def test_a_corrupted_kv_block_changes_the_tiny_models_output():
    import torch

    llm = LLM("tiny", max_num_seqs=1, max_model_len=128, block_size=4)
    engine = llm.engine
    changed = 0
    for prompt in random_prompts(n=8, seed=6, longest=20):
        prompt = prompt + [9] * 8  # at least two blocks
        clean = llm.generate([prompt], GREEDY, use_tqdm=False)[0].token_ids
        seq = engine.add_request(prompt, GREEDY)
        engine.step()  # the prefill: the prompt's K/V is in the cache now
        with torch.no_grad():
            for cache in engine.runner.kv_caches:
                cache[:, seq.block_table[0]].normal_(generator=torch.Generator().manual_seed(0))
        while engine.has_unfinished_requests():
            engine.step()
        changed += list(seq.output_token_ids) != clean
    assert changed >= 6
