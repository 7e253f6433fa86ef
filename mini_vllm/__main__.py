"""Command line: `python -m mini_vllm <command> ...`.

Each command lives in its own module under mini_vllm/cli/ with two functions,
`add_parser(subparsers)` and `run(args) -> int`, and is imported only when used so
that `--help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from mini_vllm import envs
from mini_vllm.errors import UserError

COMMANDS = {
    "generate": "mini_vllm.cli.generate",
    "serve": "mini_vllm.cli.serve",
    "simulate": "mini_vllm.cli.simulate",
    "bench": "mini_vllm.cli.bench",
    "doctor": "mini_vllm.cli.doctor",
    "grade": "mini_vllm.cli.grade",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mini_vllm", description=__doc__.splitlines()[0]
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    modules = {}
    for name, module_name in COMMANDS.items():
        modules[name] = importlib.import_module(module_name)
        modules[name].add_parser(subparsers)
    args = parser.parse_args(argv)
    try:
        return int(modules[args.command].run(args) or 0)
    except BrokenPipeError:  # `... | head` closed the pipe: not an error
        sys.stdout = open(os.devnull, "w")
        return 0
    except UserError as exc:
        # A mistake in what was asked: one line (MINI_VLLM_DEBUG=1 adds the traceback).
        # Any other exception is a bug, not the user's mistake, and keeps its traceback.
        if envs.MINI_VLLM_DEBUG:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
