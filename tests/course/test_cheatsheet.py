"""CHEATSHEET.md lists every command the README and the labs tell a reader to run.

A command is read from the shell blocks of README.md, labs/README.md and each lab's
README.md. What the cheat sheet must show depends on the command:
- `pytest labs/<phase>/<lab> ...`: the lab's own `pytest labs/<phase>/<lab>` line, and every
  `--` option (`--impl=ref`, `--require-gpu`), which the cheat sheet explains once (`-k` and
  a step's `-m stepN` are explained once too, not for every lab);
- `python -m <module> [<subcommand>] ...` and `python3 scripts/<script> <action>`: the
  command up to its subcommand, and every `--flag` it passes;
- `make <target>`: the target.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHEATSHEET = (ROOT / "CHEATSHEET.md").read_text(encoding="utf-8")
SOURCES = [
    ROOT / "README.md",
    ROOT / "labs" / "README.md",
    *sorted((ROOT / "labs").glob("phase-*/lab-*/README.md")),
]
SHELL_BLOCK = re.compile(r"```(?:bash|sh|shell|console)\n(.*?)```", re.S)


def commands_in(path: Path) -> list[str]:
    found = []
    for block in SHELL_BLOCK.findall(path.read_text(encoding="utf-8")):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip().removeprefix("$ ")
            if line and not line.startswith("#"):
                found.append(line)
    return found


def required_mentions(command: str) -> list[str]:
    words = shlex.split(command)
    words[0] = words[0].removeprefix(".venv/bin/")
    if words[0] == "python3" and words[1:2] == ["-m"]:
        words[0] = "python"
    if words[0] == "pytest":
        targets = [w for w in words[1:] if not w.startswith("-")]
        options = [w for w in words[1:] if w.startswith("--")]
        return [f"pytest {t.rstrip('/')}" for t in targets[:1]] + options
    if words[0] in ("python", "python3") and words[1] == "-m":
        # `python -m mini_vllm <subcommand>` (and `bench
        # <kind>`) names a command; other modules are one.
        name_length = 3
        if words[2] == "mini_vllm" and len(words) > 3 and not words[3].startswith("-"):
            name_length = 5 if words[3] == "bench" and len(words) > 4 else 4
        return [" ".join(words[:name_length])] + [
            w.split("=")[0] for w in words[name_length:] if w.startswith("--")
        ]
    if words[0] in ("python", "python3"):
        return [" ".join(words[:3])] + [w.split("=")[0] for w in words[3:] if w.startswith("--")]
    if words[0] == "make":
        return [" ".join(words[:2])]
    return [words[0]]


CASES = [(path, command) for path in SOURCES for command in commands_in(path)]


def test_the_readmes_have_commands_to_check():
    assert len(CASES) > 20
    assert "-m stepN" in CHEATSHEET
    assert any(path.name == "README.md" and path.parent == ROOT for path, _ in CASES)


@pytest.mark.parametrize(
    "path, command", CASES, ids=[f"{p.parent.name}:{c[:60]}" for p, c in CASES]
)
def test_cheatsheet_lists_the_command(path: Path, command: str):
    missing = [m for m in required_mentions(command) if m not in CHEATSHEET]
    assert not missing, f"{path.relative_to(ROOT)} uses `{command}`; CHEATSHEET.md lacks {missing}"


def test_cheatsheet_lists_every_lab():
    labs = sorted(f"{p.parent.name}/{p.name}" for p in (ROOT / "labs").glob("phase-*/lab-*"))
    assert len(labs) >= 12
    for lab in labs:
        assert f"pytest labs/{lab}" in CHEATSHEET, f"CHEATSHEET.md has no command for {lab}"
