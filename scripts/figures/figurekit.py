"""What the book's figure scripts share: one style, one way to save, one command line.

    .venv/bin/python scripts/figures/phase05.py #
    every figure of a phase into book/src/figures/
    .venv/bin/python scripts/figures/phase05.py --only crossover-llama3.1-8b.png --out-dir /tmp

Each figure is a function returning a `matplotlib.figure.Figure` built without pyplot's
global state (`styled`), so that the notebooks and the tests can call the same
functions; `save_figure` writes a deterministic PNG (no version stamp).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import matplotlib
import matplotlib.style
from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere: mini_vllm comes from the checkout
    sys.path.insert(0, str(ROOT))

DPI = 110
OUT_DIR = ROOT / "book" / "src" / "figures"

# Matplotlib's defaults plus a few readability tweaks, applied while a figure is built
# and saved, so that a user's matplotlibrc cannot change the book's PNGs.
STYLE = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": False,
}


def styled(build: Callable[..., Figure]) -> Callable[..., Figure]:
    """Build the figure under the fixed style (fonts and sizes are read when artists are made)."""

    @functools.wraps(build)
    def wrapper(*args, **kwargs) -> Figure:
        with matplotlib.style.context("default"), matplotlib.rc_context(STYLE):
            return build(*args, **kwargs)

    return wrapper


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write `fig` as a PNG at the book's resolution, without a version stamp."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with matplotlib.style.context("default"), matplotlib.rc_context(STYLE):
        fig.savefig(path, dpi=DPI, format="png", metadata={"Software": None})
    return path


def draw(
    figures: Mapping[str, Callable[[], Figure]],
    description: str,
    argv: Sequence[str] | None = None,
) -> int:
    """The command line of a figure script: draw every
    figure (or `--only` some) into `--out-dir`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--out-dir", type=Path, default=OUT_DIR, help="where to write (default: %(default)s)"
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(figures),
        help="draw just this figure (repeatable)",
    )
    args = parser.parse_args(argv)
    for name in args.only or sorted(figures):
        path = save_figure(figures[name](), args.out_dir / name)
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        print(f"{shown}  {path.stat().st_size / 1024:.0f} KiB")
    return 0
