#!/usr/bin/env python3
"""Where one engine decode step goes: host time (cProfile), then the GPU kernels
(torch.profiler).

    MINI_VLLM_PDL=0 python3 scripts/gpu/step_profile.py
    [--model smollm2-135m] [--mode compile+full] [--batch 1] [--out DIR]

Run it with MINI_VLLM_PDL=0 for per-kernel costs: under programmatic dependent launch a
kernel starts before the one ahead of it ends and waits, and the profiler counts the
wait as its time.
"""

from __future__ import annotations

import sys

from gpukit import decoding_engine, engine_options, host_profile, run_script


def add_arguments(parser) -> None:
    engine_options(parser, mode="compile+full")
    parser.add_argument(
        "--batch", type=int, default=1, help="requests decoding together (default: %(default)s)"
    )


def measure(args, report) -> None:
    from mini_vllm.bench.harness import kernel_table

    engine = decoding_engine(args, new_tokens=300, warm_steps=20, batch=args.batch)
    (table,) = host_profile(engine, 200, [("tottime", 25)])
    report(table)
    report(kernel_table(engine, steps=10, rows=30))


if __name__ == "__main__":
    sys.exit(run_script(__file__, __doc__.splitlines()[0], measure, add_arguments))
