"""From logits to the next token of each sequence.

vLLM counterpart: vllm/v1/sample/sampler.py (`Sampler.forward`: temperature, then
top-k/top-p, then a random draw or argmax), vllm/v1/sample/ops/topk_topp_sampler.py
(`apply_top_k_top_p`, `random_sample`). nano-vllm: nanovllm/layers/sampler.py. When a
sequence stops is decided after the sample, by `check_stop` in mini_vllm/engine/sequence.py.

One row of logits per sequence, each with its own `SamplingParams` and, for a seeded
request, its own `torch.Generator`, so a request's tokens do not depend on what else
is in the batch (the rows without a seed share one draw from torch's generator). The
random draw uses the "exponential race": argmax(p_i / E_i) with
E_i ~ Exp(1) picks token i with probability p_i, like `torch.multinomial`, but is one
elementwise op and an argmax (vLLM's `random_sample` does the same).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from mini_vllm.layers.logits_processors import (
    SamplingBatch,
    apply_logit_bias,
    apply_min_p,
    apply_min_tokens,
    apply_penalties,
)
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.torch_utils import async_tensor_h2d

__all__ = ["Sampler", "apply_top_k_top_p", "make_generator"]


def make_generator(params: SamplingParams, device: torch.device | str) -> torch.Generator | None:
    """A generator seeded for this request, or None to use torch's global RNG."""
    if params.seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(params.seed)
    return generator


# ANCHOR: top_k_top_p
def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Set to -inf every logit outside each row's top-k and top-p sets.

    `top_k` `[B]` (int; >= vocab or <= 0 keeps all), `top_p` `[B]` (float; 1 keeps all).
    Top-p keeps the smallest set of most likely tokens whose probability reaches p
    (the most likely token always stays), computed after the top-k cut.
    """
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=logits.device)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    drop = rank.unsqueeze(0) >= k.unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    # Probability mass strictly before each token: a token is kept while that mass
    # is still short of p, which keeps the first token always.
    mass_before = probs.cumsum(dim=-1) - probs
    drop = mass_before >= top_p.unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


# ANCHOR_END: top_k_top_p


class Sampler(nn.Module):
    # ANCHOR: sampling
    def forward(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None] | None = None,
        processors: SamplingBatch | None = None,
    ) -> torch.Tensor:
        """logits `[B, vocab]` -> token ids `[B]` (int64), row i drawn with params[i].

        `processors` (when a row uses min_p, penalties, logit_bias or min_tokens; see
        mini_vllm/layers/logits_processors.py) reshapes the logits first, greedy rows too.
        """
        if logits.shape[0] != len(params):
            raise ValueError(f"{logits.shape[0]} rows of logits but {len(params)} SamplingParams")
        if processors is not None:
            logits = logits.float()
            logits = apply_min_tokens(logits, processors.banned)
            logits = apply_logit_bias(logits, processors.bias)
            logits = apply_penalties(logits, processors)
        greedy_tokens = logits.argmax(dim=-1)
        if all(p.greedy for p in params):
            return greedy_tokens  # the common case pays for nothing else
        generators = generators if generators is not None else [None] * len(params)
        device = logits.device
        logits = logits.float()
        # Greedy rows are sampled too (with harmless settings) and then overwritten:
        # one code path for the whole batch is simpler than gathering rows. The rows'
        # settings travel in one copy that does not make the host wait for the GPU.
        settings = async_tensor_h2d(
            [
                [p.temperature if not p.greedy else 1.0 for p in params],
                [float(p.greedy) for p in params],
                [float(p.top_k) for p in params],
                [float(p.top_p) for p in params],
            ],
            torch.float32,
            device,
        )
        temperature, is_greedy, top_k, top_p = settings
        logits = logits / temperature.unsqueeze(1)
        if processors is not None and any(p.min_p > 0 for p in params):
            logits = apply_min_p(logits, processors.min_p)
        if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
            logits = apply_top_k_top_p(logits, top_k.long(), top_p)
        probs = logits.softmax(dim=-1)
        # Exponential race: one draw for the whole batch from torch's generator, then
        # the seeded rows draw again from their own (so their tokens do not depend on
        # what else is in the batch); a loop over those rows only.
        noise = torch.empty_like(probs).exponential_()
        for row, generator in enumerate(generators):
            if generator is not None:
                noise[row].exponential_(generator=generator)
        # A draw of exactly 0 would turn a forbidden token's 0 / 0 into NaN, which
        # argmax would pick; a floor keeps forbidden tokens at exactly 0.
        noise.clamp_(min=torch.finfo(noise.dtype).tiny)
        sampled = (probs / noise).argmax(dim=-1)
        return torch.where(is_greedy.bool(), greedy_tokens, sampled)

    # ANCHOR_END: sampling
