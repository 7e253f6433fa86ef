#!/usr/bin/env python3
"""Draw the figures of the Phase 05 chapter from the repository's own code.

    .venv/bin/python scripts/figures/phase05.py            # all figures into book/src/figures/
    .venv/bin/python scripts/figures/phase05.py --only crossover-llama3.1-8b.png --out-dir /tmp

Every number in a figure comes from `mini_vllm` (the two-lane launch model, the graph
simulator, the capture-size ladder) or from a recorded H100 run under
`benchmarks/results/`; this file only lays them out, one function a figure (style,
saving and the command line: figurekit.py). The output is deterministic:
fixed seeds, matplotlib's default style, and no version stamp in the PNG.
"""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib
import matplotlib.style
import matplotlib.ticker
import numpy as np
from figurekit import ROOT, styled  # also puts the checkout on sys.path
from figurekit import draw as _draw
from headline import BY_BATCH, read_headlines, read_table
from matplotlib import patches
from matplotlib.figure import Figure

from mini_vllm.config.capture_sizes import default_capture_sizes, padding_waste
from mini_vllm.cudagraph import (
    GraphRunner,
    Op,
    PiecewiseGraphRunner,
    SimDevice,
    run_eager,
    split_ops,
    toy_model,
)
from mini_vllm.teaching.launch_overhead import (
    CROSSOVER_THRESHOLD,
    crossover_batch,
    eager_timeline,
    get_preset,
    graph_timeline,
    kernel_gpu_us,
    refit_preset,
    step_time_us,
    sweep,
)

__all__ = [
    "FIGURES",
    "LADDERS",
    "SOURCES",
    "crossover_figure",
    "full_vs_piecewise_figure",
    "geometric_ladder",
    "h100_decode_figure",
    "padding_waste_figure",
    "measured_preset",
    "parse_markdown_table",
    "step_by_step_figure",
    "step_time_figure",
    "synthetic_batch_trace",
    "two_lane_figure",
]

# vLLM's largest default capture size: bigger batches run eagerly whatever the speedup.
MAX_DEFAULT_CAPTURE = 512

_EAGER_COLOR = "#c0392b"
_GRAPH_COLOR = "#2471a3"
_REFERENCE_COLOR = "black"
_THRESHOLD_COLOR = "#7f8c8d"


# --- Shared data --------------------------------------------------------------------


def synthetic_batch_trace(
    num_steps: int = 5000,
    median: float = 20.0,
    sigma: float = 0.7,
    seed: int = 0,
    max_size: int = 512,
) -> list[int]:
    """Decode batch sizes of a made-up chat server: log-normal around `median`, a long tail.

    Most steps run a few dozen sequences, a few percent run more than 64. Fixed seed,
    so every figure and the notebook see the same trace.
    """
    rng = np.random.default_rng(seed)
    sizes = np.rint(rng.lognormal(np.log(median), sigma, num_steps))
    return np.clip(sizes, 1, max_size).astype(int).tolist()


def geometric_ladder(ratio: float, top: int = MAX_DEFAULT_CAPTURE) -> list[int]:
    """Rungs 1, then each about `ratio` times the last (at least +1), up to and including `top`."""
    if ratio <= 1.0:
        raise ValueError(f"ratio must be > 1, got {ratio}")
    sizes = [1]
    while sizes[-1] < top:
        sizes.append(min(top, max(sizes[-1] + 1, int(round(sizes[-1] * ratio)))))
    return sizes


# The recorded H100 runs the measured figures read (benchmarks/results/): the headline
# files for the chapter's figures, the detailed runs for the performance page's.
RESULTS = ROOT / "benchmarks" / "results"
HEADLINE_SMOLLM2 = RESULTS / "headline-smollm2-135m.md"
HEADLINE_LLAMA8B = RESULTS / "headline-llama-3.1-8b-like.md"
H100_RESULTS = RESULTS / "decode-graphs-cuda.md"
STEP_BY_STEP_RESULTS = RESULTS / "decode-graphs-cuda-step-by-step.md"


def parse_markdown_table(path: str | Path) -> list[dict[str, str]]:
    """The first pipe table of a markdown file, as one dict per row keyed by the header."""
    lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")))))
    return rows


def measured_preset(path: str | Path = HEADLINE_SMOLLM2):
    """The SmolLM2-135M preset refitted to the measured eager step of a headline file: its
    kernel list rebuilt to the step's kernel count (torch's own layers) and its launch
    cost solved from the step's forward at batch 1, as the benchmark's own report does
    (`refit_preset`). Nothing is fitted to the graph step: what the refitted preset says
    about graphs is a prediction."""
    rows = read_headlines(path)
    return refit_preset(
        "h100-smollm2-135m",
        eager_ms=rows["plain_eager_fwd_ms"].number,
        num_kernels=int(rows["plain_kernels"].number),
        batch=1,
    )


def measured_forward_speedups(
    path: str | Path = HEADLINE_SMOLLM2,
) -> tuple[list[int], list[float], dict[int, str]]:
    """Batch sizes, measured FULL speed-ups of the forward (eager fwd / FULL fwd) and the
    file's note on any batch, from a headline file's by-batch table."""
    rows = read_table(path, BY_BATCH)
    return (
        [int(row["batch"]) for row in rows],
        [float(row["eager fwd ms"]) / float(row["FULL fwd ms"]) for row in rows],
        {int(row["batch"]): row["note"] for row in rows if row.get("note")},
    )


# The ladders compared in the padding figure (and the notebook).
LADDERS: dict[str, list[int]] = {
    "vLLM default (max 512)": default_capture_sizes(max_num_seqs=256, max_num_batched_tokens=8192),
    "powers of two to 512": [2**i for i in range(10)],
    "8 buckets to 64": [1, 2, 4, 8, 16, 32, 48, 64],
}


_DIAGRAM_NAMES = {
    "embedding": "embed",
    "rmsnorm": "norm",
    "attention": "attn",
    "up_proj": "up\nproj",
    "down_proj": "down\nproj",
    "lm_head": "lm\nhead",
}


def _short(name: str) -> str:
    """'L0.qkv_proj' -> 'qkv_proj', 'rmsnorm_1' -> 'rmsnorm'."""
    name = name.split(".", 1)[-1]
    head, _, tail = name.rpartition("_")
    return head if tail.isdigit() else name


# --- Figure 1: the two lanes --------------------------------------------------------


@styled
def two_lane_figure(preset: str | None = None, batch: int = 1, num_kernels: int = 8) -> Figure:
    """The first kernels of a decode step on two lanes (CPU issues, GPU executes), eager
    above, one graph replay below, on the same time axis. By default the model is the
    SmolLM2-135M shape refitted to the recorded H100 run (`measured_preset`)."""
    p = measured_preset() if preset is None else get_preset(preset)
    hw = p.hardware
    kernels = p.kernels[:num_kernels]
    views = [
        ("eager: one launch per kernel", eager_timeline(kernels, batch, hw)),
        ("CUDA graph: one launch, then the nodes back to back", graph_timeline(kernels, batch, hw)),
    ]
    end = max(step_time_us(spans) for _, spans in views)
    colors = [matplotlib.colormaps["tab10"](i % 10) for i in range(len(kernels))]
    index = {k.name: i for i, k in enumerate(kernels)}

    fig = Figure(figsize=(10, 4.6), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    lane_y = {"cpu": 1.0, "gpu": 0.0}
    height = 0.6
    for ax, (title, spans) in zip(axes, views):
        # Pale background: wherever it shows through on the GPU lane, the GPU is idle.
        for y in lane_y.values():
            ax.add_patch(
                patches.Rectangle((0, y - height / 2), end, height, color="#f2f3f4", zorder=0)
            )
        for span in spans:
            y = lane_y[span.lane] - height / 2
            width = span.end_us - span.start_us
            if span.name not in index:  # the graph launch
                ax.add_patch(
                    patches.Rectangle(
                        (span.start_us, y),
                        width,
                        height,
                        facecolor="#566573",
                        edgecolor="white",
                        linewidth=0.8,
                    )
                )
                ax.text(
                    span.start_us + width / 2,
                    y + height / 2,
                    "graph\nlaunch",
                    ha="center",
                    va="center",
                    color="white",
                    fontsize=7,
                )
                continue
            i = index[span.name]
            if span.lane == "cpu":
                ax.add_patch(
                    patches.Rectangle(
                        (span.start_us, y),
                        width,
                        height,
                        facecolor=colors[i],
                        edgecolor="white",
                        linewidth=0.8,
                        alpha=0.85,
                    )
                )
                ax.text(
                    span.start_us + width / 2,
                    y + height / 2,
                    f"{i}\n{_short(span.name)}",
                    ha="center",
                    va="center",
                    fontsize=6.5,
                    color="white",
                )
            else:
                # The kernel's own work (its roofline time), then the fixed cost every
                # eager kernel / graph node pays on the GPU, drawn paler.
                work = kernel_gpu_us(kernels[i], batch, hw)
                ax.add_patch(
                    patches.Rectangle(
                        (span.start_us, y), work, height, facecolor=colors[i], edgecolor="none"
                    )
                )
                ax.add_patch(
                    patches.Rectangle(
                        (span.start_us + work, y),
                        width - work,
                        height,
                        facecolor=colors[i],
                        alpha=0.35,
                        edgecolor="none",
                    )
                )
                ax.add_patch(
                    patches.Rectangle(
                        (span.start_us, y),
                        width,
                        height,
                        fill=False,
                        edgecolor="white",
                        linewidth=0.8,
                    )
                )
                ax.text(
                    span.start_us + width / 2,
                    y + height / 2,
                    str(i),
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="black",
                )
        total = step_time_us(spans)
        ax.axvline(total, color="black", linestyle="--", linewidth=0.8)
        done = f"{len(kernels)} kernels done: {total:.0f} µs"
        if total < 0.8 * end:
            ax.text(total, 1.55, " " + done, va="center", ha="left", fontsize=8)
        else:
            ax.text(total, 1.55, done + " ", va="center", ha="right", fontsize=8)
        gpu = [sp for sp in spans if sp.lane == "gpu"]
        gaps = [(b.start_us - a.end_us, a.end_us, b.start_us) for a, b in zip(gpu, gpu[1:])]
        for gap, g0, g1 in gaps:  # eager: the GPU waits for each launch
            if gap > 0.05 * end:
                ax.text(
                    (g0 + g1) / 2,
                    lane_y["gpu"],
                    "idle",
                    ha="center",
                    va="center",
                    fontsize=7,
                    style="italic",
                    color="#777777",
                )
        cpu_end = max(sp.end_us for sp in spans if sp.lane == "cpu")
        if end - cpu_end > 0.3 * end:  # graph: the host has nothing left to issue
            ax.text(
                (cpu_end + end) / 2,
                lane_y["cpu"],
                "CPU free: it can already prepare the next step",
                ha="center",
                va="center",
                fontsize=8,
                color="#555555",
            )
        ax.set_title(title, loc="left")
        ax.set_ylim(-0.5, 1.8)
        ax.set_yticks([1.0, 0.0], ["CPU\nissues", "GPU\nexecutes"])
        ax.tick_params(axis="y", length=0)
        ax.spines["left"].set_visible(False)
    axes[-1].set_xlim(0, end * 1.02)
    axes[-1].set_xlabel("time (µs)")
    legend = [
        patches.Patch(facecolor="#777777", label="kernel work (roofline: bytes or FLOPs)"),
        patches.Patch(
            facecolor="#777777",
            alpha=0.35,
            label=f"fixed GPU cost: {hw.eager_gap_us:g} µs per "
            f"eager kernel, {hw.node_us:g} µs per graph node",
        ),
        patches.Patch(facecolor="#f2f3f4", edgecolor="#cccccc", label="lane idle"),
        patches.Patch(
            facecolor="white",
            edgecolor="#cccccc",
            label=f"host: {hw.launch_us:.3g} µs a launch"
            + (" (solved from the measured step)" if preset is None else ""),
        ),
    ]
    axes[0].legend(
        handles=legend, loc="upper right", bbox_to_anchor=(1.0, 1.42), ncol=2, frameon=False
    )
    # The title quotes only what was measured (the step's kernel count, from the headline
    # file); what the model makes of it is in the legend.
    model = (
        "SmolLM2-135M shape, simulated, fitted to the eager step measured on an H100"
        if preset is None
        else p.name
    )
    fig.suptitle(
        f"{model}, batch {batch}: the first {len(kernels)} of its {len(p.kernels)} kernels",
        fontsize=10,
    )
    return fig


# --- Figures 2 and 3: where graphs stop paying ---------------------------------------


def _plain_log2_axis(ax, top: int) -> None:
    """Log-2 x axis with ticks 1, 4, 16, ... written as plain numbers."""
    ax.set_xscale("log", base=2)
    ticks = [4**i for i in range(10) if 4**i <= top]
    ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(
        matplotlib.ticker.FixedLocator([2**i for i in range(14) if 2**i <= top])
    )
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def _batch_grid(top: int, extra: Sequence[int] = ()) -> list[int]:
    grid = {int(round(b)) for b in np.geomspace(1, top, 64)} | set(extra)
    return sorted(b for b in grid if 1 <= b <= top)


def _reference_speedups(p) -> tuple[list[int], list[float]]:
    batches = sorted(p.reference_ms)
    return batches, [p.reference_ms[b][0] / p.reference_ms[b][1] for b in batches]


@styled
def crossover_figure(max_batch: int = 4096, results_path: str | Path = HEADLINE_SMOLLM2) -> Figure:
    """Graph speedup (eager step / graph step) against batch size, simulated, with the
    threshold and the crossover batch: left, the Llama-3.1-8B preset with the article's
    table it is fitted to; right, the SmolLM2-135M shape refitted to the eager step of a
    headline file, with that file's measured forward speed-ups (a prediction, not a fit),
    each batch the file notes an anomaly at marked with the note."""
    llama = get_preset("h100-llama3.1-8b")
    refit = measured_preset(results_path)
    batches_measured, speedups_measured, notes = measured_forward_speedups(results_path)
    runs = {row["runs"] for row in read_table(results_path, BY_BATCH)}
    measured = "measured on an H100 (forward), " + (
        "one run" if runs == {"1"} else f"median of {'/'.join(sorted(runs))} runs"
    )
    panels = [
        (
            llama,
            "Llama-3.1-8B preset, against the article's table it is fitted to",
            (*_reference_speedups(llama), {}),
            "the article's table (fitted)",
        ),
        (
            refit,
            f"SmolLM2-135M shape, refitted to the eager step measured ({len(refit.kernels)} "
            "kernels)",
            (batches_measured, speedups_measured, notes),
            measured,
        ),
    ]
    fig = Figure(figsize=(10, 4.6), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (p, title, (ref_b, ref_s, ref_notes), ref_label) in zip(axes, panels):
        results = sweep(p, _batch_grid(max_batch, ref_b))
        batches = [r.batch for r in results]
        speedups = [r.speedup for r in results]
        top = max(max(speedups), max(ref_s)) * 1.12
        ax.axvspan(MAX_DEFAULT_CAPTURE, max_batch * 1.3, color="#f2f3f4", zorder=0)
        ax.text(
            np.sqrt(MAX_DEFAULT_CAPTURE * max_batch * 1.3),
            0.9 + 0.97 * (top - 0.9),
            "above vLLM's largest\ndefault capture size:\nruns eagerly anyway",
            ha="center",
            va="top",
            fontsize=7,
            color="#555555",
        )
        ax.plot(
            batches,
            speedups,
            color=_GRAPH_COLOR,
            linewidth=2,
            label=f"simulated, {len(p.kernels)} kernels a step",
        )
        ax.axhline(
            CROSSOVER_THRESHOLD,
            color=_THRESHOLD_COLOR,
            linestyle="--",
            linewidth=1,
            label=f"threshold {CROSSOVER_THRESHOLD:g}×",
        )
        ax.plot(
            ref_b,
            ref_s,
            "o",
            mfc="none",
            mec=_REFERENCE_COLOR,
            mew=1.5,
            markersize=7,
            label=ref_label,
        )
        for b, note in ref_notes.items():
            s = ref_s[ref_b.index(b)]
            ax.annotate(
                "\n".join(textwrap.wrap(f"batch {b}: {note}", 34)),
                (b, s),
                xytext=(0.36, 0.62),
                textcoords="axes fraction",
                fontsize=7,
                color="#555555",
                arrowprops=dict(arrowstyle="->", color="#777777", linewidth=0.8),
            )
        cross = crossover_batch(p, max_batch=max_batch)
        if cross is not None:
            s = sweep(p, [cross])[0].speedup
            ax.axvline(cross, color=_EAGER_COLOR, linewidth=1, linestyle=":")
            ax.plot(
                [cross],
                [s],
                "D",
                color=_EAGER_COLOR,
                markersize=7,
                zorder=5,
                label=f"crossover: batch {cross}",
            )
            ax.annotate(
                f"crossover: batch {cross}\nfirst speedup "
                f"below {CROSSOVER_THRESHOLD:g}×\n({s:.4f}×)",
                (cross, s),
                xytext=(-14, 36),
                textcoords="offset points",
                ha="right",
                fontsize=8,
                color=_EAGER_COLOR,
                arrowprops=dict(arrowstyle="->", color=_EAGER_COLOR, linewidth=0.8),
            )
        else:
            ax.text(
                0.28,
                0.30,
                f"no crossover up to batch {max_batch}\n(still {results[-1].speedup:.2f}× there)",
                transform=ax.transAxes,
                fontsize=8,
                color=_EAGER_COLOR,
            )
        _plain_log2_axis(ax, max_batch)
        ax.set_xlim(1, max_batch * 1.3)
        ax.set_ylim(0.9, top)
        ax.set_xlabel("decode batch size (sequences)")
        ax.set_ylabel("speedup of graphs (eager ms / graph ms)")
        ax.set_title(title, loc="left", fontsize=8.5)
        ax.grid(True, which="major", color="#e5e5e5", linewidth=0.6)
        ax.legend(loc="lower left", frameon=False, fontsize=7.5)
    fig.suptitle(
        "Where CUDA graphs stop paying: the simulated speedup falls as the GPU lane fills up",
        fontsize=10,
    )
    return fig


@styled
def step_time_figure(preset: str = "h100-llama3.1-8b", max_batch: int = 256) -> Figure:
    """Eager and graph ms per decode step against batch size (log scale), with the
    reference table and the crossover batch, where the model's graphs stop paying."""
    p = get_preset(preset)
    hw = p.hardware
    results = sweep(p, _batch_grid(max_batch, p.reference_ms))
    batches = [r.batch for r in results]
    eager = np.array([r.eager_us / 1000 for r in results])
    graph = np.array([r.graph_us / 1000 for r in results])

    fig = Figure(figsize=(8, 4.4), layout="constrained")
    ax = fig.subplots()
    ax.fill_between(
        batches, graph, eager, color="#f5cba7", alpha=0.6, linewidth=0, label="time the graph saves"
    )
    ax.plot(batches, eager, color=_EAGER_COLOR, linewidth=2, label="eager (model)")
    ax.plot(batches, graph, color=_GRAPH_COLOR, linewidth=2, label="one CUDA graph (model)")
    ref_b = sorted(p.reference_ms)
    ax.plot(
        ref_b,
        [p.reference_ms[b][0] for b in ref_b],
        "s",
        mfc="none",
        mec=_EAGER_COLOR,
        mew=1.5,
        markersize=7,
        label="eager, reference",
    )
    ax.plot(
        ref_b,
        [p.reference_ms[b][1] for b in ref_b],
        "o",
        mfc="none",
        mec=_GRAPH_COLOR,
        mew=1.5,
        markersize=7,
        label="graph, reference",
    )
    host_ms = len(p.kernels) * hw.launch_us / 1000
    weights_ms = sum(k.weight_bytes for k in p.kernels) / hw.bandwidth * 1000
    cross = crossover_batch(p, max_batch=max_batch)
    label_x = cross / 1.1 if cross is not None else max_batch  # left of the crossover line
    ax.axhline(host_ms, color=_EAGER_COLOR, linestyle=":", linewidth=0.8)
    ax.text(
        label_x,
        host_ms,
        f"host: {len(p.kernels)} launches × {hw.launch_us:g} µs = {host_ms:.1f} ms ",
        ha="right",
        va="bottom",
        fontsize=7.5,
        color=_EAGER_COLOR,
    )
    ax.axhline(weights_ms, color=_GRAPH_COLOR, linestyle=":", linewidth=0.8)
    ax.text(
        label_x,
        weights_ms,
        f"weights once at {hw.bandwidth / 1e12:g} TB/s: {weights_ms:.1f} ms ",
        ha="right",
        va="top",
        fontsize=7.5,
        color=_GRAPH_COLOR,
    )
    if cross is not None:
        ax.axvline(cross, color=_THRESHOLD_COLOR, linestyle="--", linewidth=1)
        ax.text(
            cross,
            eager.max(),
            f"graphs stop paying: batch {cross}\n(speed-up below {CROSSOVER_THRESHOLD:g}×) ",
            ha="right",
            va="top",
            fontsize=7.5,
            color="#555555",
        )
    _plain_log2_axis(ax, max_batch)
    ax.xaxis.set_major_locator(
        matplotlib.ticker.FixedLocator([2**i for i in range(14) if 2**i <= max_batch])
    )
    ax.set_xlim(1, max_batch)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(matplotlib.ticker.FixedLocator([2, 5, 10, 20, 50, 100, 200]))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_ylim(min(graph.min(), weights_ms) * 0.8, eager.max() * 1.15)
    ax.set_xlabel("decode batch size (sequences)")
    ax.set_ylabel("ms per decode step (log scale)")
    ax.grid(True, color="#e5e5e5", linewidth=0.6)
    ax.legend(loc="upper left", frameon=False)
    # No number in the title: the measured ones are the reference's (the legend's
    # squares and circles), the rest is the model's.
    ax.set_title(
        f"{p.name}: eager vs graph step time by batch size, simulated\nsquares and circles: "
        "the reference measurements the preset is fitted to",
        loc="left",
        fontsize=9,
    )
    return fig


# --- Figure 4: FULL vs PIECEWISE ----------------------------------------------------


def _diagram_model(num_layers: int, hidden: int = 8) -> list[Op]:
    """An embedding, the toy decoder's layers (attention not capturable), a head."""
    rng = np.random.default_rng(1)
    w_head = rng.standard_normal((hidden, hidden)).astype(np.float32)
    embed = Op("embedding", lambda x: x * np.float32(1.0), gpu_us=2.0)
    head = Op("lm_head", lambda x, w=w_head: x @ w, gpu_us=4.0)
    return [embed, *toy_model(hidden=hidden, num_layers=num_layers, attention=True), head]


def _launches_per_step(
    runner: Callable[[np.ndarray], np.ndarray], device: SimDevice, x: np.ndarray
) -> int:
    runner(x)  # the first call warms up and captures
    before = device.launches
    runner(x)
    return device.launches - before


@styled
def full_vs_piecewise_figure(num_layers: int = 3) -> Figure:
    """One forward as a row of op boxes, three ways: eager, one FULL graph, PIECEWISE graphs
    between the attention ops. The pieces come from `split_ops`; the launch counts from
    running the simulator's runners."""
    ops = _diagram_model(num_layers)
    pieces = split_ops(ops)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)

    eager_device = SimDevice()
    before = eager_device.launches
    run_eager(ops, eager_device, x)
    eager_launches = eager_device.launches - before
    # FULL needs attention that can be captured: pretend the backend allows it.
    full_ops = [dataclasses.replace(op, capturable=True) for op in ops]
    full_device = SimDevice()
    full_launches = _launches_per_step(GraphRunner(full_ops, full_device), full_device, x)
    pw_device = SimDevice()
    pw_runner = PiecewiseGraphRunner(ops, pw_device)
    pw_launches = _launches_per_step(pw_runner, pw_device, x)

    box_w, gap, box_h = 1.0, 0.22, 0.8
    xs = [i * (box_w + gap) for i in range(len(ops))]
    row_y = {"eager": 4.4, "full": 2.35, "piecewise": 0.3}
    attn_color, op_color = "#f5b041", "#d6eaf8"
    layer_colors = ["#ffffff", "#f4f6f6"]

    fig = Figure(figsize=(11, 5.0), layout="constrained")
    ax = fig.subplots()

    def draw_ops(y: float) -> None:
        for i, op in enumerate(ops):
            eager = not op.capturable
            ax.add_patch(
                patches.FancyBboxPatch(
                    (xs[i], y),
                    box_w,
                    box_h,
                    boxstyle="round,pad=0,rounding_size=0.08",
                    facecolor=attn_color if eager else op_color,
                    edgecolor="#5d6d7e",
                    linewidth=0.8,
                    zorder=3,
                )
            )
            ax.text(
                xs[i] + box_w / 2,
                y + box_h / 2,
                _DIAGRAM_NAMES.get(_short(op.name), _short(op.name)),
                ha="center",
                va="center",
                fontsize=7,
                zorder=4,
            )

    # Layer bands behind the boxes, so the repeating pattern reads at a glance.
    layer_of = (
        [None]
        + [i for i in range(num_layers) for _ in range(len(ops[1:-1]) // num_layers)]
        + [None]
    )
    for layer in range(num_layers):
        members = [i for i, lay in enumerate(layer_of) if lay == layer]
        x0, x1 = xs[members[0]] - gap / 2, xs[members[-1]] + box_w + gap / 2
        ax.add_patch(
            patches.Rectangle(
                (x0, -0.35),
                x1 - x0,
                5.95,
                facecolor=layer_colors[layer % 2],
                edgecolor="#d5d8dc",
                linewidth=0.5,
                zorder=0,
            )
        )
        ax.text(
            (x0 + x1) / 2,
            5.45,
            f"layer {layer}",
            ha="center",
            va="center",
            fontsize=8,
            color="#555555",
        )

    right = xs[-1] + box_w
    label_x = -0.4
    # (a) eager
    y = row_y["eager"]
    draw_ops(y)
    ax.text(
        label_x,
        y + box_h / 2,
        f"NONE (eager)\n{eager_launches} launches",
        ha="right",
        va="center",
        fontsize=9,
        fontweight="bold",
    )
    # (b) one FULL graph around everything
    y = row_y["full"]
    ax.add_patch(
        patches.FancyBboxPatch(
            (xs[0] - 0.12, y - 0.22),
            right - xs[0] + 0.24,
            box_h + 0.44,
            boxstyle="round,pad=0,rounding_size=0.15",
            facecolor="#aed6f1",
            edgecolor=_GRAPH_COLOR,
            linewidth=1.6,
            zorder=2,
        )
    )
    draw_ops(y)
    ax.text(
        label_x,
        y + box_h / 2,
        f"FULL\n{full_launches} launch",
        ha="right",
        va="center",
        fontsize=9,
        fontweight="bold",
    )
    ax.text(
        (xs[0] + right) / 2,
        y + box_h + 0.32,
        "one graph: attention captured too (needs a capturable "
        "attention backend and fixed metadata shapes)",
        ha="center",
        va="bottom",
        fontsize=7.5,
        color=_GRAPH_COLOR,
        zorder=5,
    )
    # (c) PIECEWISE: a graph per run of capturable ops, attention eager in between
    y = row_y["piecewise"]
    start = 0
    graph_no = 0
    for piece in pieces:
        n = len(piece.ops)
        first, last = start, start + n - 1
        if not piece.is_splitting_op:
            graph_no += 1
            ax.add_patch(
                patches.FancyBboxPatch(
                    (xs[first] - 0.08, y - 0.22),
                    xs[last] + box_w - xs[first] + 0.16,
                    box_h + 0.44,
                    boxstyle="round,pad=0,rounding_size=0.15",
                    facecolor="#aed6f1",
                    edgecolor=_GRAPH_COLOR,
                    linewidth=1.6,
                    zorder=2,
                )
            )
            ax.text(
                (xs[first] + xs[last] + box_w) / 2,
                y + box_h + 0.3,
                f"graph {graph_no}",
                ha="center",
                va="bottom",
                fontsize=8,
                color=_GRAPH_COLOR,
                fontweight="bold",
                zorder=5,
            )
        else:
            ax.text(
                xs[first] + box_w / 2,
                y + box_h + 0.3,
                "eager",
                ha="center",
                va="bottom",
                fontsize=8,
                color="#b9770e",
                fontweight="bold",
                zorder=5,
            )
        start += n
    draw_ops(y)
    k = sum(p.is_splitting_op for p in pieces)
    ax.text(
        label_x,
        y + box_h / 2,
        f"PIECEWISE\n{pw_launches} launches\n({pw_runner.num_captured_pieces} graphs + {k} attn)",
        ha="right",
        va="center",
        fontsize=9,
        fontweight="bold",
    )

    ax.set_xlim(-3.2, right + 0.3)
    ax.set_ylim(-0.45, 5.75)
    ax.set_axis_off()
    legend = [
        patches.Patch(facecolor=op_color, edgecolor="#5d6d7e", label="capturable op"),
        patches.Patch(
            facecolor=attn_color,
            edgecolor="#5d6d7e",
            label="attention (splitting op, runs eagerly under PIECEWISE)",
        ),
        patches.Patch(
            facecolor="#aed6f1",
            edgecolor=_GRAPH_COLOR,
            label="captured graph: one launch per replay",
        ),
    ]
    ax.legend(
        handles=legend, loc="lower center", bbox_to_anchor=(0.5, -0.13), ncol=3, frameon=False
    )
    fig.suptitle(
        f"One forward of a {num_layers}-layer toy decoder: k = {k} attention ops "
        f"give k + 1 = {pw_runner.num_captured_pieces} captured pieces (split_ops)",
        fontsize=10,
    )
    return fig


# --- Figure 5: the capture-size ladder ----------------------------------------------


@styled
def padding_waste_figure(trace: Sequence[int] | None = None) -> Figure:
    """Padding waste and graph hit rate of a batch-size trace on several ladders, against
    the number of graphs each ladder captures."""
    trace = synthetic_batch_trace() if trace is None else list(trace)
    fig = Figure(figsize=(10, 4.4), layout="constrained")
    ax_w, ax_h = fig.subplots(1, 2)

    def measure(ladders: list[list[int]]) -> tuple[list[int], list[float], list[float]]:
        reports = [padding_waste(trace, ladder) for ladder in ladders]
        return (
            [len(ld) for ld in ladders],
            [100 * r.waste for r in reports],
            [100 * r.hit_rate for r in reports],
        )

    # Left: ladders that all reach 512 (every step hits a graph), denser and denser.
    steps = [128, 64, 32, 16, 8, 4, 2]
    uniform = [sorted({1, 2, 4} | set(range(8, MAX_DEFAULT_CAPTURE + 1, s))) for s in steps]
    geometric = [geometric_ladder(r) for r in (2.0, 1.5, 1.25, 1.12, 1.06)]
    for label, ladders, color in (
        ("1, 2, 4, then every s up to 512 (s = 128 ... 2)", uniform, "#85929e"),
        ("geometric: each rung ~r × the last (r = 2 ... 1.06)", geometric, "#a569bd"),
    ):
        n, waste, _ = measure(ladders)
        ax_w.plot(n, waste, marker=".", color=color, label=label)

    # Right: vLLM's default ladder cut at a smaller largest size: fewer graphs, more misses.
    default = LADDERS["vLLM default (max 512)"]
    tops = [4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512]
    truncated = [[s for s in default if s <= top] for top in tops]
    n, _, hit = measure(truncated)
    ax_h.plot(n, hit, marker=".", color="#48c9b0", label="vLLM default cut at a smaller max")
    for top, x, y in zip(tops, n, hit):
        if top in (8, 16, 32, 64, 512):
            ax_h.annotate(
                f"max {top}",
                (x, y),
                xytext=(5, -10),
                textcoords="offset points",
                fontsize=7,
                color="#148f77",
            )

    markers = {"vLLM default (max 512)": "*", "powers of two to 512": "s", "8 buckets to 64": "D"}
    for label, ladder in LADDERS.items():
        r = padding_waste(trace, ladder)
        style = dict(
            color="black",
            linestyle="none",
            marker=markers.get(label, "o"),
            markersize=11 if markers.get(label) == "*" else 7,
            zorder=5,
        )
        ax_w.plot(
            [len(ladder)],
            [100 * r.waste],
            **style,
            label=f"{label}: {len(ladder)} graphs, {100 * r.waste:.1f}% "
            f"waste, {100 * r.hit_rate:.1f}% hits",
        )
        ax_h.plot([len(ladder)], [100 * r.hit_rate], **style, label=label)

    for ax in (ax_w, ax_h):
        ax.set_xscale("log")
        ax.set_xlabel("graphs captured (rungs on the ladder)")
        ax.grid(True, which="major", color="#e5e5e5", linewidth=0.6)
        ax.xaxis.set_major_locator(
            matplotlib.ticker.FixedLocator([2, 5, 10, 20, 50, 100, 200, 500])
        )
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax_w.set_yscale("log")
    ax_w.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}%"))
    ax_w.set_ylabel("padding waste (padded tokens / real tokens)")
    ax_w.set_title("Waste: a denser ladder pads less, but captures more graphs", loc="left")
    ax_w.set_ylim(0.08, None)
    ax_w.legend(loc="lower left", frameon=False, fontsize=7)

    ax_h.axhline(92, color=_GRAPH_COLOR, linestyle="--", linewidth=0.8)
    ax_h.text(
        ax_h.get_xlim()[1],
        92.6,
        "a case study: healthy above 92% ",
        color=_GRAPH_COLOR,
        fontsize=7,
        ha="right",
        va="bottom",
    )
    ax_h.axhline(85, color=_EAGER_COLOR, linestyle="--", linewidth=0.8)
    ax_h.text(
        ax_h.get_xlim()[1],
        84.4,
        "its alert below 85% ",
        color=_EAGER_COLOR,
        fontsize=7,
        ha="right",
        va="top",
    )
    ax_h.set_ylabel("graph hit rate (% of decode steps replayed)")
    ax_h.set_title("Hits: set by the largest rung, not by the density", loc="left")
    ax_h.set_ylim(0, 104)
    ax_h.legend(loc="lower right", frameon=False, fontsize=7)

    median = int(np.median(trace))
    above = sum(b > 64 for b in trace) / len(trace)
    fig.suptitle(
        f"One synthetic decode trace ({len(trace)} steps, median batch {median}, "
        f"{100 * above:.1f}% of steps above 64 sequences) run through several capture-size ladders",
        fontsize=10,
    )
    return fig


# --- Figure 6: measured H100 decode step per mode -----------------------------------


# Modes as the benchmark's table names them, slowest first, with their bar colours.
_H100_MODES = {
    "eager": "#c0392b",
    "piecewise": "#85c1e9",
    "full": "#2471a3",
    "compile+piecewise": "#a9dfbf",
    "compile+full": "#1e8449",
}


@styled
def h100_decode_figure(path: str | Path = H100_RESULTS) -> Figure:
    """Measured decode step time per mode and batch size on one H100 (SmolLM2-135M shape,
    bf16), read from the committed benchmark result, with kernels per step per mode and
    transformers' eager generate as the baseline."""
    rows = parse_markdown_table(path)
    text = Path(path).read_text(encoding="utf-8")
    machine = next(
        (
            line.split(":", 1)[1].strip()
            for line in text.splitlines()
            if line.startswith("- machine:")
        ),
        "",
    )
    batches = [int(row["batch"]) for row in rows]
    series: dict[str, tuple[list[float], str]] = {
        "transformers": ([float(row["transformers ms"]) for row in rows], "eager generate"),
    }
    for mode in _H100_MODES:
        if f"{mode} step ms" in rows[0]:
            kernels = rows[0][f"{mode} kernels"]
            series[mode] = (
                [float(row[f"{mode} step ms"]) for row in rows],
                f"{kernels} kernels/step",
            )
    colours = {"transformers": "#7f8c8d", **_H100_MODES}

    fig = Figure(figsize=(9.5, 4.6), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / len(series)
    x = np.arange(len(batches))
    for i, (mode, (values, note)) in enumerate(series.items()):
        offsets = x - 0.4 + width * (i + 0.5)
        ax.bar(offsets, values, width, color=colours[mode], label=f"{mode} ({note})")
        ax.text(
            offsets[0],
            values[0] * 1.08,
            f"{values[0]:.2f}",
            ha="center",
            va="bottom",
            fontsize=7,
            rotation=90,
        )
    floor = [float(row["floor ms"]) for row in rows]
    ax.plot(
        x,
        floor,
        "k_",
        markersize=28,
        markeredgewidth=1.5,
        label="weight-read floor (bytes / copy bandwidth)",
    )
    ax.set_yscale("log")
    ax.set_ylim(min(floor) * 0.7, max(max(v) for v, _ in series.values()) * 2.6)
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xticks(x, [str(b) for b in batches])
    ax.set_xlabel("decode batch size (sequences); numbers above the bars: batch 1")
    ax.set_ylabel("ms per decode step (log scale)")
    ax.grid(True, axis="y", color="#e5e5e5", linewidth=0.6)
    ax.set_axisbelow(True)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=4, frameon=False, fontsize=7.5)
    ax.set_title(
        f"Measured decode step, SmolLM2-135M shape, bf16, context 128 ({machine})\nsource: "
        f"{Path(path).relative_to(ROOT) if Path(path).is_relative_to(ROOT) else Path(path).name}",
        loc="left",
        fontsize=9,
    )
    return fig


# --- Figure 7: the step, change by change -------------------------------------------


def _category(configuration: str) -> str:
    if "async" in configuration:
        return "graph + async scheduling"
    if "compile" in configuration:
        return "graph, compiled"
    if configuration.startswith("eager"):
        return "eager"
    return "graph, not compiled"


_CATEGORY_COLORS = {
    "eager": _EAGER_COLOR,
    "graph, not compiled": "#85c1e9",
    "graph, compiled": "#1e8449",
    "graph + async scheduling": "#7d3c98",
}


@styled
def step_by_step_figure(path: str | Path = STEP_BY_STEP_RESULTS) -> Figure:
    """Each configuration's ms per decode step at batch 1 (SmolLM2-135M shape, one H100),
    in the order the changes were made, with its kernels per step, read from the summary
    of the recorded runs."""
    rows = parse_markdown_table(path)
    labels = [row["configuration"] for row in rows]
    ms_text = [row["ms per step"] for row in rows]  # as the results file writes them
    ms = [float(text) for text in ms_text]
    kernels = [row["kernels per decode step"] for row in rows]
    categories = [_category(label) for label in labels]

    fig = Figure(figsize=(10, 5.6), layout="constrained")
    ax = fig.subplots()
    y = np.arange(len(rows))[::-1]
    ax.barh(y, ms, color=[_CATEGORY_COLORS[c] for c in categories], height=0.7)
    for yi, value, text, count in zip(y, ms, ms_text, kernels):
        ax.text(value * 1.05, yi, f"{text} ms, {count} kernels", va="center", fontsize=7.5)
    ax.set_xscale("log")
    ax.set_xlim(0.3, max(ms) * 6)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_yticks(y, [textwrap_label(label) for label in labels], fontsize=7.5)
    ax.set_xlabel("ms per decode step at batch 1 (log scale)")
    ax.set_ylabel("configuration, in the order the changes were made")
    ax.grid(True, axis="x", color="#e5e5e5", linewidth=0.6)
    ax.set_axisbelow(True)
    handles = [
        patches.Patch(color=color, label=name)
        for name, color in _CATEGORY_COLORS.items()
        if name in categories
    ]
    ax.legend(handles=handles, loc="lower right", frameon=False, fontsize=8)
    ax.set_title(
        "Decode step of the SmolLM2-135M shape on an H100, bf16, context 128: "
        "kernels and time per configuration\nsource: "
        f"{Path(path).relative_to(ROOT) if Path(path).is_relative_to(ROOT) else Path(path).name}"
        " (each row from its own recorded run)",
        loc="left",
        fontsize=9,
    )
    return fig


def textwrap_label(label: str, width: int = 46) -> str:
    """A configuration name broken over lines of at most `width` characters."""
    return "\n".join(textwrap.wrap(label, width))


# --- Driver -------------------------------------------------------------------------

FIGURES: dict[str, Callable[[], Figure]] = {
    "two-lane-eager-vs-graph.png": two_lane_figure,
    "crossover-llama3.1-8b.png": crossover_figure,
    "step-time-vs-batch.png": step_time_figure,
    "full-vs-piecewise.png": full_vs_piecewise_figure,
    "padding-waste-per-ladder.png": padding_waste_figure,
    "h100-decode.png": h100_decode_figure,
    "h100-step-by-step.png": step_by_step_figure,
}


# The results files each figure's measured numbers come from; its title and caption may
# quote only numbers these files hold (tests/course/test_headline_numbers.py). The others
# draw the simulators alone.
SOURCES: dict[str, list[Path]] = {
    "two-lane-eager-vs-graph.png": [HEADLINE_SMOLLM2],
    "crossover-llama3.1-8b.png": [HEADLINE_LLAMA8B, HEADLINE_SMOLLM2],
    "step-time-vs-batch.png": [HEADLINE_LLAMA8B],
    "h100-decode.png": [H100_RESULTS],
    "h100-step-by-step.png": [STEP_BY_STEP_RESULTS],
}


def main(argv: Sequence[str] | None = None) -> int:
    return _draw(FIGURES, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
