#!/usr/bin/env python3
"""Warm restarts of two versions of mini_vllm on one GPU, alternating.

    python3 scripts/gpu/ab_startup.py OLD [--rounds 4] [--out DIR]

OLD is a folder holding another copy of the mini_vllm package (e.g. made with
`git archive <commit> mini_vllm | tar -x -C OLD`). Each version gets its own caches and
one cold start to fill them (untimed here), then the two take turns at warm starts,
`--rounds` each, every start a fresh process as in `python -m mini_vllm bench startup`.
A host's speed drifts by tens of percent within an hour, so only starts taken in turn
on one host compare; the report lists every start and the medians.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from gpukit import old_package_argument, run_script, versions_to_compare

START = ["smollm2-135m", "cuda", "vllm_compile", "full_and_piecewise"]


def add_arguments(parser) -> None:
    old_package_argument(parser)
    parser.add_argument("--rounds", type=int, default=4, help="warm starts of each version")


def measure(args, report) -> None:
    from mini_vllm.bench.startup import fresh_start_env, run_one_start

    versions = versions_to_compare(args.old, "ab_startup.py")
    with tempfile.TemporaryDirectory(prefix="mini-vllm-ab-startup-") as scratch:
        envs = {}
        for name, folder in versions.items():
            env = fresh_start_env(Path(scratch) / name, report)
            env.pop("PYTHONPATH", None)
            envs[name] = env
            report(f"{name}: cold start to fill its caches ... "
                   f"{run_one_start(env, START, folder)['total_s']:.1f} s")  # fmt: skip
        totals: dict[str, list[float]] = {name: [] for name in versions}
        for round_ in range(1, args.rounds + 1):
            for name, folder in versions.items():
                got = run_one_start(envs[name], START, folder)
                totals[name].append(got["total_s"])
                phases = ", ".join(
                    f"{key.removesuffix('_s')} {value:.2f}"
                    for key, value in got.items()
                    if key.endswith("_s") and key != "total_s"
                )
                report(f"round {round_} {name}: warm start {got['total_s']:.2f} s ({phases})")
    report("")
    report("| version | warm starts, s | median s |")
    report("|---|---|---|")
    for name, values in totals.items():
        listed = " / ".join(f"{value:.2f}" for value in values)
        report(f"| {name} | {listed} | {statistics.median(values):.2f} |")


if __name__ == "__main__":
    sys.exit(run_script(__file__, __doc__, measure, add_arguments))
