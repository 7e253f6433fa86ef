#!/usr/bin/env python3
"""Run a notebook's code cells in order, in one namespace, without Jupyter.

    python3 scripts/gpu/run_notebook_cells.py notebooks/phase-05-cuda-graphs.ipynb

For a GPU machine without nbclient and ipykernel: the test suite executes the notebooks
with nbclient on CPU; this runs the same cells where CUDA exists, so that their GPU
branches run too. Line magics are dropped; cells must otherwise be plain Python.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the notebooks import mini_vllm from the checkout
    sys.path.insert(0, str(ROOT))


def main(path: str) -> int:
    notebook = Path(path).resolve()
    cells = [c for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.chdir(notebook.parent)
    namespace: dict = {"__name__": "__main__", "display": print}
    for i, cell in enumerate(cells, 1):
        # Line magics (`%matplotlib inline`) are IPython's; the Agg backend replaces them here.
        source = "".join(line for line in cell["source"] if not line.lstrip().startswith("%"))
        start = time.perf_counter()
        print(f"--- cell {i}/{len(cells)}", flush=True)
        exec(compile(source, f"{notebook.name}[{i}]", "exec"), namespace)
        print(f"--- cell {i} done in {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", help="the .ipynb file whose code cells to run")
    sys.exit(main(parser.parse_args().notebook))
