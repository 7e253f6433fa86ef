#!/usr/bin/env python3
"""mdBook preprocessor: included code starts at the left margin.

A page shows the engine's code only by including it (`{{#include file.py:anchor}}`), and an
anchor around a method includes the method as it stands in its class, four spaces in.
mdBook's include keeps that indentation, so every included method would sit one level to
the right. This preprocessor runs after mdBook's `links` (which does the includes) and
removes, from each fenced Python block, the indentation all its lines share beyond the
fence's own (a block inside a list item keeps the list's indentation). The book's Python
blocks hold only includes (tests/course/test_book.py checks it), so nothing written by
hand on a page is touched. Configured in book.toml as `[preprocessor.dedent-code]`.
"""

from __future__ import annotations

import json
import re
import sys

FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*(\w*)")


def chapters(items):
    for item in items:
        chapter = item.get("Chapter") if isinstance(item, dict) else None
        if chapter:
            yield chapter
            yield from chapters(chapter.get("sub_items", []))


def common_indent(lines: list[str]) -> int:
    widths = [len(line) - len(line.lstrip(" ")) for line in lines if line.strip()]
    return min(widths, default=0)


def dedent_python_blocks(markdown: str) -> str:
    """Each ```python block with the indentation its lines share beyond the fence's removed."""
    out: list[str] = []
    block: list[str] | None = None
    fence = ""
    margin = 0
    for line in markdown.split("\n"):
        match = FENCE.match(line)
        if block is None:
            if match and match.group(3) == "python":
                block, fence, margin = [], match.group(2), len(match.group(1))
            out.append(line)
            continue
        if match and match.group(2).startswith(fence) and not match.group(3):
            extra = common_indent(block) - margin
            if extra > 0:
                block = [text[extra:] if text.strip() else text for text in block]
            out += block + [line]
            block = None
            continue
        block.append(line)
    if block is not None:  # an unclosed fence: leave it as it was
        out += block
    return "\n".join(out)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "supports":
        return 0
    _context, book = json.load(sys.stdin)
    for chapter in chapters(book.get("items", book.get("sections", []))):
        chapter["content"] = dedent_python_blocks(chapter["content"])
    json.dump(book, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
