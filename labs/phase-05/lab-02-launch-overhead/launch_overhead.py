"""Lab 02 — launch overhead: when do CUDA graphs pay, and when do they stop paying?

Your code.

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
`simulate_step`, `sweep`, `render_ascii`. What you write, one step each (see the README):

1. `kernel_gpu_us`   — a kernel's GPU time, the roofline;
2. `eager_timeline`  — the eager step on two lanes;
3. `graph_timeline`  — the step as one graph replay;
4. `crossover_batch` — the first batch size where graphs stop paying;
5. `get_preset`      — a preset by its name.

Each TODO's docstring says what the function must guarantee; how is up to you.

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

    Guarantees:
      - the kernel takes as long as the slower of its two limits, moving its bytes at
        `hw.bandwidth` (bytes per second) and doing its FLOPs at `hw.peak_flops` (FLOP
        per second); the two overlap, they do not add up;
      - a decode step reads the kernel's weights once, whatever the batch; each of the
        `batch` sequences adds its activations (`bytes_per_token`), its own KV cache read
        (`kv_bytes_per_seq`) and its FLOPs (`flops_per_token`);
      - a batch that is not a positive int (0, -3, 2.0, True) is a ValueError.

    Example: 4 MB of weights and 1 MFLOP a token, at 1 TB/s and 100 TFLOP/s: 4.0 µs at
    batch 1 (memory-bound); 1 GFLOP a token instead: 10.0 µs at batch 1, 40.0 at batch 4.
    """
    raise NotImplementedError("TODO: the roofline of bytes and FLOPs, in µs")


def eager_timeline(kernels: Sequence[Kernel], batch: int, hw: Hardware) -> list[Span]:
    """The eager step: one CPU span and one GPU span per kernel (2 * len(kernels) spans).

    Guarantees, with each lane's spans in launch order and named after their kernel:
      - CPU: the first launch starts at 0; each lasts `hw.launch_us`; they are back to
        back (a launch starts when the one before ends);
      - GPU: kernel i starts at the later of the end of its own launch and the end of
        kernel i - 1 (never earlier, never later), and lasts
        `kernel_gpu_us(kernel, batch, hw) + hw.eager_gap_us`.

    Example: two kernels of 30 µs and 1 µs, launch_us 4, eager_gap_us 1: CPU spans
    (0, 4), (4, 8); GPU spans (4, 35), (35, 37); the step ends at 37.
    """
    raise NotImplementedError("TODO: the eager step's CPU and GPU spans")


def graph_timeline(kernels: Sequence[Kernel], batch: int, hw: Hardware) -> list[Span]:
    """The step as one graph replay: 1 CPU span, then one GPU span per kernel.

    Guarantees:
      - the CPU lane holds exactly one span, `Span(CPU, GRAPH_LAUNCH, 0, graph_launch_us)`;
      - the GPU spans are named after the kernels, in order, the first starting when the
        launch ends and each next one when the one before ends; each lasts
        `kernel_gpu_us(kernel, batch, hw) + hw.node_us`.

    Example: 50 kernels of 3 µs, graph_launch_us 12, node_us 1.5: the step ends at
    237 µs.
    """
    raise NotImplementedError("TODO: one graph launch, then the nodes on the GPU")


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
    """The smallest batch size in 1..max_batch at which graphs stop paying: where the
    speedup (`simulate_step(...).speedup`) has fallen to `threshold`; None if graphs still
    pay at `max_batch`. Whether a speedup exactly equal to the threshold still pays is
    left to you (the README's step 4 asks).

    You may rely on the speedup never rising with the batch size. A threshold <= 1.0 is a
    ValueError (it is a speedup), and so is a `max_batch` that is not a positive int.
    It must stay quick: a few dozen steps simulated, not thousands.

    Example: the Llama-3.1-8B preset's speedup is 1.205 at batch 16 and falls below 1.2
    at batch 17, so `crossover_batch(llama, threshold=1.2) == 17`; with a speedup of 0.9
    already at batch 1 the answer is 1.
    """
    raise NotImplementedError("TODO: the first batch size where graphs stop paying")


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
    """The preset called `name` in PRESETS.

    An unknown name is a ValueError whose message holds that name and every known one,
    e.g. "unknown preset 'a100'; choose one of: h100-llama3.1-8b, h100-smollm2-135m".
    """
    raise NotImplementedError("TODO: look the preset up; an unknown name lists the known ones")
