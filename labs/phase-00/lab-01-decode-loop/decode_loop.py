"""Phase 00, lab 01 — the decode loop (your code).

Mirrors mini_vllm/teaching/decode_loop.py, plus `check_stop` and `apply_top_k_top_p` from
mini_vllm/layers/sampler.py. One request, batch 1: prefill the prompt in one forward
(which fills the KV cache and gives the first token), then one forward per new token
against the cache, until an end-of-sequence token or `max_tokens`. Time the first
token (TTFT) and every gap after it (inter-token latency).

Given (from mini_vllm, already imported below): the model, the contiguous KV cache and
its attention backend, the forward context, the `Sampler` (greedy / temperature /
top-k / top-p draws) and the incremental detokenizer. Yours: the five TODOs.

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
    finish_reason: str | None = None  # "stop" (EOS) or "length" (max_tokens or context full)
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


# -- step 1 ---------------------------------------------------------------------------


def check_stop(
    token_id: int,
    num_generated: int,
    params: SamplingParams,
    eos_token_ids: Sequence[int] | frozenset[int],
) -> str | None:
    """The finish reason after appending `token_id`, the `num_generated`-th new token.

    "stop" if it is one of `eos_token_ids` (unless `params.ignore_eos`); otherwise
    "length" once `num_generated` reaches `params.max_tokens`; otherwise None.
    An EOS on the last allowed token is a "stop".
    """
    raise NotImplementedError("TODO: the EOS check first, then max_tokens")


# -- step 2 ---------------------------------------------------------------------------


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Set to -inf every logit outside each row's top-k set, then outside its top-p set.

    logits `[B, vocab]`; top_k `[B]` ints (<= 0 or >= vocab: no cut); top_p `[B]`
    floats (1.0: no cut). Top-p keeps the smallest set of most likely tokens whose
    probability reaches p, computed on the distribution left after the top-k cut;
    the most likely token always stays. Kept logits keep their values and places.
    """
    raise NotImplementedError(
        "TODO: sort each row, mask by rank (k), then by mass before each token (p), scatter back"
    )


# -- step 3 ---------------------------------------------------------------------------


def run_model_step(
    model,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    metadata: ContiguousAttentionMetadata,
    sample_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """One forward with `metadata` in the forward context; logits of `sample_rows` only.

    `model(input_ids, positions)` returns hidden states `[T, hidden]` (no logits);
    `model.compute_logits(hidden)` applies the LM head. The attention layers read the
    metadata from the forward context: `set_forward_context(CUDAGraphMode.NONE,
    attn_metadata=metadata)`. With `sample_rows` (a tensor of row indices) only those
    rows go through the LM head; None means every row.
    """
    raise NotImplementedError(
        "TODO: forward under the context, select the rows, then compute_logits"
    )


# -- step 4 ---------------------------------------------------------------------------


def full_forward_logits(model, token_ids: Sequence[int]) -> torch.Tensor:
    """Logits at every position of `token_ids`, `[T, vocab]`: one prefill with a fresh cache.

    The no-cache reference the decode loop must reproduce step by step. Allocate a
    cache for exactly T positions (`allocate_contiguous_kv_caches`, with the model's
    `config` and its weights' dtype and device), bind it with a
    `ContiguousAttentionBackend()` (`bind_kv_caches`), run one prefill step under
    `torch.inference_mode()`, and unbind (`bind_kv_caches(model, None, None)`) even if
    the forward fails.
    """
    raise NotImplementedError("TODO")


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
    """Generate for one prompt, streaming each new token to `on_token(token_id, text_delta)`.

    1. Refuse (ValueError) an empty prompt, or one that leaves no room for a new token
       under the context limit (`max_model_len`, default
       `model.config.max_position_embeddings`).
    2. Start the clock, then allocate and bind a cache long enough for the prompt and
       the new tokens (but never past the limit).
    3. Prefill: the whole prompt in one `run_model_step`, positions 0..P-1, metadata
       `ContiguousAttentionMetadata.prefill(1, P)`, logits of the last row only.
       Sample (`Sampler()(logits, [params], [generator])`, generator from
       `make_generator(params, device)`, made once per request); the first token
       exists when its id is on the host (`.tolist()`): that is the TTFT.
    4. Decode: feed the token just sampled at the next position
       (`ContiguousAttentionMetadata.decode(1, position)`), sample, record the gap
       since the previous token, until `check_stop` says stop (EOS ids:
       `model.config.eos_token_ids`) or no position is left below the limit
       (finish reason "length"). No forward after the last token.
    5. Stream: call `on_token` as soon as each token is sampled; with a tokenizer the
       delta is `IncrementalDetokenizer(tokenizer).push(id)`, plus `.flush()` after the
       last token, and `result.text` is `tokenizer.decode(ids, skip_special_tokens=True)`
       (without a tokenizer the delta is "").
    6. Unbind the cache when done, even on an error.
    """
    raise NotImplementedError("TODO: prefill, then the decode loop; time TTFT and each gap")


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
