"""Phase 00, lab 01 — the decode loop (your code).

One request, batch 1: the prompt goes through the model once (prefill), which fills
the KV cache and gives the first token; then one forward per new token against the
cache (decode), until an end-of-sequence token, `max_tokens`, or the context limit.
Along the way, two clocks: the time to the first token (TTFT) and every gap between
two tokens after it (inter-token latency, ITL).

Given, from mini_vllm (imported below): the model, the contiguous KV cache and its
attention backend, the forward context, `make_generator` and the incremental
detokenizer. Given here: `GenerationResult`, and `Sampler`, which draws the next token
through YOUR top-k / top-p filter of step 2. Yours: the five TODOs, one per step of
the README.

Run: pytest labs/phase-00/lab-01-decode-loop (one step: add -m step1, -m step2, ...)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from mini_vllm.attention.contiguous import (
    ContiguousAttentionBackend,
    ContiguousAttentionMetadata,
    allocate_contiguous_kv_caches,
)
from mini_vllm.config.compilation import CUDAGraphMode
from mini_vllm.engine.sequence import FinishReason
from mini_vllm.forward_context import set_forward_context
from mini_vllm.layers.attention import bind_kv_caches
from mini_vllm.layers.sampler import make_generator
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.tokenizer import IncrementalDetokenizer


@dataclass
class GenerationResult:
    """Given: what one request produced, and when."""

    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None  # STOP (EOS) or LENGTH (max_tokens or context full)
    ttft_s: float = 0.0  # request start -> first token sampled (prefill + sampling)
    itl_s: list[float] = field(default_factory=list)  # gaps between consecutive tokens

    @property
    def num_generated(self) -> int:
        return len(self.token_ids)

    @property
    def total_s(self) -> float:
        return self.ttft_s + sum(self.itl_s)

    @property
    def mean_itl_s(self) -> float:
        return sum(self.itl_s) / len(self.itl_s) if self.itl_s else 0.0

    @property
    def tokens_per_s(self) -> float:
        """New tokens over the whole request time (prefill included)."""
        return self.num_generated / self.total_s if self.total_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Decode speed alone: one token per inter-token gap."""
        return len(self.itl_s) / sum(self.itl_s) if self.itl_s else 0.0


# -- step 1 ---------------------------------------------------------------------------


def check_stop(
    token_id: int,
    num_generated: int,
    params: SamplingParams,
    eos_token_ids: Sequence[int] | frozenset[int],
) -> str | None:
    """The finish reason after appending `token_id`, the `num_generated`-th new token.

    Guarantees: "stop" when `token_id` is one of `eos_token_ids` (any of them) and
    `params.ignore_eos` is off; "length" when the request has its `params.max_tokens`
    new tokens; None while it may go on. When both hold, the EOS wins ("stop"), as in
    vLLM's `check_stop`. `FinishReason.STOP` and `FinishReason.LENGTH` are those
    strings too, so either form may be returned.

    Example, max_tokens=10, EOS ids {257}: check_stop(5, 9, ...) -> None, and
    check_stop(257, 3, ...) -> "stop".
    """
    raise NotImplementedError("TODO: step 1")


# -- step 2 ---------------------------------------------------------------------------


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """`logits` with every entry outside its row's top-k set, then top-p set, made -inf.

    logits `[B, vocab]`, any float dtype; top_k `[B]` ints (<= 0 or >= vocab: no cut);
    top_p `[B]` floats in (0, 1] (1.0: no cut). Guarantees, per row: top-k keeps the k
    largest logits; top-p then keeps the smallest set of most likely tokens whose
    probability reaches p, the probabilities being those of the distribution left by
    the top-k cut (the survivors renormalised); the most likely token always stays. A
    kept logit keeps its value and its place. Returns a new tensor of the input's
    dtype; the input is left as it was.

    Example: probabilities [0.15, 0.5, 0.05, 0.3] (given as log-probabilities), top_k
    -1, top_p 0.6 -> indices 1 and 3 kept (0.5 alone falls short of 0.6).
    """
    raise NotImplementedError("TODO: step 2")


class Sampler(nn.Module):
    """Given: the draw of the next token, through your `apply_top_k_top_p` (step 2).

    `Sampler()(logits, params, generators)`: logits `[B, vocab]` -> token ids `[B]`
    (int64), row i drawn with params[i] and generators[i] (None: torch's global
    generator). Greedy rows take the argmax; the others divide by the temperature,
    go through your filter when they ask for top-k or top-p, and draw. mini_vllm's
    `Sampler` less the logits processors (min_p, penalties, logit_bias, min_tokens)
    this lab does not use: the same logits and generators give the same tokens.
    """

    def forward(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None] | None = None,
    ) -> torch.Tensor:
        if logits.shape[0] != len(params):
            raise ValueError(f"{logits.shape[0]} rows of logits but {len(params)} SamplingParams")
        greedy_tokens = logits.argmax(dim=-1)
        if all(p.greedy for p in params):
            return greedy_tokens
        generators = generators if generators is not None else [None] * len(params)
        device = logits.device
        logits = logits.float()
        temperature = torch.tensor(
            [p.temperature if not p.greedy else 1.0 for p in params], device=device
        )
        logits = logits / temperature.unsqueeze(1)
        if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
            top_k = torch.tensor([p.top_k for p in params], device=device)
            top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
            logits = apply_top_k_top_p(logits, top_k, top_p)
        probs = logits.softmax(dim=-1)
        # Exponential race: argmax(p_i / E_i) with E_i ~ Exp(1) picks token i with
        # probability p_i. A seeded row draws its E from its own generator.
        noise = torch.empty_like(probs).exponential_()
        for row, generator in enumerate(generators):
            if generator is not None:
                noise[row].exponential_(generator=generator)
        noise.clamp_(min=torch.finfo(noise.dtype).tiny)
        sampled = (probs / noise).argmax(dim=-1)
        is_greedy = torch.tensor([p.greedy for p in params], device=device)
        return torch.where(is_greedy, greedy_tokens, sampled)


# -- step 3 ---------------------------------------------------------------------------


def run_model_step(
    model,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    metadata: ContiguousAttentionMetadata,
    sample_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """One forward of `model` over `input_ids` at `positions`; the logits of `sample_rows`.

    `model(input_ids, positions)` returns hidden states `[T, hidden]`, no logits, and
    `model.compute_logits(hidden)` applies the LM head. Guarantees: while the model
    runs, the attention layers find `metadata` as the forward context's
    `attn_metadata` (CUDA graph mode NONE); the result holds the logits of the rows
    `sample_rows` names (int64 indices into the T rows), in that order, and only those
    rows go through the LM head; None returns every row.

    Example: a 6-token prefill with sample_rows tensor([1, 5]) returns `[2, vocab]`,
    equal to rows 1 and 5 of the 6-row result with sample_rows None.
    """
    raise NotImplementedError("TODO: step 3")


# -- step 4 ---------------------------------------------------------------------------


def full_forward_logits(model, token_ids: Sequence[int]) -> torch.Tensor:
    """Logits at every position of `token_ids` `[T, vocab]`, without any earlier state.

    The no-cache reference the decode loop must reproduce: row t is the model's
    prediction after seeing tokens 0..t, so row t equals the last row of the call on
    `token_ids[: t + 1]`. Guarantees: runs in the model's own dtype and on its device,
    keeps no autograd state, and leaves no KV cache bound to the model when it
    returns, also when the forward raises.

    Example: 9 token ids in -> a `[9, vocab]` tensor out, whose row 3 equals
    `full_forward_logits(model, token_ids[:4])[-1]` (to float rounding).
    """
    raise NotImplementedError("TODO: step 4")


# -- step 5 ---------------------------------------------------------------------------


def generate(
    model,
    prompt_token_ids: Sequence[int],
    params: SamplingParams | None = None,
    *,
    tokenizer=None,
    on_token: Callable[[int, str], None] | None = None,
    max_model_len: int | None = None,
    cpu_threads: int | str | None = None,  # accepted for the reference's signature; ignore it
) -> GenerationResult:
    """Generate new tokens for one prompt with a KV cache; stream them; time them.

    Inputs: the prompt's token ids (left as the caller passed them); `params` (None:
    `SamplingParams()`); the context limit `max_model_len` (None:
    `model.config.max_position_embeddings`); the end-of-sequence ids are
    `model.config.eos_token_ids`.

    Errors: ValueError, before any forward, for an empty prompt and for a prompt the
    context limit cannot serve (which lengths those are is the README's step 5
    decision).

    Guarantees:
    - Tokens: what the model predicts, one token at a time, each conditioned on the
      prompt and every token before it (greedy: the argmax of `full_forward_logits` of
      prompt + tokens so far), drawn by this file's `Sampler` with `params`. A seeded
      request (`params.seed`) draws from one generator (`make_generator`) for its
      whole life, as if a single generator had drawn every token in turn.
    - Work: N new tokens cost exactly N forwards. The first covers the whole prompt
      (positions 0..P-1) and sends only its last row through the LM head; each later
      forward feeds the token sampled just before, at the next position, with the
      cache holding everything before it. No position at or past the limit is used.
    - Stop: after each token, `check_stop`; the request also ends with "length" once
      prompt + new tokens fill the context limit. The token that stopped the request
      is kept in `token_ids`.
    - Clocks, all read with `time.perf_counter()`: the request arrives when `generate`
      is called (so its TTFT includes setting up its cache); a token exists once its
      id is on the host, after the draw. `ttft_s` = t(first token) - t(arrival);
      `itl_s[i]` = t(token i + 1) - t(token i): one entry per token after the first.
    - Streaming: `on_token(token_id, delta)` is called for each token as soon as it
      exists, before the next forward. With a tokenizer, the deltas are those of
      `IncrementalDetokenizer(tokenizer)` (its `flush()` added to the last token's),
      and `result.text` is `tokenizer.decode(token_ids, skip_special_tokens=True)`;
      without one the delta is "" and the text stays "".
    - No KV cache stays bound to the model when `generate` returns or raises.

    Example: a 9-token prompt, greedy, max_tokens=4, EOS ignored: 4 forwards, fed
    9, 1, 1 and 1 token ids at positions 0..8, 9, 10 and 11; `finish_reason` "length";
    if the forwards take 2.0, 0.25, 0.5 and 0.125 s (and nothing else takes time),
    ttft_s = 2.0 and itl_s = [0.25, 0.5, 0.125].
    """
    raise NotImplementedError("TODO: step 5")


# Silence "imported but unused" until you use them.
_GIVEN = (
    time,
    ContiguousAttentionBackend,
    allocate_contiguous_kv_caches,
    CUDAGraphMode,
    set_forward_context,
    bind_kv_caches,
    make_generator,
    IncrementalDetokenizer,
)
