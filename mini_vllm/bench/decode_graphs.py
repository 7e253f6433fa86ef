"""`bench decode --modes ...`: decode step time per batch size, eager vs CUDA graphs, in one run.

vLLM counterpart: vllm/benchmarks/latency.py (`vllm bench latency`), run once with
`--enforce-eager` and once without; here every mode runs in the same process on the
same weights, so the ratios compare like with like.

For each batch size B and each mode, B requests with a prompt of `context_len`
tokens are added to a fresh engine (same model object, new KV cache); after the
prefill, decode steps are timed. Reported per step:
- `step ms`: the time from one engine step's return to the next one's, over `steps`
  steps in a row: scheduling, input copies, forward, sampling, and the wait for the
  tokens. With async scheduling (the `+async` modes) a step returns the tokens of the
  step before it, so the host plans one step while the device runs the other;
- `fwd ms`: the model forward alone, device-synchronised on both sides (what graphs
  change), over `steps` further steps;
- kernels per step: GPU kernels one decode step executes (torch.profiler; CUDA only);
- the weight-read floor: the bytes a decode step must read (every weight matrix once,
  one embedding row per token, the tied head once, the KV cache read) divided by the
  device-to-device copy bandwidth measured in the same run.
With `--compare-hf`, transformers' eager `generate` runs the same weights, batch and
prompt length; its per-step time is (time for N + 1 new tokens − time for 1) / N,
measured before and after all our modes, the faster of the two reported.
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass, field
from datetime import date

import torch

from mini_vllm.bench.harness import (
    ENGINE_LEN_SLACK,
    check_modes,
    count_kernels,
    decode_engine,
    start_decoding,
    transformers_twin,
)
from mini_vllm.errors import UserError
from mini_vllm.models.loader import load_model, load_model_config, resolve_device, resolve_dtype
from mini_vllm.teaching.launch_overhead import refit_preset, simulate_step
from mini_vllm.utils import synchronize

__all__ = [
    "GraphDecodeReport",
    "format_graph_markdown",
    "hf_step_ms",
    "measure_batch",
    "new_tokens_per_request",
    "run_graph_decode_bench",
]


@dataclass
class ModeResult:
    step_ms: float
    forward_ms: float
    kernels: int | None
    runtime_mode: str
    kernel_ms: float | None = None  # the step's kernels' own GPU time, summed (profiler)
    capture_s: float = 0.0
    graph_mib: float | None = None


@dataclass
class GraphDecodeReport:
    model: str
    device: str
    dtype: str
    context_len: int
    steps: int
    batch_sizes: list[int]
    modes: list[str]
    results: dict[tuple[int, str], ModeResult] = field(default_factory=dict)
    hf_ms: dict[int, float] = field(default_factory=dict)
    hf_compiled_ms: float | None = None  # batch 1, static cache + torch.compile
    floor_ms: dict[int, float] = field(default_factory=dict)
    bandwidth_gbs: float | None = None
    refit: str | None = None
    device_name: str = ""


def measure_copy_bandwidth(device: torch.device, mib: int = 1024) -> float | None:
    """Bytes per second of a large device-to-device copy, reads plus writes."""
    if device.type != "cuda":
        return None
    src = torch.empty(mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    synchronize(device)
    times = []
    for _ in range(10):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return 2 * src.numel() / statistics.median(times)


# ANCHOR: floor_bytes
def decode_floor_bytes(model: torch.nn.Module, batch: int, context_len: int) -> int:
    """Bytes one decode step must read: each weight matrix once, one embedding row per
    token, a tied head once (it is the embedding table), plus the KV cache of the batch."""
    cfg = model.config
    element = next(model.parameters()).element_size()
    embed = model.model.embed_tokens.weight
    # Every distinct parameter tensor is read once (a tied head *is* the embedding table)...
    weights = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()) * element
    # ...except an untied embedding table, of which only the looked-up rows are read.
    if not cfg.tie_word_embeddings:
        weights -= embed.numel() * element
    rows = batch * cfg.hidden_size * element
    kv = batch * context_len * cfg.num_hidden_layers * 2 * cfg.kv_size * element
    return weights + rows + kv


# ANCHOR_END: floor_bytes


def hf_step_ms(
    hf, batch: int, context_len: int, steps: int, vocab: int, device: torch.device
) -> float:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (batch, context_len), generator=gen).to(device)
    mask = torch.ones_like(ids)

    def run(new: int) -> float:
        synchronize(device)
        start = time.perf_counter()
        with torch.inference_mode():
            hf.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
            )
        synchronize(device)
        return time.perf_counter() - start

    run(2)  # warm-up
    long = statistics.median(run(steps + 1) for _ in range(3))
    short = statistics.median(run(1) for _ in range(3))
    return (long - short) / steps * 1000


def _hf_compiled_step_ms(
    hf, context_len: int, steps: int, vocab: int, device: torch.device, log
) -> float | None:
    """transformers with a static KV cache and its forward compiled (mode="reduce-overhead":
    Inductor plus CUDA graphs), batch 1, as its documentation describes; None if it fails."""
    try:
        hf.generation_config.cache_implementation = "static"
        hf.forward = torch.compile(hf.forward, mode="reduce-overhead", fullgraph=True)
        start = time.perf_counter()
        ms = hf_step_ms(hf, 1, context_len, steps, vocab, device)
        log(
            f"transformers static cache + compile: {ms:.2f} ms/step "
            f"(warm-up and compile {time.perf_counter() - start:.0f} s)"
        )
        return ms
    except Exception as exc:  # a baseline, not our code: report and go on
        log(f"transformers static cache + compile failed: {type(exc).__name__}: {str(exc)[:200]}")
        return None


def new_tokens_per_request(steps: int, warmup: int) -> int:
    """Tokens a request must be allowed: warm-up, two timed passes, the profiled step, slack."""
    return 2 * steps + warmup + 16


def measure_batch(
    engine, batch: int, context_len: int, steps: int, warmup: int, device
) -> ModeResult:
    runner = engine.runner
    start_decoding(engine, batch, context_len, new_tokens_per_request(steps, warmup))
    for _ in range(warmup):
        engine.step()
    # Whole steps first, then (on as many more steps) the forward alone: timing the
    # forward needs a device sync on each side of it, which would also stop the host
    # from queueing the LM head and the sampler while the forward runs.
    # A step's time is the gap between consecutive returns: a synchronous step ends
    # when its tokens are on the host, an async one when the previous step's are.
    step_s, forward_s, modes = [], [], set()
    synchronize(device)
    last = time.perf_counter()
    for _ in range(steps):
        engine.step()
        now = time.perf_counter()
        step_s.append(now - last)
        last = now
        modes.add(runner.last_step.runtime_mode)
    runner.time_forward = True
    for _ in range(steps):
        engine.step()
        forward_s.append(runner.last_step.forward_seconds)
        modes.add(runner.last_step.runtime_mode)
    runner.time_forward = False
    recorded = len(engine.stats.steps)
    kernels, kernel_ms = count_kernels(device, engine.step)
    profiled = engine.stats.steps[recorded:]
    if len(profiled) != 1 or not profiled[0].uniform_decode or profiled[0].num_reqs != batch:
        raise RuntimeError(
            "the profiled step was not a decode step of the whole batch (did requests finish?)"
        )
    while engine.has_unfinished_requests():  # let this batch finish before the next one
        engine.step()
    return ModeResult(
        step_ms=statistics.median(step_s) * 1000,
        forward_ms=statistics.median(forward_s) * 1000,
        kernels=kernels,
        kernel_ms=kernel_ms,
        runtime_mode="/".join(sorted(modes)),
    )


def _measure_mode(
    model,
    mode: str,
    batch_sizes: list[int],
    context_len: int,
    steps: int,
    warmup: int,
    device,
    block_size: int,
    log,
) -> dict[int, ModeResult]:
    start = time.perf_counter()
    engine = decode_engine(
        model, mode, batch_sizes, context_len, new_tokens_per_request(steps, warmup), block_size
    )
    report, compiled = engine.runner.capture_report, engine.runner.compile_report
    log(
        f"{mode}: engine ready in {time.perf_counter() - start:.1f} s"
        + (f" ({compiled.line()})" if compiled else "")
        + (f", {report.num_graphs} graphs captured in {report.seconds:.1f} s" if report else "")
    )
    results = {}
    for batch in batch_sizes:
        result = measure_batch(engine, batch, context_len, steps, warmup, device)
        if report:
            result.capture_s = report.seconds
            result.graph_mib = (
                report.graph_memory_bytes / 2**20 if report.graph_memory_bytes is not None else None
            )
        results[batch] = result
        log(
            f"batch {batch:3d} {mode:>18}: step {result.step_ms:7.3f} ms, forward "
            f"{result.forward_ms:7.3f} ms, kernels {result.kernels}, ran as {result.runtime_mode}"
        )
    del engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return results


def run_graph_decode_bench(
    model_name: str = "smollm2-135m",
    device: str = "cuda",
    dtype: str | None = "auto",
    batch_sizes: list[int] = (1, 2, 4, 8, 16, 32, 64),
    modes: list[str] = ("eager", "full", "piecewise"),
    context_len: int = 128,
    steps: int = 30,
    warmup: int = 5,
    compare_hf: bool = False,
    block_size: int = 16,
    log=print,
    compare_hf_compile: bool = False,
) -> GraphDecodeReport:
    check_modes(list(modes))
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    positions = load_model_config(model_name, progress=False).max_position_embeddings
    needed = context_len + new_tokens_per_request(steps, warmup) + ENGINE_LEN_SLACK
    if needed > positions:
        raise UserError(
            f"a context of {context_len} tokens, {steps} timed steps (run twice) and "
            f"{warmup} warm-up steps need {needed} positions, but {model_name} has "
            f"{positions}; lower the context length or the steps"
        )
    model, _, config = load_model(model_name, device=dev, dtype=dt, progress=False)
    report = GraphDecodeReport(
        model_name,
        str(dev),
        str(dt).replace("torch.", ""),
        context_len,
        steps,
        list(batch_sizes),
        list(modes),
    )
    report.device_name = (
        torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu"
    )
    bandwidth = measure_copy_bandwidth(dev)
    report.bandwidth_gbs = bandwidth / 1e9 if bandwidth else None
    hf = None
    if compare_hf:
        hf = transformers_twin(model)
    # transformers is timed before and after our modes and its faster time is kept: a
    # host that is busier at one end of the run cannot flatter our ratio.
    hf_runs: dict[int, list[float]] = {batch: [] for batch in batch_sizes}

    def time_hf() -> None:
        for batch in batch_sizes:
            hf_runs[batch].append(
                hf_step_ms(hf, batch, context_len, min(steps, 16), config.vocab_size, dev)
            )

    if hf is not None:
        time_hf()
    for mode in modes:
        for batch, result in _measure_mode(
            model, mode, list(batch_sizes), context_len, steps, warmup, dev, block_size, log
        ).items():
            report.results[(batch, mode)] = result
    if hf is not None:
        time_hf()
    for batch in batch_sizes:
        if hf is not None:
            report.hf_ms[batch] = min(hf_runs[batch])
            log(
                f"batch {batch:3d} {'transformers':>18}: step {report.hf_ms[batch]:7.3f} "
                f"ms (before and after: {', '.join(f'{t:.3f}' for t in hf_runs[batch])})"
            )
        if bandwidth:
            report.floor_ms[batch] = (
                decode_floor_bytes(model, batch, context_len) / bandwidth * 1000
            )
    if compare_hf_compile and dev.type == "cuda":
        report.hf_compiled_ms = _hf_compiled_step_ms(
            transformers_twin(model), context_len, min(steps, 16), config.vocab_size, dev, log
        )
    # The simulator's SmolLM2 preset, refitted to this run's eager batch-1 forward.
    eager, full = report.results.get((1, "eager")), report.results.get((1, "full"))
    if (
        eager
        and full
        and eager.kernels
        and config.num_hidden_layers == 30
        and config.hidden_size == 576
    ):
        measured = eager.forward_ms / full.forward_ms
        lines = []
        # First as the preset stands (its node cost from the naive model), then, where the
        # run has a profile, with the node cost read off the eager kernels: both predict.
        for kernel_ms in [None] + ([eager.kernel_ms] if eager.kernel_ms is not None else []):
            refit = refit_preset(
                "h100-smollm2-135m",
                eager_ms=eager.forward_ms,
                num_kernels=eager.kernels,
                kernel_gpu_ms=kernel_ms,
            )
            predicted = simulate_step(refit, 1).speedup
            source = (
                f"node cost {refit.hardware.node_us:.2f} us from the eager "
                f"kernels' own GPU time ({kernel_ms:.3f} ms in all, profiler)"
                if kernel_ms is not None
                else f"the preset's node cost {refit.hardware.node_us:.2f} us"
            )
            lines.append(
                "simulator preset h100-smollm2-135m refitted to this run's "
                f"eager forward ({eager.forward_ms:.2f} ms, {eager.kernels} "
                f"kernels, launch cost {refit.hardware.launch_us:.1f} us), "
                f"{source}: predicts a FULL speed-up of {predicted:.2f}x; measured "
                f"{measured:.2f}x ({(predicted / measured - 1) * 100:+.0f}%)"
            )
        report.refit = "\n\n".join(lines)
        log(report.refit)
    return report


def format_graph_markdown(report: GraphDecodeReport, command: str) -> str:
    lines = [
        "# Decode step time: eager vs CUDA graphs" + (" vs transformers" if report.hf_ms else ""),
        "",
        f"- date: {date.today().isoformat()}",
        f"- machine: {report.device_name}; torch {torch.__version__}",
        f"- command: `{command}`",
        f"- model: `{report.model}` ({report.dtype}), context {report.context_len} "
        f"tokens, median of {report.steps} decode steps after warm-up",
        "- step = time between consecutive engine steps' returns (schedule, copy "
        "inputs, forward, sample, wait for the tokens; `+async`: the host plans "
        "step N+1 while the device runs step N); fwd = forward alone, synchronised "
        "(timed on separate steps, so that the step has no sync inside it)",
    ]
    if report.bandwidth_gbs:
        lines.append(
            f"- copy bandwidth measured in this run: {report.bandwidth_gbs:.0f} GB/s (read + write)"
        )
    lines.append("")
    header = ["batch"]
    for mode in report.modes:
        header += [f"{mode} step ms", f"{mode} fwd ms", f"{mode} kernels"]
    if report.hf_ms:
        header.append("transformers ms")
    header += ["best vs eager"]
    if report.hf_ms:
        header.append("best vs transformers")
    if report.floor_ms:
        header += ["floor ms", "floor / best step"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for batch in report.batch_sizes:
        row = [str(batch)]
        for mode in report.modes:
            r = report.results[(batch, mode)]
            row += [
                f"{r.step_ms:.3f}",
                f"{r.forward_ms:.3f}",
                str(r.kernels if r.kernels is not None else "n/a"),
            ]
        best = min(report.results[(batch, m)].step_ms for m in report.modes)
        if report.hf_ms:
            row.append(f"{report.hf_ms[batch]:.2f}")
        eager = report.results.get((batch, "eager"))
        row.append(f"{eager.step_ms / best:.2f}x" if eager else "n/a")
        if report.hf_ms:
            row.append(f"{report.hf_ms[batch] / best:.1f}x")
        if report.floor_ms:
            row += [f"{report.floor_ms[batch]:.3f}", f"{report.floor_ms[batch] / best:.0%}"]
        lines.append("| " + " | ".join(row) + " |")
    captures = {m: r for (b, m), r in report.results.items() if r.capture_s}  # one engine per mode
    if captures:
        sizes = ", ".join(str(b) for b in report.batch_sizes)
        lines += [
            "",
            f"Capture (one engine per mode, sizes {sizes}): time "
            "and graph memory (free memory before minus after):",
            "",
        ]
        for m, r in captures.items():
            mem = f", {r.graph_mib:.1f} MiB" if r.graph_mib is not None else ""
            lines.append(f"- {m}: {r.capture_s:.2f} s{mem}")
    if report.hf_compiled_ms is not None:
        best1 = min(report.results[(report.batch_sizes[0], m)].step_ms for m in report.modes)
        lines += [
            "",
            "transformers with a static cache and torch.compile (mode=reduce-overhead), "
            f"batch {report.batch_sizes[0]}: {report.hf_compiled_ms:.2f} "
            f"ms/step; our best: {best1:.3f} ms ({report.hf_compiled_ms / best1:.2f}x)",
        ]
    if report.refit:
        lines += ["", report.refit]
    return "\n".join(lines) + "\n"
