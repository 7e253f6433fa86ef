"""scripts/figures/ draws every book figure from the code, as a non-empty PNG."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]
FIGURE_SCRIPTS = ROOT / "scripts" / "figures"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
sys.path.insert(0, str(FIGURE_SCRIPTS))  # where the scripts find figurekit, as when run by hand


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"figures_{name}", FIGURE_SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


figurekit = _load_script("figurekit")
# One script a phase (scripts/figures/phaseNN.py), each with a FIGURES dict {png name: draw}.
PHASE_SCRIPTS = {p.stem: _load_script(p.stem) for p in sorted(FIGURE_SCRIPTS.glob("phase*.py"))}
phase05 = PHASE_SCRIPTS["phase05"]
ALL_FIGURES = {
    name: draw for module in PHASE_SCRIPTS.values() for name, draw in module.FIGURES.items()
}


def test_every_phase_has_a_figure_script():
    expected = {f"phase{n:02d}" for n in range(8)}
    assert expected <= set(PHASE_SCRIPTS), f"no figure script for {expected - set(PHASE_SCRIPTS)}"


@pytest.mark.parametrize("name", sorted(ALL_FIGURES))
def test_figure_is_drawn_as_png(name: str, tmp_path: Path):
    path = figurekit.save_figure(ALL_FIGURES[name](), tmp_path / name)
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE), f"{name} is not a PNG"
    assert 10_000 < len(data) < 150 * 1024, (
        f"{name}: {len(data)} bytes, expected a real figure under 150 KiB"
    )


def test_the_book_uses_only_figures_the_scripts_draw():
    pages = (ROOT / "book" / "src").rglob("*.md")
    referenced = {
        part.split(")")[0].rsplit("/", 1)[-1]
        for page in pages
        for part in page.read_text(encoding="utf-8").split("figures/")[1:]
        if part.split(")")[0].endswith(".png")
    }
    assert referenced, "the book shows no figure"
    assert referenced <= set(ALL_FIGURES), (
        f"not drawn by the scripts: {referenced - set(ALL_FIGURES)}"
    )
    committed = {p.name for p in (ROOT / "book" / "src" / "figures").glob("*.png")}
    assert referenced <= committed, f"drawn but not committed: {referenced - committed}"


def test_the_script_is_deterministic(tmp_path: Path):
    name = "full-vs-piecewise.png"
    first = figurekit.save_figure(phase05.FIGURES[name](), tmp_path / "a.png").read_bytes()
    second = figurekit.save_figure(phase05.FIGURES[name](), tmp_path / "b.png").read_bytes()
    assert first == second


def test_the_synthetic_trace_is_seeded():
    assert phase05.synthetic_batch_trace() == phase05.synthetic_batch_trace()
    assert phase05.synthetic_batch_trace(seed=1) != phase05.synthetic_batch_trace(seed=0)


def test_geometric_ladder_reaches_the_top_and_rises():
    ladder = phase05.geometric_ladder(1.5, top=100)
    assert ladder[0] == 1 and ladder[-1] == 100
    assert all(b > a for a, b in zip(ladder, ladder[1:]))
