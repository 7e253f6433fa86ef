"""Phase 00: the decode loop. Prefill the prompt once, then one token at a time.

vLLM counterpart: there is no single file; the loop is spread over
vllm/v1/engine/llm_engine.py (`LLMEngine.step`), vllm/v1/core/sched/scheduler.py and
vllm/v1/worker/gpu_model_runner.py (`execute_model`), which Phases 02-04 rebuild.
The closest one-file relatives: gpt-fast (generate.py, `prefill`, `decode_one_token`,
`decode_n_tokens`) and nano-vllm's nanovllm/engine/llm_engine.py (`generate`).

What it shows:
- prefill runs the whole prompt in one forward (compute-bound, many tokens) and
  fills the KV cache; its end is the first token, so TTFT = prefill + one sample;
- each decode step runs one new token per sequence against the cached keys and
  values (memory-bound: every weight is read to produce one token per sequence);
  the time between tokens is the inter-token latency (ITL);
- the cache is contiguous: `[2, batch, max_len, kv_heads, head_dim]` per layer,
  sized for prompt + max new tokens before the first step.

Sequences of a batch run in lockstep (same prompt length), so one metadata object
describes them all; a finished sequence rides along until all are done.

Threads on CPU: a decode step is a string of matrix-vector products, each a pure read of
a weight matrix, so its speed is memory bandwidth. On the course's 2-vCPU VM one core
pulls about 18 GB/s and two about 26, so the linear layers split each product over the
threads (mini_vllm/layers/linear.py, `split_k_linear`) and `cpu_threads="auto"` keeps
torch's own setting: every core. (Before that split, one thread was fastest here: MKL
does not parallelise a matrix-vector product, and an idle second OpenMP thread only
added wake-ups.)
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
from mini_vllm.engine.sequence import FinishReason, check_stop
from mini_vllm.errors import UserError
from mini_vllm.forward_context import set_forward_context
from mini_vllm.layers.attention import bind_kv_caches, static_forward_context
from mini_vllm.layers.sampler import Sampler, make_generator
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.tokenizer import IncrementalDetokenizer, TokenizerLike
from mini_vllm.utils import cpu_threads_context, synchronize

__all__ = [
    "GenerationResult",
    "full_forward_logits",
    "generate",
    "generate_lockstep",
    "run_model_step",
]


# ANCHOR: generation_result
@dataclass
class GenerationResult:
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None  # STOP (EOS) or LENGTH (max_tokens or context full)
    ttft_s: float = 0.0  # request start -> first token sampled (prefill + sampling)
    itl_s: list[float] = field(default_factory=list)  # gaps between consecutive tokens
    # ANCHOR_END: generation_result

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


# ANCHOR: run_model_step
def run_model_step(
    model,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    metadata: ContiguousAttentionMetadata,
    sample_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """One forward with the step's metadata in the forward context.

    Returns the logits of `sample_rows` only (None: of every row).
    """
    with set_forward_context(
        CUDAGraphMode.NONE, attn_metadata=metadata, no_compile_layers=static_forward_context(model)
    ):
        hidden_states = model(input_ids, positions)
    if sample_rows is not None:
        # Only the rows that will be sampled go through the LM head (at prefill: the
        # prompt's last token, not all of them).
        hidden_states = hidden_states.index_select(0, sample_rows)
    return model.compute_logits(hidden_states)


# ANCHOR_END: run_model_step


# ANCHOR: full_forward_logits
def full_forward_logits(model, token_ids: Sequence[int]) -> torch.Tensor:
    """Logits at every position of `token_ids` `[T, vocab]`: one prefill with a fresh cache.

    The no-cache reference that the decode loop must reproduce step by step.
    """
    config = model.config
    weight = next(model.parameters())
    n = len(token_ids)
    caches = allocate_contiguous_kv_caches(
        config.num_hidden_layers,
        1,
        n,
        config.num_key_value_heads,
        config.head_dim,
        weight.dtype,
        weight.device,
    )
    bind_kv_caches(model, ContiguousAttentionBackend(), caches)
    try:
        with torch.inference_mode():
            ids = torch.tensor(list(token_ids), dtype=torch.long, device=weight.device)
            positions = torch.arange(n, device=weight.device)
            return run_model_step(model, ids, positions, ContiguousAttentionMetadata.prefill(1, n))
    finally:
        bind_kv_caches(model, None, None)


# ANCHOR_END: full_forward_logits


def generate_lockstep(
    model,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams | Sequence[SamplingParams],
    *,
    tokenizer: TokenizerLike | None = None,
    on_token: Callable[[int, int, str], None] | None = None,
    max_model_len: int | None = None,
    cpu_threads: int | str | None = "auto",
) -> list[GenerationResult]:
    """Generate for a batch of equally long prompts; `on_token(seq, token_id, text_delta)` streams.

    `cpu_threads`: intra-op threads for this request on CPU ("auto": see the module
    docstring; None: torch's current setting).
    """
    config = model.config
    batch = len(prompts)
    if batch == 0:
        return []
    params_list = [params] * batch if isinstance(params, SamplingParams) else list(params)
    if len(params_list) != batch:
        raise UserError(f"{batch} prompts but {len(params_list)} SamplingParams")
    prompt_len = len(prompts[0])
    if prompt_len == 0:
        raise UserError("the prompt is empty: give at least one token")
    if any(len(p) != prompt_len for p in prompts):
        raise UserError(
            "the contiguous-cache decode loop runs sequences in lockstep: all prompts "
            "must have the same length (Phase 02's paged cache lifts this)"
        )
    limit = max_model_len or config.max_position_embeddings
    # vLLM's rule (`InputProcessor._validate_prompt_len`, vllm/v1/engine/input_processor.py):
    # prompt + output never pass the limit, and the output has at least one token, so a
    # prompt must be shorter than the limit. The engine of Phase 03 and the server of
    # Phase 06 refuse the same prompts.
    if prompt_len >= limit:
        raise UserError(
            f"the prompt is {prompt_len} tokens, and the model's context limit of {limit} "
            f"tokens holds the prompt and at least one new token: shorten the prompt to at "
            f"most {limit - 1} tokens"
        )
    weight = next(model.parameters())
    device, dtype = weight.device, weight.dtype
    max_new = max(p.max_tokens for p in params_list)
    max_len = min(limit, prompt_len + max_new)

    start = time.perf_counter()  # the request's clock includes allocating its cache
    kv_caches = allocate_contiguous_kv_caches(
        config.num_hidden_layers,
        batch,
        max_len,
        config.num_key_value_heads,
        config.head_dim,
        dtype,
        device,
    )
    bind_kv_caches(model, ContiguousAttentionBackend(), kv_caches)
    sampler = Sampler()
    generators = [make_generator(p, device) for p in params_list]
    eos_ids = frozenset(config.eos_token_ids)
    results = [GenerationResult(prompt_token_ids=list(p)) for p in prompts]
    detoks = [IncrementalDetokenizer(tokenizer) if tokenizer is not None else None for _ in prompts]
    finished = [False] * batch

    def accept(token_ids: list[int]) -> None:
        for i, token_id in enumerate(token_ids):
            if finished[i]:
                continue
            result = results[i]
            result.token_ids.append(token_id)
            reason = check_stop(
                token_id,
                result.num_generated,
                params_list[i],
                eos_ids,
                num_tokens=prompt_len + result.num_generated,
                max_model_len=limit,
            )
            if reason is not None:
                finished[i], result.finish_reason = True, reason
            delta = ""
            if detoks[i] is not None:
                delta = detoks[i].push(token_id) + (detoks[i].flush() if reason is not None else "")
            if on_token is not None:
                on_token(i, token_id, delta)

    try:
        with torch.inference_mode(), cpu_threads_context(device, cpu_threads):
            # ANCHOR: prefill
            input_ids = torch.tensor(
                [t for p in prompts for t in p], dtype=torch.long, device=device
            )
            positions = torch.arange(prompt_len, device=device).repeat(batch)
            last_rows = torch.arange(batch, device=device) * prompt_len + (prompt_len - 1)
            logits = run_model_step(
                model,
                input_ids,
                positions,
                ContiguousAttentionMetadata.prefill(batch, prompt_len),
                last_rows,
            )
            next_ids = sampler(logits, params_list, generators)
            token_list = next_ids.tolist()  # waits for the device: the first token exists now
            synchronize(device)
            now = time.perf_counter()
            # ANCHOR_END: prefill
            for result in results:
                result.ttft_s = now - start
            accept(token_list)
            previous = now

            # ANCHOR: decode_loop
            position = prompt_len  # where the token just sampled will be written
            while not all(finished) and position < max_len:
                # ANCHOR: decode_step
                positions = torch.full((batch,), position, dtype=torch.long, device=device)
                logits = run_model_step(
                    model, next_ids, positions, ContiguousAttentionMetadata.decode(batch, position)
                )
                next_ids = sampler(logits, params_list, generators)
                token_list = next_ids.tolist()
                # ANCHOR_END: decode_step
                synchronize(device)
                now = time.perf_counter()
                for i, result in enumerate(results):
                    if not finished[i]:
                        result.itl_s.append(now - previous)
                previous = now
                accept(token_list)
                position += 1
            # ANCHOR_END: decode_loop
    finally:
        bind_kv_caches(model, None, None)  # let the cache be freed with this call

    for result in results:
        if tokenizer is not None:
            result.text = tokenizer.decode(result.token_ids, skip_special_tokens=True)
    return results


def generate(
    model,
    prompt_token_ids: Sequence[int],
    params: SamplingParams | None = None,
    *,
    tokenizer: TokenizerLike | None = None,
    on_token: Callable[[int, str], None] | None = None,
    max_model_len: int | None = None,
    cpu_threads: int | str | None = "auto",
) -> GenerationResult:
    """Generate for one prompt; `on_token(token_id, text_delta)` is called per new token."""
    callback = (
        None if on_token is None else (lambda _seq, token_id, delta: on_token(token_id, delta))
    )
    return generate_lockstep(
        model,
        [list(prompt_token_ids)],
        params or SamplingParams(),
        tokenizer=tokenizer,
        on_token=callback,
        max_model_len=max_model_len,
        cpu_threads=cpu_threads,
    )[0]
