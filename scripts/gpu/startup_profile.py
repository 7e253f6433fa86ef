#!/usr/bin/env python3
"""Where a start-up's time goes (cProfile of a whole start, cold or warm).

    python3 scripts/gpu/startup_profile.py [--model smollm2-135m]
        [--cudagraph-mode full_and_piecewise] [--out DIR]

Runs a cold start in a fresh process (empty caches in a scratch folder), then a warm one
on the same caches under cProfile, and prints the warm start's functions by cumulative
and by own time, and who calls the costliest: what a restarted server waits for.
`--profile-cold` profiles the cold start instead. The starts are those of `python -m
mini_vllm bench startup`. The raw profile is kept as start.prof in the output folder
(`python -m pstats`, snakeviz).
"""

from __future__ import annotations

import io
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from gpukit import ROOT, run_script


def add_arguments(parser) -> None:
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--compilation-mode", default="vllm_compile")
    parser.add_argument("--cudagraph-mode", default="full_and_piecewise")
    parser.add_argument("--profile-cold", action="store_true", help="profile the cold start")
    parser.add_argument("--rows", type=int, default=45, help="rows of each table")


def measure(args, report) -> None:
    start_args = [args.model, "cuda", args.compilation_mode, args.cudagraph_mode]
    from mini_vllm.bench.startup import fresh_start_env

    with tempfile.TemporaryDirectory(prefix="mini-vllm-startup-profile-") as scratch:
        env = fresh_start_env(Path(scratch), report)  # as `bench startup`: bytecode written first
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        stats_file = Path(scratch) / "start.prof"
        plain = [sys.executable, "-m", "mini_vllm.bench.startup", *start_args]
        profiled = [
            sys.executable, "-m", "cProfile", "-o", str(stats_file),
            "-m", "mini_vllm.bench.startup", *start_args,
        ]  # fmt: skip
        runs = [("cold", profiled)] if args.profile_cold else [("cold", plain), ("warm", profiled)]
        for label, command in runs:
            done = subprocess.run(
                command, env=env, cwd=scratch, capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise RuntimeError(f"the {label} start failed:\n{done.stderr[-4000:]}")
            phases = json.loads(done.stdout.strip().splitlines()[-1])
            report(f"{label}{' (profiled)' if command is profiled else ''}: " + ", ".join(
                f"{key} {value:.1f}" if isinstance(value, float) else f"{key} {value}"
                for key, value in phases.items()
            ))  # fmt: skip
        shutil.copy(stats_file, args.out / "start.prof")
        for order in ("cumulative", "tottime"):
            text = io.StringIO()
            pstats.Stats(str(stats_file), stream=text).sort_stats(order).print_stats(args.rows)
            report(text.getvalue())
        text = io.StringIO()
        stats = pstats.Stats(str(stats_file), stream=text).sort_stats("tottime")
        stats.print_callers(12)  # the twelve costliest by own time, and who called them
        report(text.getvalue())


if __name__ == "__main__":
    sys.exit(run_script(__file__, __doc__.splitlines()[0], measure, add_arguments))
