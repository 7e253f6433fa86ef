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

COMMANDS = {
    "generate": "mini_vllm.cli.generate",
    "simulate": "mini_vllm.cli.simulate",
    "bench": "mini_vllm.cli.bench",
    "doctor": "mini_vllm.cli.doctor",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mini_vllm", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    modules = {}
    for name, module_name in COMMANDS.items():
        try:
            modules[name] = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # a command not built yet
        modules[name].add_parser(subparsers)
    args = parser.parse_args(argv)
    try:
        return int(modules[args.command].run(args) or 0)
    except BrokenPipeError:  # `... | head` closed the pipe: not an error
        sys.stdout = open(os.devnull, "w")
        return 0
    except ValueError as exc:  # UserError is a ValueError; MINI_VLLM_DEBUG=1 shows the traceback
        if envs.MINI_VLLM_DEBUG:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
