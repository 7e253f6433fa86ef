#!/usr/bin/env python3
"""mdBook preprocessor: a lab's README.md as a page of the book, its links still working.

A lab page of the book (`book/src/labs/*.md`) is one line,
`{{#include ../../../labs/phase-NN/lab-MM-name/README.md}}`. mdBook's own include copies
the file as it is, so the README's relative links, written for the README where it lies
in the repository (`../../../book/src/phase-05/README.md`, `recorded/h100-itl.md`), would
point nowhere on the site. This preprocessor runs before mdBook's `links` and does that
include itself, rewriting each relative link of the README:

- to a page of the book (a file under `book/src/`): the page, relative to the lab page;
- to another lab's README that has a page: that lab page;
- to any other file of the repository: the file on the forge
  (`[output.html] git-repository-url` in book.toml, branch `main`).

Only whole-file includes of a `labs/**/README.md` are handled here; every other include
is left to mdBook. Configured in book.toml as `[preprocessor.lab-pages]`.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

BRANCH = "main"
INCLUDE = re.compile(r"\{\{#include\s+([^}:\s]+)\s*\}\}")
INLINE_LINK = re.compile(
    r"(!?\[(?:[^\[\]]|\[[^\]]*\])*\]\()(\s*<?)([^)\s>]+)(>?(?:\s+\"[^\"]*\")?\s*\))"
)
REFERENCE = re.compile(r"^(\s{0,3}\[[^\]]+\]:\s*<?)(\S+?)(>?(?:\s.*)?)$")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+).*?\1")


def chapters(items):
    for item in items:
        chapter = item.get("Chapter") if isinstance(item, dict) else None
        if chapter:
            yield chapter
            yield from chapters(chapter.get("sub_items", []))


def lab_readme(chapter: dict, src: Path, repo: Path) -> tuple[str, Path] | None:
    """The include directive of a lab page and the README it names, or None."""
    if not chapter.get("source_path"):
        return None
    for match in INCLUDE.finditer(chapter["content"]):
        target = (src / chapter["source_path"]).parent / match.group(1)
        target = Path(os.path.normpath(target))
        if target.name == "README.md" and target.is_relative_to(repo / "labs"):
            return match.group(0), target
    return None


class Rewriter:
    def __init__(self, src: Path, repo: Path, forge: str | None, pages: dict[Path, Path]):
        self.src, self.repo, self.forge, self.pages = src, repo, forge, pages

    def target(self, link: str, readme: Path, page: Path) -> str:
        if re.match(r"^[a-z][a-z0-9+.-]*:", link, re.I) or link.startswith(("#", "/")):
            return link
        path, hash_, fragment = link.partition("#")
        resolved = Path(os.path.normpath(readme.parent / path))
        page_dir = page.parent
        if resolved in self.pages:
            new = Path(os.path.relpath(self.pages[resolved], page_dir)).as_posix()
        elif resolved.is_relative_to(self.src):
            new = Path(os.path.relpath(resolved, page_dir)).as_posix()
        elif self.forge and resolved.is_relative_to(self.repo):
            kind = "tree" if resolved.is_dir() else "blob"
            new = f"{self.forge}/{kind}/{BRANCH}/{resolved.relative_to(self.repo).as_posix()}"
        else:
            return link
        return new + hash_ + fragment

    def line(self, text: str, readme: Path, page: Path) -> str:
        ref = REFERENCE.match(text)
        if ref:
            return ref.group(1) + self.target(ref.group(2), readme, page) + ref.group(3)
        # Links inside `code` stay as written: hide the code spans, rewrite, put them back.
        spans = [m.group(0) for m in CODE_SPAN.finditer(text)]
        masked = CODE_SPAN.sub("\0", text)
        masked = self.inline(masked, readme, page)
        return re.sub("\0", lambda _: spans.pop(0), masked)

    def inline(self, text: str, readme: Path, page: Path) -> str:
        return INLINE_LINK.sub(
            lambda m: m.group(1) + m.group(2) + self.target(m.group(3), readme, page) + m.group(4),
            text,
        )

    def text(self, markdown: str, readme: Path, page: Path) -> str:
        out, fenced = [], False
        for text in markdown.split("\n"):
            if FENCE.match(text):
                fenced = not fenced
            out.append(text if fenced or FENCE.match(text) else self.line(text, readme, page))
        return "\n".join(out)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "supports":
        return 0
    context, book = json.load(sys.stdin)
    src = Path(context["root"]).resolve() / context["config"]["book"].get("src", "src")
    repo = Path(context["root"]).resolve().parent
    html = context["config"].get("output", {}).get("html", {})
    forge = (html.get("git-repository-url") or "").rstrip("/") or None
    found = {}
    for chapter in chapters(book.get("items", book.get("sections", []))):
        lab = lab_readme(chapter, src, repo)
        if lab:
            found[id(chapter)] = (chapter, *lab)
    pages = {readme: src / chapter["source_path"] for chapter, _, readme in found.values()}
    rewriter = Rewriter(src, repo, forge, pages)
    for chapter, directive, readme in found.values():
        page = src / chapter["source_path"]
        text = rewriter.text(readme.read_text(encoding="utf-8"), readme, page)
        chapter["content"] = chapter["content"].replace(directive, text)
    json.dump(book, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
