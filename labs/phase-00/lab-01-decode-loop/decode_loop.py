"""Phase 00, lab 01 — the decode loop (your code).

One request, batch 1: the prompt goes through the model once (prefill), which fills
the KV cache and gives the first token; then one forward per new token against the
cache (decode), until an end-of-sequence token, `max_tokens`, or the context limit.
Along the way, two clocks: the time to the first token (TTFT) and every gap between
two tokens after it (inter-token latency, ITL).

Given (from mini_vllm, imported below): the model, the contiguous KV cache and its
attention backend, the forward context, the `Sampler` (greedy / temperature / top-k /
top-p draws), `make_generator` and the incremental detokenizer. Yours: the five TODOs,
one per step of the README.

Run: pytest labs/phase-00/lab-01-decode-loop
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from mini_vllm.attention.contiguous import (
    ContiguousAttentionBackend,
    ContiguousAttentionMetadata,
    allocate_contiguous_kv_caches,
)
from mini_vllm.config.compilation import CUDAGraphMode
from mini_vllm.engine.sequence import FinishReason
from mini_vllm.forward_context import set_forward_context
from mini_vllm.layers.attention import bind_kv_caches
from mini_vllm.layers.sampler import Sampler, make_generator
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

    Returns "stop" if `token_id` is one of `eos_token_ids` and `params.ignore_eos` is
    off; otherwise "length" once `num_generated` has reached `params.max_tokens`;
    otherwise None (keep going). `FinishReason.STOP` and `FinishReason.LENGTH` are
    those strings too, so either may be returned.

    Example, with max_tokens=10 and EOS ids {257}:
        check_stop(5, 9, ...) -> None          check_stop(5, 10, ...) -> "length"
        check_stop(257, 3, ...) -> "stop"      check_stop(257, 10, ...) -> "stop"
        and with ignore_eos=True: check_stop(257, 3, ...) -> None
    """
    raise NotImplementedError("TODO: step 1")


# -- step 2 ---------------------------------------------------------------------------


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """`logits` with every entry outside its row's top-k set, then top-p set, made -inf.

    logits `[B, vocab]` (float); top_k `[B]` ints (<= 0 or >= vocab: no cut); top_p
    `[B]` floats in (0, 1] (1.0: no cut). Returns a new `[B, vocab]` tensor; the input
    is left as it was. Top-k keeps the k largest logits of the row. Top-p keeps the
    smallest set of most likely tokens whose probability adds up to at least p, where
    the probabilities are those of the distribution left after the top-k cut (the
    survivors renormalised). The most likely token always stays. A kept logit keeps
    its value and its place.

    Example: probabilities [0.15, 0.5, 0.05, 0.3] (as log-probabilities), top_k -1:
        top_p 0.4 -> only index 1 kept; 0.6 -> indices 1 and 3; 0.9 -> 0, 1 and 3.
    Probabilities [0.4, 0.3, 0.2, 0.1], top_k 2, top_p 0.5: the survivors become 4/7
    and 3/7, and 4/7 alone reaches 0.5 -> only index 0 kept.
    """
    raise NotImplementedError("TODO: step 2")


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
    `model.compute_logits(hidden)` applies the LM head. The attention layers find the
    step's metadata in the forward context: while the model runs,
    `get_forward_context().attn_metadata` must be `metadata` (CUDA graph mode NONE).
    `sample_rows` (int64 indices into the T rows) picks the rows to return, in that
    order, and only those rows may go through the LM head; None returns every row.

    Example: a 6-token prefill with sample_rows tensor([1, 5]) returns `[2, vocab]`,
    equal to rows 1 and 5 of the 6-row result with sample_rows None.
    """
    raise NotImplementedError("TODO: step 3")


# -- step 4 ---------------------------------------------------------------------------


def full_forward_logits(model, token_ids: Sequence[int]) -> torch.Tensor:
    """Logits at every position of `token_ids` `[T, vocab]`, without any earlier state.

    The no-cache reference the decode loop must reproduce: row t is the model's
    prediction after seeing tokens 0..t, so row t equals the last row of the call on
    `token_ids[: t + 1]`. Works with the model's own dtype and device, keeps no
    autograd state, and leaves no KV cache bound to the model when it returns, also
    when the forward raises.

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

    Inputs: the prompt's token ids; `params` (None: `SamplingParams()`); the context
    limit `max_model_len` (None: `model.config.max_position_embeddings`); the end of
    sequence ids are `model.config.eos_token_ids`.

    Errors: ValueError for an empty prompt, or a prompt longer than the limit (vLLM's
    rule; a prompt of exactly the limit is served, as the engine of Phase 03 serves it).

    Guarantees:
    - Tokens: what the model predicts, one token at a time, each conditioned on the
      prompt and every token before it (greedy: the argmax of `full_forward_logits` of
      prompt + tokens so far). Drawn by `Sampler()` with `params`; a seeded request
      (`params.seed`) draws with one generator from `make_generator` for its whole life,
      so its tokens are those of a single generator used from the first token on.
    - Work: N new tokens cost exactly N forwards. The first covers the whole prompt
      (positions 0..P-1) and sends only its last row through the LM head; each later
      forward feeds the token sampled just before, at the next position, with the
      cache holding everything before it. No position at or past the limit is used.
    - Stop: after each token, `check_stop`; the finish reason is "stop" or "length",
      and "length" too when no position is left below the limit. The token that
      stopped the request is kept in `token_ids`.
    - Clocks, all read with `time.perf_counter()`: the request arrives when `generate`
      is called; a token exists when its id is on the host. `ttft_s` = t(first token)
      - t(arrival); `itl_s[i]` = t(token i + 1) - t(token i): one entry per token
      after the first.
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
    torch,
    ContiguousAttentionBackend,
    allocate_contiguous_kv_caches,
    CUDAGraphMode,
    set_forward_context,
    bind_kv_caches,
    Sampler,
    make_generator,
    IncrementalDetokenizer,
)
