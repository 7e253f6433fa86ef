#!/usr/bin/env python3
"""How the GEMV's autotuner should time a tile: alone (Triton's default) or as the engine
runs it, back to back in a CUDA graph (mini_vllm's default, `tile_time_ms`).

    python3 scripts/gpu/tile_timing.py [--rounds 3] [--model smollm2-135m] [--out DIR]

Each round makes two cold starts, one per timing (MINI_VLLM_TILE_TIMING=graph, =triton),
alternating, each a fresh process with an empty Triton cache, so that every tile is timed
again. Each builds the compiled FULL engine at batch 1 and reports:
- the GPU time of one replay of the batch-1 decode graph (CUDA events around 50 replays
  back to back, median of 20): what the tiles picked cost the step;
- the seconds spent in the kernels' first launches (timing the tiles and compiling them);
- the tile picked for each matrix (N x K, prologue).
The picks are a measurement: a timing whose picks change from one cold start to the next,
and with them the step, is measuring noise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

from gpukit import decoding_engine, engine_options, gemv_tile_picks, run_script

TIMINGS = ("graph", "triton")


def child(args) -> dict:
    """One cold start in this process: the replay time, the tuning seconds, the picks."""
    import torch

    from mini_vllm.kernels import gemv

    engine = decoding_engine(args, new_tokens=300, warm_steps=20)
    (entry,) = engine.runner.graphs.full_wrapper.entries.values()
    torch.cuda.synchronize()
    per_replay = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(50):
            entry.graph.replay()
        end.record()
        end.synchronize()
        per_replay.append(start.elapsed_time(end) / 50)
    prologues = {
        gemv.PLAIN: "plain",
        gemv.RMS_NORM: "RMSNorm",
        gemv.ADD_RMS_NORM: "add + RMSNorm",
        gemv.SILU_AND_MUL: "SiLU and mul",
    }
    picks = {
        f"{n} x {k}, {prologues[prologue]}": (
            f"{tile['BLOCK_N']} x {tile['BLOCK_K']}, {tile['num_warps']} warps"
        )
        for (n, k, prologue), tile in gemv_tile_picks().items()
    }
    return {
        "replay_ms": statistics.median(per_replay),
        "first_launch_s": gemv.autotune_seconds(),
        "picks": picks,
    }


def measure(args, report) -> None:
    import torch

    if "full" not in args.mode:
        raise SystemExit(
            f"tile_timing.py replays the FULL decode graph; --mode {args.mode} captures none: "
            "choose one with full in its name (default compile+full)"
        )
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return
    command = f"python3 scripts/gpu/tile_timing.py --rounds {args.rounds} --model {args.model}"
    results = {timing: [] for timing in TIMINGS}
    for round_number in range(1, args.rounds + 1):
        for timing in TIMINGS if round_number % 2 else reversed(TIMINGS):
            with tempfile.TemporaryDirectory(prefix="tile-timing-") as triton_cache:
                env = dict(os.environ, MINI_VLLM_TILE_TIMING=timing, TRITON_CACHE_DIR=triton_cache)
                # The child re-runs this script; its own report goes to the scratch folder.
                command_line = [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--child",
                    "--model",
                    args.model,
                    "--mode",
                    args.mode,
                    "--out",
                    triton_cache,
                ]
                done = subprocess.run(command_line, env=env, capture_output=True, text=True)
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if done.returncode != 0 or not lines:
                raise RuntimeError(f"the {timing} start failed:\n{done.stderr[-3000:]}")
            got = json.loads(lines[-1].removeprefix("RESULT "))
            results[timing].append(got)
            report(
                f"round {round_number}, timing {timing}: replay {got['replay_ms']:.3f} ms, "
                f"first launches {got['first_launch_s']:.1f} s"
            )
    report()
    report("# Tile timing: alone or in a graph (cold starts, empty Triton cache each)")
    report()
    report(f"- date: {date.today().isoformat()}")
    report(f"- machine: {torch.cuda.get_device_name()}; torch {torch.__version__}")
    report(f"- command: `{command}`")
    report(f"- engine: `{args.model}` (bfloat16), `{args.mode}`, batch 1, context 128")
    report(
        "- replay: GPU time of one replay of the batch-1 decode graph (median of 20 x 50 back "
        "to back); first launches: seconds spent timing and compiling the Triton products' tiles"
    )
    report()
    report("<!-- ANCHOR: runs -->")
    report("| timing | start | replay ms | first launches s |")
    report("|---|---|---|---|")
    for timing in TIMINGS:
        for number, got in enumerate(results[timing], 1):
            report(
                f"| {timing} | {number} | {got['replay_ms']:.3f} | {got['first_launch_s']:.1f} |"
            )
    report("<!-- ANCHOR_END: runs -->")
    report()
    report("The tile each start picked per matrix (N x K, prologue): BLOCK_N x BLOCK_K, warps.")
    report()
    matrices = sorted({m for runs in results.values() for got in runs for m in got["picks"]})
    header = [f"{timing} {n}" for timing in TIMINGS for n in range(1, len(results[timing]) + 1)]
    report("<!-- ANCHOR: picks -->")
    report("| matrix | " + " | ".join(header) + " |")
    report("|---" * (len(header) + 1) + "|")
    for matrix in matrices:
        cells = [got["picks"].get(matrix, "-") for timing in TIMINGS for got in results[timing]]
        report(f"| {matrix} | " + " | ".join(cells) + " |")
    report("<!-- ANCHOR_END: picks -->")


def add_arguments(parser) -> None:
    engine_options(parser, "compile+full")
    parser.add_argument("--rounds", type=int, default=3, help="cold starts per timing")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)


if __name__ == "__main__":
    sys.exit(run_script(__file__, __doc__.splitlines()[0], measure, add_arguments))
