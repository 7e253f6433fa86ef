"""scripts/make_figures.py draws every book figure from the code, as a non-empty PNG."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parent.parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_figures = _load_script("make_figures")
figures_phase06 = _load_script("figures_phase06")
ALL_FIGURES = {**make_figures.FIGURES, **figures_phase06.FIGURES}


@pytest.mark.parametrize("name", sorted(ALL_FIGURES))
def test_figure_is_drawn_as_png(name: str, tmp_path: Path):
    path = make_figures.save_figure(ALL_FIGURES[name](), tmp_path / name)
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE), f"{name} is not a PNG"
    assert 10_000 < len(data) < 150 * 1024, f"{name}: {len(data)} bytes, expected a real figure under 150 KiB"


def test_the_book_uses_only_figures_the_scripts_draw():
    pages = (ROOT / "book" / "src").rglob("*.md")
    referenced = {
        part.split(")")[0].rsplit("/", 1)[-1]
        for page in pages
        for part in page.read_text(encoding="utf-8").split("figures/")[1:]
        if part.split(")")[0].endswith(".png")
    }
    assert referenced, "the book shows no figure"
    assert referenced <= set(ALL_FIGURES), f"not drawn by the scripts: {referenced - set(ALL_FIGURES)}"
    committed = {p.name for p in (ROOT / "book" / "src" / "figures").glob("*.png")}
    assert referenced <= committed, f"drawn but not committed: {referenced - committed}"


def test_the_script_is_deterministic(tmp_path: Path):
    name = "full-vs-piecewise.png"
    first = make_figures.save_figure(make_figures.FIGURES[name](), tmp_path / "a.png").read_bytes()
    second = make_figures.save_figure(make_figures.FIGURES[name](), tmp_path / "b.png").read_bytes()
    assert first == second


def test_the_synthetic_trace_is_seeded():
    assert make_figures.synthetic_batch_trace() == make_figures.synthetic_batch_trace()
    assert make_figures.synthetic_batch_trace(seed=1) != make_figures.synthetic_batch_trace(seed=0)


def test_geometric_ladder_reaches_the_top_and_rises():
    ladder = make_figures.geometric_ladder(1.5, top=100)
    assert ladder[0] == 1 and ladder[-1] == 100
    assert all(b > a for a, b in zip(ladder, ladder[1:]))
