#!/usr/bin/env python3
"""The articles' claims about launches, CUDA graphs and torch.compile, measured in one run.

    python3 scripts/gpu/factcheck.py                       # -> benchmarks/results/factcheck-cuda.md
    python3 scripts/gpu/factcheck.py OUTDIR                # or --out OUTDIR
    python3 scripts/gpu/factcheck.py --parts a,b,g         # some parts only
    python3 scripts/gpu/factcheck.py --dry-run-cpu /tmp/x  # every part at the tiny shape, CPU
    python3 scripts/gpu/factcheck.py --cpu-claims          # -> factcheck-cpu.md, no GPU

About nine minutes on an H100 (--budget-s, default 540, skips what would not fit). Parts:
a host time per launch; b decode step time at the Llama-3.1-8B shape, eager / FULL graph /
compiled, with the weight-read floor (b2: transformers' eager generate); c the host's share
of an eager step at three shapes; d torch.compile's first call cold and warm; e CUDA graphs
recorded across input lengths, with and without dynamic=True; f graph-pool memory per
capture size, largest or smallest first; g time to first token of a 512-token prompt; h
capturing without a warm-up. The report (markdown, one anchor per table, and the raw
numbers as JSON) is rewritten after every part. The measuring code is
scripts/gpu/factcheck_parts.py, beside this script.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from gpukit import ROOT

DEFAULT_OUT = ROOT / "benchmarks" / "results"
PARTS = ("a", "b", "b2", "c", "d", "e", "f", "g", "h")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", nargs="?", type=Path, help="folder for the report")
    parser.add_argument("--out", type=Path, help="the same as OUTDIR (default: %(default)s)")
    parser.add_argument(
        "--parts", default=",".join(PARTS), help="comma-separated parts (default: %(default)s)"
    )
    parser.add_argument(
        "--budget-s", type=float, help="wall-clock budget in seconds (default: 540; CPU 600)"
    )
    parser.add_argument("--modes", help="engine modes of part b (default: the plan's)")
    parser.add_argument("--batch-sizes", help="batch sizes of part b (default: 1,4,16,32)")
    parser.add_argument(
        "--dry-run-cpu",
        action="store_true",
        help="run every part on the CPU at the tiny shape (checks the code, not numbers)",
    )
    parser.add_argument(
        "--dry-run-full",
        action="store_true",
        help="with --dry-run-cpu: the compiled engine modes too (Inductor on the CPU: minutes)",
    )
    parser.add_argument(
        "--cpu-claims",
        action="store_true",
        help="write factcheck-cpu.md: the articles' arithmetic and Dynamo's recompiles (CPU)",
    )
    args = parser.parse_args(argv)
    out = args.out or args.outdir or DEFAULT_OUT
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {unknown}; choose from {', '.join(PARTS)}")
    command = "python3 scripts/gpu/factcheck.py " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)
    )

    import torch
    from factcheck_parts import FactcheckPlan, cpu_claims_report, run_factcheck

    if args.cpu_claims:
        out.mkdir(parents=True, exist_ok=True)
        path = out / "factcheck-cpu.md"
        path.write_text(cpu_claims_report(command.strip()), encoding="utf-8")
        print(f"wrote {path}")
        return 0
    if args.dry_run_cpu:
        plan = FactcheckPlan.cpu_dry_run(full=args.dry_run_full)
    elif not torch.cuda.is_available():
        print(
            f"{Path(__file__).name} measures a GPU and needs an NVIDIA GPU with CUDA; "
            f"torch {torch.__version__} sees none here (--dry-run-cpu runs it on the CPU)",
            file=sys.stderr,
        )
        return 2
    else:
        plan = FactcheckPlan()
    if args.budget_s is not None:
        plan.budget_s = args.budget_s
    if args.modes:
        plan.modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
        plan.ttft_modes = tuple(m for m in plan.ttft_modes if m in plan.modes)
    if args.batch_sizes:
        plan.batch_sizes = tuple(int(b) for b in args.batch_sizes.split(","))
    run_factcheck(out, plan, command.strip(), parts, log=lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
