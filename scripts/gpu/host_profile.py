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

import cProfile
import io
import pstats
import sys
import time

from gpukit import run_script


def add_arguments(parser) -> None:
    from mini_vllm.bench.harness import MODES

    parser.add_argument(
        "--model", default="smollm2-135m", help="a model shape (default: %(default)s)"
    )
    parser.add_argument(
        "--mode",
        default="compile+full+async",
        choices=sorted(MODES),
        help="engine mode (default: %(default)s)",
    )


def measure(args, report) -> None:
    import torch

    from mini_vllm.bench.harness import decode_engine, start_decoding
    from mini_vllm.models.loader import load_model

    model, _, _ = load_model(args.model, device="cuda", progress=False)
    engine = decode_engine(model, args.mode, [1], context_len=128, new_tokens=450)
    start_decoding(engine, batch=1, context_len=128, new_tokens=450)
    for _ in range(30):
        engine.step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(200):
        engine.step()
    report(
        f"{args.model} {args.mode}: {(time.perf_counter() - start) / 200 * 1e3:.3f} "
        "ms a step without the profiler"
    )
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(200):
        engine.step()
    profiler.disable()
    for order, rows in (("tottime", 22), ("cumulative", 30)):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(rows)
        report(text.getvalue())


if __name__ == "__main__":
    sys.exit(run_script(__file__, __doc__.splitlines()[0], measure, add_arguments))
