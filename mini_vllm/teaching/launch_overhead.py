"""Launch overhead: a two-lane (CPU issues, GPU executes) timeline of one decode step.

Eager PyTorch pays host time for every kernel it launches (Python, the dispatcher,
`cudaLaunchKernel`); the GPU cannot start a kernel before its launch is issued, so a
step of many short kernels is *launch-bound*: the GPU idles between them. A CUDA
graph issues the whole step with one launch; the GPU then runs the recorded nodes
back to back, paying only a small per-node cost. As the batch grows each kernel moves
more bytes and does more FLOPs, the GPU becomes the bottleneck, and the graph's gain
shrinks: past the crossover batch size graphs no longer pay for themselves.

This is the course's own model, not a vLLM file. It explains why vLLM captures graphs
only up to a maximum size (vllm/config/vllm.py `_set_cudagraph_sizes`) and runs larger
batches eagerly (vllm/v1/cudagraph_dispatcher.py `dispatch`), and why `enforce_eager`
costs most at small batch. Its numbers are parameters, not measurements of this
repository: where each comes from is said in the comments next to it, in the `PRESETS`
block below. What this repository measured on an H100 is in benchmarks/results/
(decode-graphs-cuda.md and the runs after it), and `refit_preset` fits a preset to such a run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from mini_vllm.models.config import MODEL_CONFIGS, LlamaConfig

__all__ = [
    "CROSSOVER_THRESHOLD",
    "GRAPH_NODE_GAP_US",
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
    "refit_preset",
    "render_ascii",
    "simulate_step",
    "step_time_us",
    "sweep",
]

# Graphs "stop paying" at the first batch size whose speedup falls below this: a
# graph that saves under 5% of a step is not worth its capture time and memory.
CROSSOVER_THRESHOLD = 1.05

CPU, GPU = "cpu", "gpu"
GRAPH_LAUNCH = "graph launch"


# ANCHOR: kernel
@dataclass(frozen=True)
class Kernel:
    """One kernel of a decode step and what it moves and computes.

    A decode step of batch B processes B tokens (one per sequence). Weights are read
    once whatever B is; activations, FLOPs and the KV cache read grow with B.
    """

    name: str
    weight_bytes: float = 0.0  # read once per step (a projection's weight matrix)
    bytes_per_token: float = 0.0  # activations read and written, per token in the batch
    flops_per_token: float = 0.0
    kv_bytes_per_seq: float = 0.0  # KV cache read by attention, per sequence


# ANCHOR_END: kernel


# ANCHOR: hardware
@dataclass(frozen=True)
class Hardware:
    """The machine and software stack: what a launch costs and how fast the GPU is."""

    launch_us: float  # host time to issue one eager kernel (Python + dispatcher + launch)
    graph_launch_us: float  # host time to launch one captured graph (cudaGraphLaunch)
    eager_gap_us: float  # GPU time an eagerly launched kernel costs beyond its work
    node_us: float  # GPU time a graph node costs beyond its work
    bandwidth: float  # bytes/s the GPU's memory sustains
    peak_flops: float  # FLOP/s the GPU's tensor cores sustain

    def __post_init__(self) -> None:
        for name in ("launch_us", "graph_launch_us", "eager_gap_us", "node_us"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.bandwidth <= 0 or self.peak_flops <= 0:
            raise ValueError("bandwidth and peak_flops must be > 0")


# ANCHOR_END: hardware


@dataclass(frozen=True)
class Span:
    """One bar of the timeline: `lane` is "cpu" (issuing) or "gpu" (executing)."""

    lane: str
    name: str
    start_us: float
    end_us: float


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    hardware: Hardware
    kernels: tuple[Kernel, ...]
    # What the preset was fitted to: {batch size: (eager ms, graph ms)}.
    reference_ms: dict[int, tuple[float, float]]
    # The model shape the kernel list was built from (`_llama_kernels` arguments),
    # so that `refit_preset` can rebuild it with another kernel count.
    shape: dict | None = None
    # The results file that holds `reference_ms` (and the kernel count, where the preset
    # is fitted to one), in its table of what the presets are fitted to.
    source: str = ""


@dataclass(frozen=True)
class StepResult:
    batch: int
    eager_us: float
    graph_us: float
    eager_launches: int  # launches the host issues per step
    graph_launches: int

    @property
    def speedup(self) -> float:
        return self.eager_us / self.graph_us


def _as_preset(preset: Preset | str) -> Preset:
    return get_preset(preset) if isinstance(preset, str) else preset


def _check_batch(batch: int) -> None:
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch size must be a positive integer, got {batch!r}")


# ANCHOR: kernel_gpu_us
def kernel_gpu_us(kernel: Kernel, batch: int, hw: Hardware) -> float:
    """The kernel's own GPU time: a roofline, the slower of moving its bytes and doing its FLOPs."""
    _check_batch(batch)
    moved = kernel.weight_bytes + batch * (kernel.bytes_per_token + kernel.kv_bytes_per_seq)
    flops = batch * kernel.flops_per_token
    return max(moved / hw.bandwidth, flops / hw.peak_flops) * 1e6


# ANCHOR_END: kernel_gpu_us


# ANCHOR: eager_timeline
def eager_timeline(kernels: Sequence[Kernel], batch: int, hw: Hardware) -> list[Span]:
    """Eager: the host issues kernels one after another; each runs on the GPU as soon as
    both the GPU is free and its own launch has been issued."""
    spans: list[Span] = []
    cpu_free = gpu_free = 0.0
    for k in kernels:
        issued = cpu_free + hw.launch_us
        spans.append(Span(CPU, k.name, cpu_free, issued))
        cpu_free = issued
        start = max(gpu_free, issued)
        gpu_free = start + kernel_gpu_us(k, batch, hw) + hw.eager_gap_us
        spans.append(Span(GPU, k.name, start, gpu_free))
    return spans


# ANCHOR_END: eager_timeline


# ANCHOR: graph_timeline
def graph_timeline(kernels: Sequence[Kernel], batch: int, hw: Hardware) -> list[Span]:
    """Graph replay: one launch on the host, then every node back to back on the GPU."""
    spans = [Span(CPU, GRAPH_LAUNCH, 0.0, hw.graph_launch_us)]
    gpu_free = hw.graph_launch_us
    for k in kernels:
        end = gpu_free + kernel_gpu_us(k, batch, hw) + hw.node_us
        spans.append(Span(GPU, k.name, gpu_free, end))
        gpu_free = end
    return spans


# ANCHOR_END: graph_timeline


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


# ANCHOR: crossover
def crossover_batch(
    preset: Preset | str, threshold: float = CROSSOVER_THRESHOLD, max_batch: int = 4096
) -> int | None:
    """The smallest batch size whose graph speedup is below `threshold`, or None if
    graphs still pay at `max_batch`.

    Bisection is valid because the speedup never rises with batch size: the eager
    step's launch cost is fixed while the GPU work both modes share keeps growing.
    """
    if threshold <= 1.0:
        raise ValueError(f"threshold must be > 1.0 (a speedup), got {threshold}")
    _check_batch(max_batch)
    preset = _as_preset(preset)

    # ANCHOR: crossover_bisect
    def pays(batch: int) -> bool:
        return simulate_step(preset, batch).speedup >= threshold

    if not pays(1):
        return 1
    if pays(max_batch):
        return None
    lo, hi = 1, max_batch  # invariant: pays(lo) and not pays(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if pays(mid) else (lo, mid)
    return hi
    # ANCHOR_END: crossover_bisect


# ANCHOR_END: crossover


# ANCHOR: render_ascii
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


# ANCHOR_END: render_ascii


# --- Presets -------------------------------------------------------------------------

BF16 = 2  # bytes per weight / activation element


def _llama_kernels(
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    mlp: int,
    vocab: int,
    context_len: int,
    extra_per_layer: int,
    sampler_kernels: int,
    extra_tail: int = 0,
) -> tuple[Kernel, ...]:
    """The kernels of one decode step of a Llama-shaped model, in launch order
    (`extra_tail` small housekeeping kernels after the sampler's, to reach a count)."""
    q, kv = heads * head_dim, kv_heads * head_dim
    act = hidden * BF16  # one token's hidden state

    def gemm(name: str, n_in: int, n_out: int) -> Kernel:
        return Kernel(
            name,
            weight_bytes=n_in * n_out * BF16,
            bytes_per_token=(n_in + n_out) * BF16,
            flops_per_token=2 * n_in * n_out,
        )

    def pointwise(name: str, width: int = hidden) -> Kernel:
        return Kernel(name, bytes_per_token=3 * width * BF16, flops_per_token=4 * width)

    layer = [
        pointwise("rmsnorm"),
        gemm("qkv_proj", hidden, q + 2 * kv),
        pointwise("rotary", q + kv),
        pointwise("kv_cache_write", 2 * kv),
        Kernel(
            "attention",
            bytes_per_token=2 * q * BF16,
            kv_bytes_per_seq=context_len * 2 * kv * BF16,
            flops_per_token=4 * context_len * q,
        ),
        gemm("o_proj", q, hidden),
        pointwise("residual_rmsnorm"),
        gemm("gate_up_proj", hidden, 2 * mlp),
        pointwise("silu_and_mul", mlp),
        gemm("down_proj", mlp, hidden),
        pointwise("residual_add"),
    ]
    # Small housekeeping kernels an eager step also launches (copies, casts, views made
    # contiguous); they move next to nothing but each is a launch.
    layer += [pointwise(f"misc{i}", 64) for i in range(extra_per_layer)]
    step = [Kernel("embedding", bytes_per_token=2 * act)]
    for i in range(layers):
        step += [replace(k, name=f"L{i}.{k.name}") for k in layer]
    step += [pointwise("final_norm"), gemm("lm_head", hidden, vocab)]
    step += [pointwise(f"sampler{i}", vocab) for i in range(sampler_kernels)]
    step += [pointwise(f"misc_tail{i}", 64) for i in range(extra_tail)]
    return tuple(step)


def _h100(launch_us: float, node_us: float) -> Hardware:
    """An H100 SXM: the presets differ only in the host's launch cost and a node's cost."""
    return Hardware(
        launch_us=launch_us,
        graph_launch_us=GRAPH_LAUNCH_US,
        eager_gap_us=H100_EAGER_GAP_US,
        node_us=node_us,
        bandwidth=H100_BANDWIDTH,
        peak_flops=H100_PEAK_BF16,
    )


# ANCHOR: presets
# Both presets model an H100 SXM. 3.0 TB/s is a round copy bandwidth for an H100 (the
# run in benchmarks/results/decode-graphs-cuda.md measured 2883 GB/s, read + write);
# 989 TFLOP/s is its dense BF16 tensor-core peak, which decode never nears (FLOPs only
# matter at prefill-sized batches).
# An eagerly launched kernel costs the GPU ~5 µs beyond its work even when the host
# is ahead: the front end takes each launch from the stream on its own and sets up its
# grid (the low end of the "5-20 µs end to end" that write-ups on launch overhead quote
# for one launch). A graph does that setup once, at instantiation, leaving the ~1-2 µs a
# node they quote. Without this gap eager and graph would tie once the GPU is the
# bottleneck; the Llama-3.1-8B table's eager step stays ~2.6 ms slower even at batch 32.
H100_BANDWIDTH = 3.0e12
H100_PEAK_BF16 = 989e12
H100_EAGER_GAP_US = 5.0
GRAPH_LAUNCH_US = 10.0  # one cudaGraphLaunch: a few to ~10 µs of host time, noise next to a step
# Between two nodes of a replayed graph the GPU still loses about a microsecond: the
# "~1-2 µs of GPU time per node" quoted for H100s is this gap plus the node's own
# kernel, and 1 µs is the low end, for kernels that are themselves next to free.
GRAPH_NODE_GAP_US = 1.0


def _shape_of(config: LlamaConfig, **step: int) -> dict:
    """`_llama_kernels`' model arguments for a named shape of mini_vllm/models/config.py,
    plus the step's own (`context_len`, `extra_per_layer`, `sampler_kernels`)."""
    return dict(
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        heads=config.num_attention_heads,
        kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        mlp=config.intermediate_size,
        vocab=config.vocab_size,
        **step,
    )


_LLAMA31_8B = dict(
    layers=32,
    hidden=4096,
    heads=32,
    kv_heads=8,
    head_dim=128,
    mlp=14336,
    vocab=128256,
    context_len=6144,
    extra_per_layer=4,
    sampler_kernels=10,
)
_SMOLLM2_135M = _shape_of(
    MODEL_CONFIGS["smollm2-135m"], context_len=128, extra_per_layer=35, sampler_kernels=11
)

PRESETS: dict[str, Preset] = {
    # Fitted to a table published in an article on CUDA graphs: Llama-3.1-8B decode on
    # an H100 SXM, ms a step, eager -> graph (`reference_ms` below). The table is the
    # article's, not a measurement of this repository. The fit comes within 8% of the
    # table's speedups and within 15% of its step times; it does not match them.
    "h100-llama3.1-8b": Preset(
        name="h100-llama3.1-8b",
        description="Llama-3.1-8B decode on an H100 SXM, an engine with fused "
        "kernels (parameters fitted to an article's eager vs graph table)",
        hardware=_h100(
            # Host time a kernel: Python module code, the dispatcher, cudaLaunchKernel.
            # The table's eager step at batch 1 (8.4 ms) is launch-bound; over the 493
            # kernels below that is 17 µs each. We take 19 µs, fitted to the table's
            # *speedup* at batch 1, because our graph step there is ~13% slower than
            # the table's 5.1 ms: at 3.0 TB/s the weights alone take 5.0 ms.
            launch_us=19.0,
            # 1 µs, the low end of the quoted range: the table's graph step at batch 1
            # (5.1 ms) leaves almost nothing beyond reading the 15 GB of weights.
            node_us=1.0,
        ),
        # Llama-3.1-8B config: 32 layers, hidden 4096, 32 query / 8 KV heads of 128,
        # MLP 14336, vocabulary 128256, untied head; 11 kernels a layer in an engine
        # with fused norms and activations, plus 4 small housekeeping ones. The table does
        # not state its context; its graph step grows ~0.35 ms a sequence (5.1 -> 16.1 ms
        # from batch 1 to 32), about 1 GB of KV read at 3 TB/s: several thousand tokens.
        kernels=_llama_kernels(**_LLAMA31_8B),
        reference_ms={1: (8.4, 5.1), 4: (9.2, 6.0), 16: (12.1, 9.3), 32: (18.7, 16.1)},
        shape=_LLAMA31_8B,
        source="benchmarks/results/headline-llama-3.1-8b-like.md",
    ),
    # Illustrative parameters, fitted to one timing taken outside this repository's
    # scripts: a plain static-KV-cache Llama of a few dozen lines (not mini_vllm) in
    # SmolLM2-135M's shape, bf16, on an H100, batch 1, context 128: eager 20.6 ms, one
    # CUDA graph 2.87 ms, 1394 kernels. The headline file of this shape records that
    # timing as what it is, and beside it what mini_vllm's own model measures (971
    # kernels with torch's own layers); `refit_preset` fits this preset to such a run.
    "h100-smollm2-135m": Preset(
        name="h100-smollm2-135m",
        description="SmolLM2-135M shape, unfused PyTorch decode (illustrative "
        "parameters from one H100 timing of a plain static-KV-cache Llama)",
        hardware=_h100(
            launch_us=14.8,  # 20.6 ms / 1394 kernels: the step is entirely launch-bound
            # (2.87 ms - ~0.1 ms of bytes) / 1394 nodes ≈ 2 µs, the top of the quoted
            # range: every node is a tiny unfused kernel that is almost all fixed cost.
            node_us=2.0,
        ),
        # SmolLM2-135M config: 30 layers, hidden 576, 9 query / 3 KV heads of 64,
        # MLP 1536, vocabulary 49152, tied head. Unfused RMSNorm, rotary and the cache
        # update make ~46 kernels a layer: 11 counted by kind plus 35 small ones, and 11
        # for the argmax tail, 1394 in all, the count of that timing.
        kernels=_llama_kernels(**_SMOLLM2_135M),
        reference_ms={1: (20.6, 2.87)},
        shape=_SMOLLM2_135M,
        source="benchmarks/results/headline-smollm2-135m.md",
    ),
}
# ANCHOR_END: presets


def get_preset(name: str) -> Preset:
    """The named preset, or a ValueError that lists the names there are."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(
            f"unknown preset {name!r}; choose one of: {', '.join(sorted(PRESETS))}"
        ) from None


# ANCHOR: refit
def refit_preset(
    preset: Preset | str,
    *,
    eager_ms: float,
    num_kernels: int,
    batch: int = 1,
    kernel_gpu_ms: float | None = None,
) -> Preset:
    """The preset re-fitted to a measured eager step: its kernels and its launch cost.

    The kernel list is rebuilt with small housekeeping kernels added, in every layer and
    after the sampler, until it holds exactly `num_kernels` (or the model's own kernels
    alone, if those are more), and the host's launch cost is solved (by
    bisection: the eager step grows with it) so that the simulated eager step takes
    `eager_ms` at `batch`. `kernel_gpu_ms`, if given, is how long the eager step's
    kernels ran on the GPU in all (a profiler reads it off the same eager run): a graph
    replays those very kernels back to back, so a node is priced at its kernel's mean
    time beyond the roofline work plus `GRAPH_NODE_GAP_US`. Without it the preset's
    node cost is kept. Either way nothing is fitted to a graph measurement: what the
    refitted preset says about the graph step is a prediction.
    """
    preset = _as_preset(preset)
    if preset.shape is None:
        raise ValueError(f"preset {preset.name!r} records no model shape; it cannot be refitted")
    if eager_ms <= 0 or num_kernels < 1:
        raise ValueError("eager_ms must be > 0 and num_kernels >= 1")
    shape = dict(preset.shape)
    base = len(_llama_kernels(**{**shape, "extra_per_layer": 0, "extra_tail": 0}))
    # As many housekeeping kernels a layer as fit, the rest after the sampler: exactly
    # `num_kernels` (when there are at least the model's own).
    shape["extra_per_layer"] = max(0, (num_kernels - base) // shape["layers"])
    shape["extra_tail"] = max(0, num_kernels - base - shape["extra_per_layer"] * shape["layers"])
    kernels = _llama_kernels(**shape)

    hardware = preset.hardware
    if kernel_gpu_ms is not None:
        if kernel_gpu_ms <= 0:
            raise ValueError("kernel_gpu_ms must be > 0")
        work_us = sum(kernel_gpu_us(k, batch, hardware) for k in kernels)
        beyond_work_us = max(0.0, (kernel_gpu_ms * 1000 - work_us) / len(kernels))
        hardware = replace(hardware, node_us=beyond_work_us + GRAPH_NODE_GAP_US)

    # ANCHOR: refit_launch_cost
    def eager_ms_at(launch_us: float) -> float:
        hw = replace(hardware, launch_us=launch_us)
        return step_time_us(eager_timeline(kernels, batch, hw)) / 1000

    lo, hi = 0.0, 1000.0
    if eager_ms_at(lo) > eager_ms:
        raise ValueError(
            f"even free launches give {eager_ms_at(lo):.2f} "
            f"ms, more than the measured {eager_ms} ms"
        )
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if eager_ms_at(mid) < eager_ms else (lo, mid)
    # ANCHOR_END: refit_launch_cost
    return replace(
        preset,
        name=f"{preset.name} (refit)",
        description=f"{preset.description}; refitted to "
        f"{eager_ms:.2f} ms eager, {len(kernels)} kernels",
        hardware=replace(hardware, launch_us=(lo + hi) / 2),
        kernels=kernels,
        reference_ms={batch: (eager_ms, float("nan"))},
        shape=shape,
    )


# ANCHOR_END: refit
