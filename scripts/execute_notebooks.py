#!/usr/bin/env python3
"""Execute the notebooks and save their outputs, so that they read without running them.

    .venv/bin/python scripts/execute_notebooks.py                          # all, in place
    .venv/bin/python scripts/execute_notebooks.py --only phase-06-measure  # one of them
    .venv/bin/python scripts/execute_notebooks.py --only phase-05-cuda-graphs --out /tmp/nb

Each notebook runs top to bottom in a fresh Jupyter kernel (nbclient), with notebooks/ as
its working directory, on the CPU (CUDA_VISIBLE_DEVICES is emptied unless --keep-gpu is
given), with PyTorch pinned to MINI_VLLM_NOTEBOOK_THREADS threads (default 1; every
notebook's first cell reads it: on a shared machine, two threads that wait for each other
are many times slower whenever one of them is not scheduled). The executed copy replaces
the notebook, or goes into --out DIR. Volatile metadata (execution timestamps) is
stripped, so that executing again changes only the outputs that really changed: timings.

On a machine without nbclient and ipykernel (a bare GPU machine), use
scripts/gpu/run_notebook_cells.py --write-outputs instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
DEFAULT_THREADS = "1"
TIMEOUT_S = 900  # per cell


def notebook_paths(only: list[str] | None = None) -> list[Path]:
    """The notebooks to run: all of notebooks/, or those named by --only."""
    every = sorted(NOTEBOOKS.glob("*.ipynb"))
    if not only:
        return every
    chosen = []
    for name in only:
        stem = Path(name).name.removesuffix(".ipynb")
        match = [p for p in every if p.stem == stem]
        if not match:
            known = ", ".join(p.stem for p in every)
            raise SystemExit(f"no notebook named {name!r} in notebooks/ (there are: {known})")
        chosen += match
    return chosen


def kernel_env(keep_gpu: bool = False) -> dict[str, str]:
    """The kernel's environment: this one, plus the pinned thread count and no progress bars."""
    env = dict(os.environ)
    env.setdefault("MINI_VLLM_NOTEBOOK_THREADS", DEFAULT_THREADS)
    env["TQDM_DISABLE"] = "1"
    env.pop("MPLBACKEND", None)  # each notebook chooses `%matplotlib inline`
    if not keep_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def strip_volatile(notebook) -> None:
    """Drop what changes on every run without meaning anything: timestamps, widget state."""
    notebook.metadata.pop("widgets", None)
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)  # nbclient's start and end times of each cell
        cell.metadata.pop("ExecuteTime", None)  # a Jupyter extension's equivalent


def summary(notebook) -> tuple[int, int, int]:
    """(code cells with source, those with outputs, error outputs)."""
    code = [c for c in notebook.cells if c.cell_type == "code" and c.source.strip()]
    with_outputs = sum(1 for c in code if c.outputs)
    errors = sum(1 for c in code for o in c.outputs if o.output_type == "error")
    return len(code), with_outputs, errors


def execute(path: Path, out_dir: Path | None = None, keep_gpu: bool = False) -> Path:
    """Run one notebook in a fresh kernel; write the executed copy (in place, or into out_dir)."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        record_timing=False,
        coalesce_streams=True,  # a streamed answer is one output, not one per token
    )
    client.execute(env=kernel_env(keep_gpu))
    strip_volatile(notebook)
    target = path if out_dir is None else Path(out_dir) / path.name
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, target)
    return target


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="run only this notebook (repeatable), e.g. phase-06-measure",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="write the executed copies into DIR instead of over the originals",
    )
    parser.add_argument(
        "--keep-gpu",
        action="store_true",
        help="let the kernel see CUDA devices (by default they are hidden: outputs as on a CPU)",
    )
    args = parser.parse_args(argv)
    import nbformat

    paths = notebook_paths(args.only)
    threads = kernel_env()["MINI_VLLM_NOTEBOOK_THREADS"]
    where = "in place" if args.out is None else f"into {args.out}"
    print(f"executing {len(paths)} notebook(s) {where}; PyTorch on {threads} thread(s)", flush=True)
    failed = 0
    for i, path in enumerate(paths, 1):
        print(f"[{i}/{len(paths)}] {path.name} ...", flush=True)
        start = time.perf_counter()
        try:
            target = execute(path, args.out, args.keep_gpu)
        except Exception as exc:  # a failing cell: say which notebook, go on with the others
            failed += 1
            print(f"    FAILED after {time.perf_counter() - start:.1f} s\n{exc}", flush=True)
            continue
        code, with_outputs, errors = summary(nbformat.read(target, as_version=4))
        print(
            f"    {time.perf_counter() - start:.1f} s; {with_outputs}/{code} code cells with "
            f"outputs, {errors} errors; {target.stat().st_size / 1024:.0f} KiB -> {_shown(target)}",
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
