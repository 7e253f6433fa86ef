#!/usr/bin/env python3
"""Where one engine decode step goes, batch 1: host time
(cProfile), then the GPU kernels (torch.profiler).

    MINI_VLLM_PDL=0 python3 scripts/gpu/step_profile.py
    [--model smollm2-135m] [--mode compile+full] [--out DIR]

Run it with MINI_VLLM_PDL=0 for per-kernel costs: under programmatic dependent launch a
kernel starts before the one ahead of it ends and waits, and the profiler counts the
wait as its time.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys

from gpukit import run_script


def add_arguments(parser) -> None:
    from mini_vllm.bench.harness import MODES

    parser.add_argument(
        "--model", default="smollm2-135m", help="a model shape (default: %(default)s)"
    )
    parser.add_argument(
        "--mode",
        default="compile+full",
        choices=sorted(MODES),
        help="engine mode (default: %(default)s)",
    )


def measure(args, report) -> None:
    from mini_vllm.bench.harness import decode_engine, kernel_table, start_decoding
    from mini_vllm.models.loader import load_model

    model, _, _ = load_model(args.model, device="cuda", progress=False)
    engine = decode_engine(model, args.mode, [1], context_len=128, new_tokens=300)
    start_decoding(engine, batch=1, context_len=128, new_tokens=300)
    for _ in range(20):
        engine.step()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(200):
        engine.step()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    report(text.getvalue())
    report(kernel_table(engine, steps=10))


if __name__ == "__main__":
    sys.exit(run_script(__file__, __doc__.splitlines()[0], measure, add_arguments))
