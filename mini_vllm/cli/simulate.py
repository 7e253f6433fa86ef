"""`python -m mini_vllm simulate`: eager vs CUDA-graph
decode step time from the launch-overhead model.

Prints, for each batch size, the eager and graph step time, the speedup and the
launches per step, then the crossover batch size past which graphs stop paying.
Where the preset was fitted to a timing at a batch size, that timing is printed
beside the model's row. The presets are fitted parameters, not measurements of this
repository: the model and its presets, with where each number comes from, live in
mini_vllm/teaching/launch_overhead.py; what this repository measured on a GPU is in
benchmarks/results/.
"""

from __future__ import annotations

import argparse
import math

from mini_vllm.errors import UserError

DEFAULT_PRESET = "h100-llama3.1-8b"
DEFAULT_BATCH_SIZES = "1,2,4,8,16,32,64,128,256"
MAX_BATCH = 4096  # the crossover search stops here


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="eager vs graph step time, speedup and crossover from the launch-overhead model",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument(
        "--preset",
        default=DEFAULT_PRESET,
        help="model and machine to simulate (default "
        f"{DEFAULT_PRESET}); an unknown name lists the presets",
    )
    parser.add_argument(
        "--batch-sizes",
        default=DEFAULT_BATCH_SIZES,
        metavar="N,N,...",
        help=f"comma-separated decode batch sizes (default {DEFAULT_BATCH_SIZES})",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=None,
        metavar="X",
        help="graphs stop paying when the speedup falls below this (default 1.05)",
    )
    parser.add_argument(
        "--ascii",
        action="store_true",
        help="also draw the CPU and GPU lanes of the first kernels, "
        "eager vs graph, at the smallest and the largest batch size",
    )
    parser.set_defaults(command="simulate")


def parse_batch_sizes(text: str) -> list[int]:
    sizes = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise UserError(
                "--batch-sizes takes positive integers "
                f"separated by commas, e.g. 1,4,16; got {text!r}"
            )
        sizes.append(int(part))
    return sorted(set(sizes))


def run(args: argparse.Namespace) -> int:
    from mini_vllm.teaching import launch_overhead as lo

    if args.preset not in lo.PRESETS:
        raise UserError(
            f"unknown preset {args.preset!r}; choose one of: {', '.join(sorted(lo.PRESETS))}"
        )
    threshold = lo.CROSSOVER_THRESHOLD if args.threshold is None else args.threshold
    if not math.isfinite(threshold) or threshold <= 1.0:
        raise UserError(f"--threshold is a speedup: a finite number > 1.0, got {threshold}")
    preset = lo.PRESETS[args.preset]
    batch_sizes = parse_batch_sizes(args.batch_sizes)

    print(f"preset {preset.name}: {preset.description}")
    print(
        f"{len(preset.kernels)} kernels a step; launch {preset.hardware.launch_us:g} "
        f"us a kernel eager, {preset.hardware.graph_launch_us:g} "
        f"us a graph; {preset.hardware.node_us:g} us a graph node"
    )
    print()
    header = f"{'batch':>6} {'eager ms':>9} {'graph ms':>9} {'speedup':>8} {'launches e/g':>13}"
    has_reference = any(b in preset.reference_ms for b in batch_sizes)
    print(header + ("   fitted to: eager -> graph" if has_reference else ""))
    for result in lo.sweep(preset, batch_sizes):
        line = (
            f"{result.batch:>6} {result.eager_us / 1e3:>9.2f} {result.graph_us / 1e3:>9.2f} "
            f"{result.speedup:>7.2f}x {result.eager_launches:>7} / {result.graph_launches:<3}"
        )
        if result.batch in preset.reference_ms:
            eager_ms, graph_ms = preset.reference_ms[result.batch]
            line += f"   {eager_ms:.2f} -> {graph_ms:.2f} ms ({eager_ms / graph_ms:.2f}x)"
        print(line.rstrip())
    print()
    crossover = lo.crossover_batch(preset, threshold=threshold, max_batch=MAX_BATCH)
    if crossover is None:
        print(
            f"crossover: none up to batch {MAX_BATCH} (the "
            f"speedup stays >= {threshold:g}x): graphs always pay"
        )
    else:
        # Four decimals: the table rounds to two, and a speedup of 1.0496x shows there as
        # 1.05x, which would read as not below a threshold of 1.05x.
        speedup = lo.simulate_step(preset, crossover).speedup
        print(
            f"crossover: graphs stop paying at batch {crossover} (the first batch size "
            f"whose speedup, {speedup:.4f}x, is below {threshold:g}x)"
        )
    if args.ascii:
        for batch in sorted({batch_sizes[0], batch_sizes[-1]}):
            print()
            print(lo.render_ascii(preset, batch=batch))
    return 0
