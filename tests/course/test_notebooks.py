"""Every notebook runs top to bottom on CPU and builds on mini_vllm instead of redefining it;
every notebook is committed with its outputs, so that it reads without running it (on a
forge too), and speaks to a reader who has only the repository."""

from __future__ import annotations

import importlib.util
import re
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
IDS = [p.name for p in NOTEBOOKS]
MAX_TOTAL_BYTES = 3 * 2**20  # all notebooks together, outputs included
MAX_NOTEBOOK_BYTES = 1 * 2**20
WIDGET = "application/vnd.jupyter.widget-view+json"

# Words about how the project was made, not about what it teaches (the book's tests use the
# same list for book/ and labs/).
READERS_LANGUAGE = [
    r"\btargets?\b",
    r"\bstretch\b",
    r"\bsessions?\b",
    r"\blent\b",
    r"\bthe device tool\b",
    r"\bissue \d+",
    r"COURSE_SPEC",
    r"\bspec §",
    r"\bearlier session\b",
    r"\bwe were asked\b",
]


def _read(path: Path):
    import nbformat

    return nbformat.read(path, as_version=4)


def _executor():
    spec = importlib.util.spec_from_file_location(
        "execute_notebooks", ROOT / "scripts" / "execute_notebooks.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _code_cells(notebook):
    return [c for c in notebook.cells if c.cell_type == "code" and c.source.strip()]


def _output_text(output) -> str:
    if output.output_type == "stream":
        return output.text
    if output.output_type == "error":
        return "\n".join([output.ename, output.evalue, *output.traceback])
    data = output.get("data", {})
    return "\n".join(v for k, v in data.items() if k.startswith("text/"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no .ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_executes_on_cpu(path: Path, tmp_path: Path, monkeypatch):
    """Run it as scripts/execute_notebooks.py does (fresh kernel, PyTorch on one thread),
    into a scratch copy: the committed file is not touched."""
    notebook = _read(path)
    sources = "\n".join(cell.source for cell in _code_cells(notebook))
    assert "mini_vllm" in sources, f"{path.name} does not use mini_vllm"
    monkeypatch.setenv("MINI_VLLM_NOTEBOOK_THREADS", "1")
    start = time.perf_counter()
    executed = _executor().execute(path, out_dir=tmp_path)
    print(f"{path.name}: executed in {time.perf_counter() - start:.1f} s")
    code = _code_cells(_read(executed))
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{path.name}: {errors[0].ename}: {errors[0].evalue}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_committed_notebook_has_its_outputs(path: Path):
    """A reader on a forge sees what each cell printed or drew, and no error."""
    notebook = _read(path)
    missing = [
        i
        for i, cell in enumerate(notebook.cells)
        if cell.cell_type == "code" and cell.source.strip() and not cell.outputs
    ]
    assert not missing, (
        f"{path.name}: code cells {missing} have no saved outputs; "
        f"run .venv/bin/python scripts/execute_notebooks.py --only {path.stem}"
    )
    for i, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            assert output.output_type != "error", f"{path.name} cell {i}: an error output"
            assert "Traceback (most recent call last)" not in _output_text(output), (
                f"{path.name} cell {i}: a Python traceback in the saved output"
            )
            assert WIDGET not in output.get("data", {}), (
                f"{path.name} cell {i}: a widget (a progress bar?): a forge shows it as stale text"
            )
        assert "execution" not in cell.metadata, (
            f"{path.name} cell {i}: execution timestamps in the metadata "
            "(scripts/execute_notebooks.py strips them)"
        )


def test_notebooks_stay_small():
    sizes = {p.name: p.stat().st_size for p in NOTEBOOKS}
    big = {name: size for name, size in sizes.items() if size > MAX_NOTEBOOK_BYTES}
    assert not big, f"notebooks over {MAX_NOTEBOOK_BYTES} bytes: {big}"
    assert sum(sizes.values()) <= MAX_TOTAL_BYTES, f"notebooks total {sum(sizes.values())} bytes"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_speaks_to_the_reader(path: Path):
    """No word about how the project was made, in the cells or their outputs."""
    notebook = _read(path)
    texts = [cell.source for cell in notebook.cells]
    texts += [_output_text(o) for cell in notebook.cells for o in cell.get("outputs", [])]
    text = "\n".join(texts)
    found = [m.group(0) for p in READERS_LANGUAGE for m in re.finditer(p, text, re.IGNORECASE)]
    assert not found, f"{path.name}: {sorted(set(found))}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_links_read_well_on_a_forge(path: Path):
    """Book sources show their {{#include}} lines raw on a forge: a notebook links to the
    repository's files instead, and says how to open the book."""
    notebook = _read(path)
    markdown = "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
    assert not re.search(r"\]\([./]*book/src/", markdown), (
        f"{path.name} links to a book source page; link the code, or the built page"
    )
    intro = notebook.cells[0].source
    assert "make serve-book" in intro and "make book" in intro, (
        f"{path.name}: its first cell does not say how to open the book"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_pins_the_thread_count(path: Path):
    """Timings of one run compare with each other only under one thread count: the first
    code cell sets it from MINI_VLLM_NOTEBOOK_THREADS, which scripts/execute_notebooks.py
    and the execution test set."""
    first = _code_cells(_read(path))[0].source
    assert "torch.set_num_threads(" in first and "MINI_VLLM_NOTEBOOK_THREADS" in first, path.name


def test_the_saved_outputs_come_from_one_pytorch_build():
    """Each notebook's first code cell prints the PyTorch build its saved outputs were made
    under. Outputs saved under different builds would set versions' numbers and messages
    side by side without saying so: save them all with scripts/execute_notebooks.py."""
    builds = {}
    for path in NOTEBOOKS:
        first = _code_cells(_read(path))[0]
        printed = "".join(_output_text(o) for o in first.outputs)
        match = re.search(r"PyTorch (\S+?),", printed)
        assert match, f"{path.name}: its first code cell does not print 'PyTorch <build>,'"
        builds[path.name] = match.group(1)
    assert len(set(builds.values())) == 1, (
        f"notebooks saved under different PyTorch builds: {builds}; run "
        ".venv/bin/python scripts/execute_notebooks.py --only <the odd ones>"
    )
