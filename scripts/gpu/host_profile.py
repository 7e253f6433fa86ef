#!/usr/bin/env python3
"""Where the host time of an engine decode step goes (cProfile), batch 1.

    python3 scripts/gpu/host_profile.py [--model
    smollm2-135m] [--mode compile+full+async] [--out DIR]

Times 200 steps without the profiler, then profiles 200 more and prints the functions
by own time and by cumulative time. Under async scheduling the host plans one step
while the GPU runs the other, so what the host spends here is what a step waits for
when the host is the slower side.
"""

from __future__ import annotations

import sys
import time

from gpukit import decoding_engine, engine_options, host_profile, run_script


def add_arguments(parser) -> None:
    engine_options(parser, mode="compile+full+async")


def measure(args, report) -> None:
    import torch

    engine = decoding_engine(args, new_tokens=450, warm_steps=30)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(200):
        engine.step()
    per_step_ms = (time.perf_counter() - start) / 200 * 1e3
    report(f"{args.model} {args.mode}: {per_step_ms:.3f} ms a step without the profiler")
    for table in host_profile(engine, 200, [("tottime", 22), ("cumulative", 30)]):
        report(table)


if __name__ == "__main__":
    sys.exit(run_script(__file__, __doc__.splitlines()[0], measure, add_arguments))
