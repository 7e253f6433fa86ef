#!/usr/bin/env python3
"""Run a notebook's code cells in order, in one namespace, without Jupyter.

    python3 scripts/gpu/run_notebook_cells.py notebooks/phase-05-cuda-graphs.ipynb
    python3 scripts/gpu/run_notebook_cells.py notebooks/phase-05-cuda-graphs.ipynb \\
        --write-outputs out/phase-05-cuda-graphs.ipynb

For a GPU machine without nbclient and ipykernel: the test suite executes the notebooks
with nbclient on CPU; this runs the same cells where CUDA exists, so that their GPU
branches run too. Line magics are dropped; cells must otherwise be plain Python.

With --write-outputs, each cell's outputs are recorded as Jupyter would show them and a
copy of the notebook holding them is written: what the cell printed (stdout and stderr),
what it passed to `display`, the value of its last expression, and every matplotlib figure
it left open or showed (as a PNG). The copy is ready to replace the notebook in notebooks/
(scripts/execute_notebooks.py does the same with a real kernel, where nbclient exists).
"""

from __future__ import annotations

import argparse
import ast
import base64
import io
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the notebooks import mini_vllm from the checkout
    sys.path.insert(0, str(ROOT))


def _lines(text: str) -> list[str]:
    """Text as a notebook stores it: a list of lines, each keeping its newline."""
    return text.splitlines(keepends=True)


class CellOutputs:
    """The outputs of one cell, in the order they appeared (Jupyter's nbformat v4 shape)."""

    def __init__(self) -> None:
        self.outputs: list[dict] = []

    def stream(self, name: str, text: str) -> None:
        if not text:
            return
        last = self.outputs[-1] if self.outputs else None
        if last and last["output_type"] == "stream" and last["name"] == name:
            last["text"] += text  # consecutive writes to one stream form one output
        else:
            self.outputs.append({"output_type": "stream", "name": name, "text": text})

    def data(self, bundle: dict, result_of: int | None = None) -> None:
        output = {"data": bundle, "metadata": {}}
        if result_of is None:
            output["output_type"] = "display_data"
        else:
            output.update(output_type="execute_result", execution_count=result_of)
        self.outputs.append(output)

    def error(self, exc: BaseException) -> None:
        self.outputs.append(
            {
                "output_type": "error",
                "ename": type(exc).__name__,
                "evalue": str(exc),
                "traceback": traceback.format_exception(type(exc), exc, exc.__traceback__),
            }
        )

    def as_json(self) -> list[dict]:
        out = []
        for output in self.outputs:
            output = dict(output)
            if output["output_type"] == "stream":
                output["text"] = _lines(output["text"])
            elif "data" in output:
                output["data"] = {
                    k: (_lines(v) if k.startswith("text/") else v)
                    for k, v in output["data"].items()
                }
            out.append(output)
        return out


class Tee(io.TextIOBase):
    """Writes to the recorder and to the real stream, so the log still shows progress."""

    def __init__(self, recorder: CellOutputs | None, name: str, real) -> None:
        self.recorder, self.name, self.real = recorder, name, real

    def write(self, text: str) -> int:
        if self.recorder is not None:
            self.recorder.stream(self.name, text)
        self.real.write(text)
        return len(text)

    def flush(self) -> None:
        self.real.flush()

    def fileno(self) -> int:  # for code that writes to the descriptor itself
        return self.real.fileno()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:
        return getattr(self.real, "encoding", "utf-8")


def _bundle(obj) -> dict:
    """What `display(obj)` shows: its Markdown, HTML or PNG form if it has one, and its repr."""
    bundle = {}
    for method, mime in (
        ("_repr_markdown_", "text/markdown"),
        ("_repr_html_", "text/html"),
        ("_repr_png_", "image/png"),
    ):
        if hasattr(obj, method):
            value = getattr(obj, method)()
            if value is not None:
                if isinstance(value, bytes):
                    value = base64.b64encode(value).decode("ascii")
                bundle[mime] = value
    bundle["text/plain"] = repr(obj)
    return bundle


def _figure_bundle(fig) -> dict:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")  # what Jupyter's inline backend does
    width, height = fig.get_size_inches() * fig.dpi
    return {
        "image/png": base64.b64encode(buffer.getvalue()).decode("ascii"),
        "text/plain": f"<Figure size {width:g}x{height:g} with {len(fig.axes)} Axes>",
    }


class Session:
    """One namespace for every cell, and the recorder of the cell now running."""

    def __init__(self, record: bool) -> None:
        self.record = record
        self.current: CellOutputs | None = None
        self.namespace: dict = {"__name__": "__main__", "display": self.display}
        self._plt = None
        if record:
            import matplotlib.pyplot as plt

            plt.switch_backend(os.environ.get("MPLBACKEND", "Agg"))

            def show(*args, **kwargs) -> None:  # a figure shown mid-cell appears there
                self.show()

            plt.show = show
            self._plt = plt

    def display(self, *objs) -> None:
        for obj in objs:
            if self.current is None:
                print(obj)
            else:
                self.current.data(_bundle(obj))

    def show(self, *args, **kwargs) -> None:
        if self._plt is None or self.current is None:
            return
        for number in self._plt.get_fignums():
            fig = self._plt.figure(number)
            self.current.data(_figure_bundle(fig))
            self._plt.close(fig)

    def run(self, source: str, filename: str, count: int) -> CellOutputs:
        self.current = CellOutputs() if self.record else None
        real_out, real_err = sys.stdout, sys.stderr
        sys.stdout = Tee(self.current, "stdout", real_out)
        sys.stderr = Tee(self.current, "stderr", real_err)
        try:
            tree = ast.parse(source, filename)
            last = None
            if self.record and tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)  # its value is shown, as in Jupyter
            exec(compile(tree, filename, "exec"), self.namespace)
            if last is not None:
                value = eval(compile(last, filename, "eval"), self.namespace)
                if value is not None:
                    self.current.data(_bundle(value), result_of=count)
            self.show()  # the figures the cell left open
        except BaseException as exc:
            if self.current is not None:
                self.current.error(exc)
            raise
        finally:
            sys.stdout, sys.stderr = real_out, real_err
        return self.current


def main(path: str, write_outputs: str | None = None) -> int:
    notebook_path = Path(path).resolve()
    notebook = json.loads(notebook_path.read_text(encoding="utf-8"))
    cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("TQDM_DISABLE", "1")
    out_path = Path(write_outputs).resolve() if write_outputs else None
    os.chdir(notebook_path.parent)
    session = Session(record=out_path is not None)
    status = 0
    for i, cell in enumerate(cells, 1):
        # Line magics (`%matplotlib inline`) are IPython's; the Agg backend replaces them here.
        lines = cell["source"] if isinstance(cell["source"], list) else _lines(cell["source"])
        source = "".join(line for line in lines if not line.lstrip().startswith("%"))
        start = time.perf_counter()
        print(f"--- cell {i}/{len(cells)}", flush=True)
        try:
            recorded = session.run(source, f"{notebook_path.name}[{i}]", i)
        except BaseException:
            status = 1
            recorded = session.current
            if out_path is None:
                raise
            traceback.print_exc()
        if out_path is not None:
            cell["outputs"] = recorded.as_json()
            cell["execution_count"] = i
        print(f"--- cell {i} done in {time.perf_counter() - start:.1f} s", flush=True)
        if status:
            break
    if out_path is not None:
        for cell in cells[i:]:  # cells after a failing one did not run
            cell["outputs"], cell["execution_count"] = [], None
        for cell in notebook["cells"]:
            cell.get("metadata", {}).pop("execution", None)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False)
        out_path.write_text(text + "\n", encoding="utf-8")
        print(f"outputs written to {out_path}", flush=True)
    return status


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", help="the .ipynb file whose code cells to run")
    parser.add_argument(
        "--write-outputs",
        metavar="OUT.ipynb",
        help="record each cell's outputs (text, display, figures as PNG) into this copy",
    )
    args = parser.parse_args()
    sys.exit(main(args.notebook, args.write_outputs))
