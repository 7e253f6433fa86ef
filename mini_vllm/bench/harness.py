"""What every decode benchmark shares: the engine it times, and how to look inside one step.

vLLM counterpart: vllm/benchmarks/latency.py builds one `LLM` from the command line's
engine arguments and times `generate`; here the benchmarks (mini_vllm/bench/) and the
GPU scripts (scripts/gpu/) all start from `decode_engine` and `start_decoding`, so that
a step timed by one of them is the same step the others time.

    engine = decode_engine(model, "compile+full+async", batch_sizes=[1, 8], new_tokens=200)
    start_decoding(engine, batch=8, context_len=128, new_tokens=200)
    engine.step()  # one decode step of 8 requests, on the graph captured for 8

`MODES` names the engine settings a benchmark compares (each a dict of `EngineConfig`
fields); `count_kernels` and `kernel_table` read a step's GPU kernels off the profiler;
`transformers_twin` is transformers' Llama holding the very same weights, the baseline.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mini_vllm.engine.engine_config import EngineConfig
from mini_vllm.engine.llm_engine import LLMEngine
from mini_vllm.errors import UserError
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.utils import synchronize

__all__ = [
    "MODES",
    "check_modes",
    "count_kernels",
    "decode_engine",
    "kernel_table",
    "start_decoding",
    "transformers_twin",
]

_FULL = dict(cudagraph_mode="full_decode_only")
_COMPILED = dict(compilation_mode="vllm_compile")
MODES: dict[str, dict[str, object]] = {
    "eager": dict(enforce_eager=True),
    "full": _FULL,
    "piecewise": dict(cudagraph_mode="piecewise"),
    "full_and_piecewise": dict(cudagraph_mode="full_and_piecewise"),
    "compile": dict(cudagraph_mode="none", **_COMPILED),
    "compile+full": dict(**_FULL, **_COMPILED),
    "compile+piecewise": dict(cudagraph_mode="piecewise", **_COMPILED),
    "compile+full_and_piecewise": dict(cudagraph_mode="full_and_piecewise", **_COMPILED),
    "full+async": dict(**_FULL, async_scheduling=True),
    "compile+full+async": dict(**_FULL, **_COMPILED, async_scheduling=True),
    # The compiled modes without the fusion pass (on by default on CUDA): its own share.
    "compile-nofusion+full": dict(**_FULL, **_COMPILED, enable_fusion=False),
    "compile-nofusion+full+async": dict(
        **_FULL, **_COMPILED, async_scheduling=True, enable_fusion=False
    ),
    # The engine on plain torch (custom_ops="none", mini_vllm/_custom_ops.py): what
    # mini_vllm's own kernels add, graphs and compilation still on.
    "torch-only+eager": dict(enforce_eager=True, custom_ops="none"),
    "torch-only+full": dict(**_FULL, custom_ops="none"),
    "torch-only+compile+full+async": dict(
        **_FULL, **_COMPILED, async_scheduling=True, custom_ops="none"
    ),
}


def check_modes(modes: list[str]) -> None:
    """Refuse an empty list or a mode `MODES` does not name, with the list of those it does."""
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown or not modes:
        raise UserError(f"unknown mode(s) {unknown or modes}; choose from {', '.join(MODES)}")


# Positions an engine built by decode_engine allows past the prompt and new tokens.
ENGINE_LEN_SLACK = 32


# ANCHOR: decode_engine
def decode_engine(
    model: torch.nn.Module,
    mode: str = "eager",
    batch_sizes: list[int] = (1,),
    context_len: int = 128,
    new_tokens: int = 64,
    block_size: int = 16,
) -> LLMEngine:
    """An engine on `model` (no second copy of the weights) set up as `mode` for decode.

    It holds up to `max(batch_sizes)` requests of `context_len` prompt tokens and
    `new_tokens` new ones each; graphs (if the mode has them) are captured for exactly
    the `batch_sizes`, so that every batch timed replays its own graph unpadded.
    """
    check_modes([mode])
    weight = next(model.parameters())
    largest = max(batch_sizes)
    config = EngineConfig(
        model="(shared)",
        device=str(weight.device),
        dtype=str(weight.dtype).removeprefix("torch."),
        max_num_seqs=largest,
        max_num_batched_tokens=max(largest * context_len, 256),
        max_model_len=context_len + new_tokens + ENGINE_LEN_SLACK,
        block_size=block_size,
        cudagraph_capture_sizes=sorted(set(batch_sizes)),
        **MODES[mode],
    )
    return LLMEngine(config, model, tokenizer=None, capture_progress=False)


# ANCHOR_END: decode_engine


def start_decoding(engine: LLMEngine, batch: int, context_len: int, new_tokens: int) -> None:
    """Add `batch` requests (random prompts of `context_len` tokens, drawn from a generator
    seeded with `batch`; greedy; exactly `new_tokens` each) and step through their
    prefill, so that the engine's next step decodes all of them at once."""
    vocab = engine.model.config.vocab_size
    generator = torch.Generator().manual_seed(batch)
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    for _ in range(batch):
        engine.add_request(
            torch.randint(3, vocab, (context_len,), generator=generator).tolist(), params
        )
    # Prefill, in one or more chunks, until the last step planned is a decode of them all.
    engine.step()
    while not engine.stats.steps[-1].uniform_decode:
        engine.step()


def transformers_twin(model: torch.nn.Module):
    """transformers' `LlamaForCausalLM` holding exactly our model's weights, on its device."""
    import transformers
    from transformers import LlamaConfig as HFLlamaConfig
    from transformers import LlamaForCausalLM as HFLlama

    transformers.logging.set_verbosity_error()
    weight = next(model.parameters())
    with torch.device(weight.device):
        hf = HFLlama(HFLlamaConfig(**model.config.to_hf_dict())).to(weight.dtype)
    missing, unexpected = hf.load_state_dict(dict(model.hf_state_dict()), strict=False)
    # A tied head is not in our export; transformers ties it to the embedding itself.
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"weights did not map onto transformers' Llama: {missing} {unexpected}")
    return hf.eval()


def _gpu_kernels(profiler) -> list[tuple[str, float]]:
    """(name, GPU microseconds) of each kernel the GPU ran, graph replays included;
    copies and memsets are not kernels of the model."""
    kernels = [
        (e.name, e.time_range.elapsed_us())
        for e in profiler.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    ]
    if not kernels:  # some profiler versions keep GPU work only in the raw kineto records
        kernels = [
            (e.name(), e.duration_ns() / 1000)
            for e in profiler.profiler.kineto_results.events()
            if str(e.device_type()).endswith("CUDA")
        ]
    return [
        (name, us)
        for name, us in kernels
        if "memcpy" not in name.lower() and "memset" not in name.lower()
    ]


def count_kernels(
    device: torch.device, fn: Callable[[], object]
) -> tuple[int | None, float | None]:
    """Run `fn()` once; return how many GPU kernels it ran and their summed GPU time in ms,
    or (None, None) on a CPU, where there are no kernels to count."""
    if torch.device(device).type != "cuda":
        fn()
        return None, None
    from torch.profiler import ProfilerActivity, profile

    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        fn()
        synchronize(device)
    kernels = _gpu_kernels(profiler)
    return len(kernels), sum(us for _, us in kernels) / 1000


def kernel_table(engine: LLMEngine, steps: int = 10, rows: int = 18) -> str:
    """The GPU kernels of the engine's next `steps` steps, by total GPU time (CUDA only).

    Run it with MINI_VLLM_PDL=0 for per-kernel costs: under programmatic dependent launch
    a kernel starts before the one ahead of it ends and waits, and the wait is counted.
    """
    from torch.profiler import ProfilerActivity, profile

    synchronize(engine.runner.device)
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        for _ in range(steps):
            engine.step()
        synchronize(engine.runner.device)
    return profiler.key_averages().table(
        sort_by="cuda_time_total", row_limit=rows, max_name_column_width=70
    )
