"""Sampling (greedy, temperature, top-k, top-p, seeds) and the stop rule."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mini_vllm.engine.sequence import check_stop
from mini_vllm.errors import UserError
from mini_vllm.layers.sampler import Sampler, apply_top_k_top_p, make_generator
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.teaching.decode_loop import generate, generate_lockstep

sampler = Sampler()


def _draw(logits: torch.Tensor, params: SamplingParams, n: int) -> list[int]:
    generator = make_generator(params, logits.device)
    return [int(sampler(logits[None], [params], [generator])[0]) for _ in range(n)]


def test_greedy_is_argmax_row_by_row():
    torch.manual_seed(0)
    logits = torch.randn(5, 100)
    greedy = SamplingParams(temperature=0.0)
    assert torch.equal(sampler(logits, [greedy] * 5), logits.argmax(-1))


def test_seeded_sampling_is_reproducible_and_batch_independent():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    seeded = SamplingParams(temperature=1.0, seed=1234)
    assert _draw(logits[0], seeded, 20) == _draw(logits[0], seeded, 20)
    assert _draw(logits[0], seeded, 20) != _draw(
        logits[0], dataclasses.replace(seeded, seed=99), 20
    )
    # A request's draws do not depend on what else shares the batch.
    alone = int(sampler(logits[:1], [seeded], [make_generator(seeded, "cpu")])[0])
    others = [SamplingParams(temperature=0.7, seed=5), SamplingParams(temperature=0.0)]
    batch = sampler(
        logits, [seeded, *others], [make_generator(p, "cpu") for p in [seeded, *others]]
    )
    assert int(batch[0]) == alone
    assert int(batch[2]) == int(logits[2].argmax())  # the greedy row stays greedy


def test_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([0.1, 0.6, 0.3]))
    draws = _draw(logits, SamplingParams(temperature=1.0, seed=0), 3000)
    freq = torch.bincount(torch.tensor(draws), minlength=3).float() / len(draws)
    assert torch.allclose(freq, torch.tensor([0.1, 0.6, 0.3]), atol=0.03)


def test_top_k_never_picks_outside_the_k_best():
    torch.manual_seed(1)
    logits = torch.randn(200)
    allowed = set(logits.topk(5).indices.tolist())
    draws = _draw(logits, SamplingParams(temperature=2.0, top_k=5, seed=0), 500)
    assert set(draws) <= allowed and len(set(draws)) > 1


def test_top_p_never_picks_outside_the_nucleus():
    probs = torch.tensor([0.5, 0.25, 0.15, 0.05, 0.03, 0.02])
    logits = probs.log()
    # Smallest set reaching 0.8: {0, 1, 2} (0.5 + 0.25 < 0.8 <= 0.9).
    draws = _draw(logits, SamplingParams(temperature=1.0, top_p=0.8, seed=0), 2000)
    assert set(draws) == {0, 1, 2}
    # A tiny top_p keeps the most likely token only.
    assert set(_draw(logits, SamplingParams(temperature=1.0, top_p=0.01, seed=0), 200)) == {0}


def test_top_k_top_p_masks_per_row():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0], [3.0, 2.0, 1.0, 0.0]])
    out = apply_top_k_top_p(logits, torch.tensor([2, -1]), torch.tensor([1.0, 0.5]))
    assert torch.isfinite(out[0]).tolist() == [True, True, False, False]
    assert torch.isfinite(out[1]).tolist() == [True, False, False, False]  # p(3.0) = 0.64 > 0.5


def test_check_stop_rules():
    params = SamplingParams(max_tokens=3)
    assert check_stop(7, 1, params, {2}) is None
    assert check_stop(2, 1, params, {2}) == "stop"
    assert check_stop(2, 1, dataclasses.replace(params, ignore_eos=True), {2}) is None
    assert check_stop(7, 3, params, {2}) == "length"
    # The context limit: prompt + generated tokens reaching max_model_len ends the request,
    # and EOS still comes first.
    assert check_stop(7, 1, params, {2}, num_tokens=9, max_model_len=10) is None
    assert check_stop(7, 1, params, {2}, num_tokens=10, max_model_len=10) == "length"
    assert check_stop(2, 1, params, {2}, num_tokens=10, max_model_len=10) == "stop"


def test_decode_loop_stops_on_eos_and_max_tokens(tiny):
    model, _, config = tiny
    prompt = [256, 1, 2, 3]
    free = generate(model, prompt, SamplingParams(temperature=0.0, max_tokens=5))
    assert free.num_generated == 5 and free.finish_reason == "length"
    # Declare the last greedy token an EOS: generation must stop where it first appears.
    eos = free.token_ids[-1]
    model.config = dataclasses.replace(config, eos_token_id=eos)
    try:
        stopped = generate(model, prompt, SamplingParams(temperature=0.0, max_tokens=5))
        assert stopped.token_ids == free.token_ids[: free.token_ids.index(eos) + 1]
        assert stopped.finish_reason == "stop"
        ignoring = generate(
            model, prompt, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
        )
        assert ignoring.token_ids == free.token_ids
    finally:
        model.config = config


def test_lockstep_batch_matches_single_requests_and_context_limit(tiny):
    model, _, config = tiny
    prompts = [[256, 5, 6, 7], [256, 9, 9, 9]]
    params = [
        SamplingParams(temperature=0.0, max_tokens=6),
        SamplingParams(temperature=0.9, seed=7, max_tokens=4),
    ]
    batch = generate_lockstep(model, prompts, params)
    for prompt, p, result in zip(prompts, params, batch):
        assert generate(model, prompt, p).token_ids == result.token_ids
    assert [r.num_generated for r in batch] == [6, 4]
    # The context limit ends generation ("length") once prompt + output fill max_model_len,
    # as vLLM's stop check does; a prompt one short of the limit gets one token, and one
    # that fills it is refused, as vLLM's input processor refuses it (no room for a token).
    limited = generate(
        model, prompts[0], SamplingParams(temperature=0.0, max_tokens=50), max_model_len=8
    )
    assert limited.num_generated == 8 - 4 and limited.finish_reason == "length"
    last = generate(model, prompts[0], SamplingParams(max_tokens=5), max_model_len=5)
    assert (last.num_generated, last.finish_reason) == (1, "length")
    with pytest.raises(UserError, match="limit of 4 tokens"):
        generate(model, prompts[0], SamplingParams(max_tokens=1), max_model_len=4)
    with pytest.raises(UserError, match="same length"):
        generate_lockstep(model, [[1, 2], [1, 2, 3]], SamplingParams())
