"""Lab 02 — launch overhead: when do CUDA graphs pay, and when do they stop paying?

Your code. It mirrors mini_vllm/teaching/launch_overhead.py (the reference).

One decode step is a list of kernels. Draw it on two lanes: the CPU issues launches,
the GPU executes kernels.
- Eager: the CPU spends `launch_us` issuing each kernel, one after another. The GPU
  runs a kernel once both the GPU is free and that kernel's launch has been issued;
  it is then busy for the kernel's own time plus `eager_gap_us`.
- Graph: the CPU issues ONE launch (`graph_launch_us`); then the GPU runs every node
  back to back, each for its own time plus `node_us`.
A kernel's own time is a roofline: the slower of moving its bytes at `bandwidth` and
doing its FLOPs at `peak_flops`. Weights are read once per step; activations, FLOPs
and the KV cache read grow with the batch. So at small batch the eager step is paced
by the CPU (launch-bound) and a graph helps a lot; at large batch both are paced by
the GPU and the graph's gain shrinks.

Given: the data classes and the presets (imported from mini_vllm.teaching.launch_overhead,
where the comments say where every number comes from), `step_time_us`,
`simulate_step`, `sweep`, `render_ascii`. What you write, in this order:

1. `kernel_gpu_us`  — the roofline;
2. `eager_timeline` and `graph_timeline` — the two-lane rules above;
3. `crossover_batch` — the first batch size whose speedup falls below the threshold;
4. `get_preset`     — look a preset up, or say which ones exist.

Run: pytest labs/phase-05/lab-02-launch-overhead
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mini_vllm.teaching.launch_overhead import (
    CPU,
    CROSSOVER_THRESHOLD,
    GPU,
    GRAPH_LAUNCH,
    PRESETS,
    Hardware,
    Kernel,
    Preset,
    Span,
    StepResult,
)

__all__ = [
    "CROSSOVER_THRESHOLD",
    "Hardware",
    "Kernel",
    "PRESETS",
    "Preset",
    "Span",
    "StepResult",
    "crossover_batch",
    "eager_timeline",
    "get_preset",
    "graph_timeline",
    "kernel_gpu_us",
    "render_ascii",
    "simulate_step",
    "step_time_us",
    "sweep",
]


def _as_preset(preset: Preset | str) -> Preset:
    return get_preset(preset) if isinstance(preset, str) else preset


def _check_batch(batch: int) -> None:
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch size must be a positive integer, got {batch!r}")


def kernel_gpu_us(kernel: Kernel, batch: int, hw: Hardware) -> float:
    """The kernel's own GPU time in µs at this batch size: a roofline.

    bytes moved = weight_bytes + batch * (bytes_per_token + kv_bytes_per_seq)
    FLOPs       = batch * flops_per_token
    time        = the larger of bytes / hw.bandwidth and FLOPs / hw.peak_flops
                  (both in seconds: convert to µs).
    Reject a batch that is not a positive integer (`_check_batch`).
    """
    raise NotImplementedError("TODO: the roofline max(bytes / bandwidth, flops / peak), in µs")


def eager_timeline(kernels: Sequence[Kernel], batch: int, hw: Hardware) -> list[Span]:
    """Eager: one CPU span and one GPU span per kernel, in launch order.

    Keep two clocks, when the CPU is free and when the GPU is free, both starting at 0.
    For each kernel: the CPU issues it from cpu_free for hw.launch_us, giving
    Span(CPU, kernel.name, start, end); the GPU starts it at the later of gpu_free and
    the end of that launch, and is busy for kernel_gpu_us(...) + hw.eager_gap_us,
    giving Span(GPU, kernel.name, start, end).
    """
    raise NotImplementedError(
        "TODO: two clocks; a kernel starts when the GPU is free AND its launch is issued"
    )


def graph_timeline(kernels: Sequence[Kernel], batch: int, hw: Hardware) -> list[Span]:
    """Graph replay: Span(CPU, GRAPH_LAUNCH, 0, hw.graph_launch_us), then one GPU span a
    kernel, back to back from the end of that launch, each kernel_gpu_us(...) + hw.node_us."""
    raise NotImplementedError("TODO: one CPU launch span, then the nodes back to back on the GPU")


def step_time_us(spans: Iterable[Span]) -> float:
    """A step ends when its last bar (on either lane) ends."""
    return max((s.end_us for s in spans), default=0.0)


def _launches(spans: Iterable[Span]) -> int:
    return sum(1 for s in spans if s.lane == CPU)


def simulate_step(preset: Preset | str, batch: int) -> StepResult:
    """Eager and graph step time of one decode step at this batch size."""
    preset = _as_preset(preset)
    eager = eager_timeline(preset.kernels, batch, preset.hardware)
    graph = graph_timeline(preset.kernels, batch, preset.hardware)
    return StepResult(
        batch, step_time_us(eager), step_time_us(graph), _launches(eager), _launches(graph)
    )


def sweep(preset: Preset | str, batch_sizes: Iterable[int]) -> list[StepResult]:
    """`simulate_step` at each batch size: the data of a speedup-vs-batch curve."""
    preset = _as_preset(preset)
    return [simulate_step(preset, b) for b in batch_sizes]


def crossover_batch(
    preset: Preset | str, threshold: float = CROSSOVER_THRESHOLD, max_batch: int = 4096
) -> int | None:
    """The smallest batch size in 1..max_batch whose speedup (`simulate_step(...).speedup`)
    is below `threshold`; None if graphs still pay at `max_batch`.

    A threshold <= 1.0 is a ValueError. The speedup never rises with batch size, so you
    need not try every batch: bisect between a batch that pays and one that does not
    (a linear scan of 4096 batch sizes takes many seconds).
    """
    raise NotImplementedError("TODO: bisect for the first batch size whose speedup < threshold")


def render_ascii(
    preset: Preset | str, batch: int = 1, num_kernels: int = 8, width: int = 72
) -> str:
    """The two lanes of the first `num_kernels` kernels, eager above graph, on one time scale.

    Digits name kernels (kernel i is drawn with i mod 10), '=' the graph launch, '.' idle.
    """
    preset = _as_preset(preset)
    if num_kernels < 1 or width < 10:
        raise ValueError("num_kernels must be >= 1 and width >= 10")
    kernels = preset.kernels[:num_kernels]
    views = {
        "eager": eager_timeline(kernels, batch, preset.hardware),
        "graph": graph_timeline(kernels, batch, preset.hardware),
    }
    end = max(step_time_us(spans) for spans in views.values())
    scale = width / end

    def lane(spans: list[Span], lane_name: str) -> str:
        row = ["."] * width
        kernel_index = 0
        for span in (s for s in spans if s.lane == lane_name):
            if span.name == GRAPH_LAUNCH:
                mark = "="
            else:
                mark = str(kernel_index % 10)
                kernel_index += 1
            first = int(span.start_us * scale)
            last = max(first + 1, int(span.end_us * scale))  # every bar at least one column
            row[first : min(last, width)] = mark * (min(last, width) - first)
        return "".join(row)

    lines = [f"{preset.name}, batch {batch}, first {len(kernels)} kernels, 0 .. {end:.1f} us"]
    for mode, spans in views.items():
        lines.append(f"{mode:>5} CPU |{lane(spans, CPU)}| {step_time_us(spans):8.1f} us")
        lines.append(f"{'':>5} GPU |{lane(spans, GPU)}|")
    lines.append("digits: kernel index mod 10; '=': graph launch; '.': idle")
    return "\n".join(lines)


def get_preset(name: str) -> Preset:
    """PRESETS[name]; an unknown name is a ValueError that lists the names there are."""
    raise NotImplementedError("TODO: look the preset up; an unknown name lists the known ones")
