"""The sampling options beyond temperature, top-k and top-p: each against transformers'
logits processor for it, or a hand computation, and end to end through the engine.

min_p, presence / frequency / repetition penalties, logit_bias, min_tokens and
stop_token_ids (mini_vllm/layers/logits_processors.py, mini_vllm/engine/sequence.py).
"""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
)

from mini_vllm import LLM, SamplingParams
from mini_vllm.errors import UserError
from mini_vllm.layers.logits_processors import (
    SamplingBatch,
    apply_min_p,
    apply_min_tokens,
    apply_penalties,
)
from mini_vllm.layers.sampler import Sampler

VOCAB = 40
EOS = 2


def batch_for(params, histories):
    return SamplingBatch.build(params, histories, [EOS], VOCAB, torch.device("cpu"))


def test_repetition_penalty_equals_transformers():
    torch.manual_seed(0)
    logits = torch.randn(3, VOCAB) * 3
    histories = [([1, 5, 5, 9], [7, 7]), ([3], []), ([4, 4], [12])]
    for penalty in (1.3, 0.7):
        params = [SamplingParams(repetition_penalty=penalty)] * 3
        ours = apply_penalties(logits.clone(), batch_for(params, histories))
        for row, (prompt, generated) in enumerate(histories):
            ids = torch.tensor([prompt + generated])
            theirs = RepetitionPenaltyLogitsProcessor(penalty)(ids, logits[row : row + 1].clone())
            torch.testing.assert_close(ours[row], theirs[0])


def test_frequency_and_presence_penalties_by_hand():
    logits = torch.zeros(2, VOCAB)
    params = [
        SamplingParams(frequency_penalty=0.5, presence_penalty=1.0),
        SamplingParams(),  # no option: its row must not change
    ]
    histories = [([8, 8, 8], [3, 3, 5]), ([3, 5], [3, 3])]
    out = apply_penalties(logits.clone(), batch_for(params, histories))
    expected = torch.zeros(VOCAB)
    expected[3] = -(2 * 0.5 + 1.0)  # generated twice
    expected[5] = -(1 * 0.5 + 1.0)  # once; the prompt's 8s do not count
    torch.testing.assert_close(out[0], expected)
    torch.testing.assert_close(out[1], torch.zeros(VOCAB))


def test_min_p_equals_transformers():
    torch.manual_seed(1)
    logits = torch.randn(2, VOCAB) * 2
    for min_p in (0.05, 0.3):
        ours = apply_min_p(logits.clone(), torch.full((2,), min_p))
        theirs = MinPLogitsWarper(min_p, min_tokens_to_keep=1)(None, logits.clone())
        assert torch.equal(torch.isinf(ours), torch.isinf(theirs))


def test_min_tokens_equals_transformers():
    logits = torch.randn(1, VOCAB)
    params = [SamplingParams(min_tokens=3, max_tokens=8)]
    for generated in ([], [4, 4], [4, 4, 4]):
        ours = apply_min_tokens(logits.clone(), batch_for(params, [([1, 1], generated)]).banned)
        ids = torch.tensor([[1, 1] + generated])
        theirs = MinNewTokensLengthLogitsProcessor(2, 3, EOS)(ids, logits.clone())
        torch.testing.assert_close(ours, theirs)


def test_logit_bias_and_greedy_rows_see_the_processed_logits():
    logits = torch.zeros(2, VOCAB)
    logits[:, 10] = 5.0
    params = [SamplingParams(temperature=0, logit_bias={20: 9.0}), SamplingParams(temperature=0)]
    histories = [([1], []), ([1], [])]
    tokens = Sampler()(logits, params, None, batch_for(params, histories))
    assert tokens.tolist() == [20, 10]


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", max_num_seqs=4, max_model_len=128)


def greedy(llm, prompt, **options):
    params = SamplingParams(temperature=0, max_tokens=12, **options)
    return llm.generate([prompt], params, use_tqdm=False)[0]


def test_a_stop_token_ends_the_request_and_is_its_stop_reason(llm):
    prompt = [5, 9, 13]
    free = greedy(llm, prompt, ignore_eos=True)
    stop = free.token_ids[4]
    first = free.token_ids.index(stop)
    out = greedy(llm, prompt, ignore_eos=True, stop_token_ids=[stop])
    assert out.token_ids == free.token_ids[: first + 1]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop
    assert free.outputs[0].stop_reason is None


def test_min_tokens_holds_off_a_stop_token(llm):
    prompt = [5, 9, 13]
    free = greedy(llm, prompt, ignore_eos=True)
    stop = free.token_ids[0]
    out = greedy(llm, prompt, ignore_eos=True, stop_token_ids=[stop], min_tokens=4)
    assert len(out.token_ids) >= 4 and stop not in out.token_ids[:4]


def test_a_huge_logit_bias_forces_the_token(llm):
    out = greedy(llm, [5, 9, 13], ignore_eos=True, logit_bias={77: 100.0})
    assert out.token_ids == [77] * 12


def test_rows_with_different_options_equal_each_run_alone(llm):
    prompts = [[5, 9, 13], [7, 7, 7, 7], [11, 3]]
    options = [
        dict(repetition_penalty=1.5),
        dict(frequency_penalty=1.0, presence_penalty=0.5),
        dict(min_p=0.2, temperature=0.8, seed=3),
    ]
    params = [
        SamplingParams(**{"temperature": 0, "max_tokens": 12, "ignore_eos": True, **o})
        for o in options
    ]
    together = llm.generate(prompts, params, use_tqdm=False)
    alone = [llm.generate([p], sp, use_tqdm=False)[0] for p, sp in zip(prompts, params)]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    plain = greedy(llm, prompts[0], ignore_eos=True)
    assert together[0].token_ids != plain.token_ids, "the penalty changed nothing"


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (dict(min_p=1.5), "min_p"),
        (dict(presence_penalty=3), "presence_penalty"),
        (dict(frequency_penalty=-2.5), "frequency_penalty"),
        (dict(repetition_penalty=0), "repetition_penalty"),
        (dict(min_tokens=20, max_tokens=10), "min_tokens"),
        (dict(stop_token_ids="2"), "stop_token_ids"),
        (dict(stop_token_ids=[-1]), "stop_token_ids"),
        (dict(logit_bias={"a": 1.0}), "logit_bias"),
        (dict(logit_bias={3: float("inf")}), "logit_bias"),
    ],
)
def test_bad_options_are_refused_naming_them(options, named):
    with pytest.raises(UserError, match=named):
        SamplingParams(**options)


def test_a_stop_string_ends_the_request_and_cuts_the_text_there(llm):
    prompt = [5, 9, 13]
    free = greedy(llm, prompt, ignore_eos=True)
    assert len(free.text) > 6, free.text
    stop = free.text[3:6]
    at = free.text.find(stop)
    out = greedy(llm, prompt, ignore_eos=True, stop=[stop, "never appears"])
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop
    assert out.text == free.text[:at]
    assert out.token_ids == free.token_ids[: len(out.token_ids)]
    assert len(out.token_ids) < len(free.token_ids)
    kept = greedy(llm, prompt, ignore_eos=True, stop=stop, include_stop_str_in_output=True)
    assert kept.text == free.text[: at + len(stop)]
    # Beside requests without stop strings, each gets what it gets alone.
    params = [
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop]),
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
    ]
    both = llm.generate([prompt, [7, 8]], params, use_tqdm=False)
    assert (
        both[0].text == out.text
        and both[1].token_ids == greedy(llm, [7, 8], ignore_eos=True).token_ids
    )


@pytest.mark.parametrize("bad", [[""], [3], "", 5])
def test_bad_stop_strings_are_refused(bad):
    with pytest.raises(UserError, match="stop"):
        SamplingParams(stop=bad)


def test_logprobs_are_the_models_and_rank_the_tokens(llm):
    from mini_vllm.bench.harness import transformers_twin

    prompt = [5, 9, 13]
    out = greedy(llm, prompt, ignore_eos=True, logprobs=3).outputs[0]
    assert len(out.logprobs) == len(out.token_ids) == 12
    hf = transformers_twin(llm.engine.model)
    with torch.inference_mode():
        logits = hf(torch.tensor([prompt + out.token_ids])).logits[0].float()
    expected = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1]
    for place, (token, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        assert entry[token].rank == 1  # greedy: the most likely token
        assert entry[token].logprob == pytest.approx(float(expected[place, token]), abs=1e-4)
        top3 = expected[place].topk(3)
        assert sorted(entry) == sorted(top3.indices.tolist())
    assert out.cumulative_logprob == pytest.approx(
        sum(entry[t].logprob for t, entry in zip(out.token_ids, out.logprobs))
    )
    plain = greedy(llm, prompt, ignore_eos=True).outputs[0]
    assert plain.logprobs is None and plain.token_ids == out.token_ids


@pytest.mark.parametrize("staged_apart", [False, True], ids=["cpu", "staged-as-on-a-gpu"])
def test_logprobs_under_async_scheduling_equal_the_synchronous_ones(staged_apart):
    """Under async scheduling the log-probabilities reach the host a step later, with the
    sampled ids (`SampledTokens.get`); each request gets the values of a synchronous engine,
    under preemption and chunked prefill too, and so does a request without them."""
    options = dict(
        max_num_seqs=4, max_model_len=40, block_size=4, num_kv_blocks=10, max_num_batched_tokens=16
    )
    prompts = [[5 + i, 9, 13 + 2 * i] * (1 + i % 3) for i in range(6)]
    params = [
        SamplingParams(temperature=0.7, seed=i, max_tokens=16, logprobs=None if i == 2 else i % 4)
        for i in range(6)
    ]
    sync = LLM("tiny", **options).generate(prompts, params, use_tqdm=False)
    async_llm = LLM("tiny", async_scheduling=True, **options)
    if staged_apart:  # a staging buffer of its own, as on a GPU
        runner = async_llm.engine.runner
        runner._staging = runner._ints.clone()
        runner._view_staging()
    got = async_llm.generate(prompts, params, use_tqdm=False)
    assert async_llm.stats.num_preemptions > 0
    for a, b in zip(got, sync):
        (a, b) = (a.outputs[0], b.outputs[0])
        assert a.token_ids == b.token_ids
        assert (a.logprobs is None) == (b.logprobs is None)
        if b.logprobs is not None:
            assert [sorted(e) for e in a.logprobs] == [sorted(e) for e in b.logprobs]
            for x, y in zip(a.logprobs, b.logprobs):
                assert all(x[t].logprob == pytest.approx(y[t].logprob) for t in y)
                assert all(x[t].rank == y[t].rank for t in y)


def test_n_completions_are_drawn_each_on_its_own(llm):
    prompt = [5, 9, 13]
    (out,) = llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=6, n=3), use_tqdm=False
    )
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) == 1  # greedy: all alike
    seeded = SamplingParams(temperature=1.0, max_tokens=12, n=3, seed=5, ignore_eos=True)
    (out,) = llm.generate([prompt], seeded, use_tqdm=False)
    each = [
        llm.generate(
            [prompt],
            SamplingParams(temperature=1.0, max_tokens=12, seed=5 + i, ignore_eos=True),
            use_tqdm=False,
        )[0].token_ids
        for i in range(3)
    ]
    assert [c.token_ids for c in out.outputs] == each
    unseeded = SamplingParams(temperature=1.0, max_tokens=12, n=4, ignore_eos=True)
    (out,) = llm.generate([prompt], unseeded, use_tqdm=False)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_a_bad_n_is_refused(bad):
    with pytest.raises(UserError, match="n "):
        SamplingParams(n=bad)


PENALISED_ENGINE = dict(
    max_num_seqs=4, max_model_len=40, block_size=4, num_kv_blocks=10, max_num_batched_tokens=16
)


def penalised_tokens(llm: LLM) -> list[list[int]]:
    """Six requests, five with penalties, seeded sampling: under PENALISED_ENGINE they are
    preempted and their prompts chunked."""
    prompts = [[5 + i, 9, 13 + 2 * i, 9, 5 + i] * (1 + i % 2) for i in range(6)]
    params = [
        SamplingParams(
            temperature=0.8,
            seed=i,
            max_tokens=18,
            ignore_eos=True,
            presence_penalty=0.0 if i % 3 == 2 else 1.5,
            frequency_penalty=0.5 * (i % 2),
            repetition_penalty=1.0 + 0.4 * (i % 3 == 0),
        )
        for i in range(6)
    ]
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def test_penalty_counts_kept_on_the_device_equal_counts_rebuilt_each_step():
    """The engine counts each penalised request's tokens once, then adds each sampled
    token on the device. Rebuilding the counts from the token lists before every step
    (the readable way) must give the same tokens, under preemption and chunked prefill;
    so must async scheduling, whose tokens in flight are counted on the device too."""
    llm = LLM("tiny", **PENALISED_ENGINE)
    kept = penalised_tokens(llm)
    penalties = llm.engine.runner._penalties
    assert llm.stats.num_preemptions > 0
    assert penalties.num_built == 5  # once a penalised request, preemptions included
    assert not penalties.slot_of  # every slot given back

    rebuilt_llm = LLM("tiny", **PENALISED_ENGINE)
    runner = rebuilt_llm.engine.runner
    execute = runner.execute_model

    def execute_counting_again(*args, **kwargs):
        if runner._penalties is not None:
            runner._penalties.reset()  # every penalised request counted from its tokens
        return execute(*args, **kwargs)

    runner.execute_model = execute_counting_again
    assert penalised_tokens(rebuilt_llm) == kept
    assert runner._penalties.num_built > 20

    async_llm = LLM("tiny", async_scheduling=True, **PENALISED_ENGINE)
    assert penalised_tokens(async_llm) == kept


@pytest.mark.parametrize(
    "engine",
    [
        dict(max_num_batched_tokens=64),
        dict(max_num_batched_tokens=5),  # prompts in chunks of up to 5 tokens
        dict(max_num_batched_tokens=8, async_scheduling=True),
        dict(enable_prefix_caching=True, block_size=4),
    ],
    ids=["whole", "chunked", "async", "prefix-cache"],
)
def test_prompt_logprobs_are_the_models(engine):
    """Each prompt token after the first gets the log-probability the model gives it after
    the tokens before it (transformers' forward over the prompt), with its rank and the
    most likely alternatives; the first gets None, as in vLLM. A request that asks for them
    is computed in full even when its prefix is cached."""
    from mini_vllm.bench.harness import transformers_twin

    llm = LLM("tiny", max_num_seqs=4, max_model_len=64, **engine)
    prompts = [[5 + (7 * i) % 40 for i in range(13)], [9, 8, 7, 6, 5, 4, 3]]
    if engine.get("enable_prefix_caching"):  # the first prompt's blocks are cached by then
        llm.generate([prompts[0]], SamplingParams(max_tokens=1), use_tqdm=False)
    params = [SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=k) for k in (2, 0)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    hf = transformers_twin(llm.engine.model)
    for out, prompt, k in zip(outs, prompts, (2, 0)):
        with torch.inference_mode():
            expected = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
        for place in range(1, len(prompt)):
            entry, token = out.prompt_logprobs[place], prompt[place]
            row = expected[place - 1]
            assert entry[token].logprob == pytest.approx(float(row[token]), abs=1e-4)
            assert entry[token].rank == int((row > row[token]).sum()) + 1
            assert set(row.topk(k).indices.tolist()) <= set(entry) if k else set(entry) == {token}
    plain = llm.generate([prompts[1]], SamplingParams(max_tokens=2), use_tqdm=False)[0]
    assert plain.prompt_logprobs is None
