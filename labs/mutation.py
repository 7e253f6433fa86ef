"""Planted mistakes and later steps left out: the reference changed on the fly for the lab checks.

A `Mutant` names one mistake students make in a lab, as a textual change to one module
of `mini_vllm`: `old` must occur exactly once in that module's source and becomes `new`.
Each lab's mutants live in `tests/course/lab_checks/<phase>_<lab>.py` (instructors read them
as the lab's common mistakes); `tests/course/test_lab_checks.py` runs the lab's tests against
the reference with each mutant applied and fails if any mutant passes them all.

The same file's `STEPS` says which reference functions each step of the lab asks for;
`Stubs` replaces a set of them with `raise NotImplementedError`, so that the check can
run step k's tests on a reference whose later steps are missing, as a student's would be.

Applied on the fly, never on disk: run pytest with `-p mutation` and the environment
variable MINI_VLLM_MUTANT holding a `Mutant` or `Stubs` as JSON (`to_env()`). The plugin puts
an import hook in front of the normal one, so the named module is compiled from the
changed source the first time anything imports it; bytecode is neither read nor written
for it. If the lab never imports the module, the mutant cannot change anything and the
run passes: the check then reports it as not caught, which is what it is.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ENV_VAR = "MINI_VLLM_MUTANT"


def _source_file(module: str) -> str | None:
    """The file `module` would be loaded from, found without importing it or its packages:
    a package's __init__ often imports its modules, the very one a change is for."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)  # a top-level name is found, not imported
    if spec is None or not rest:
        return spec.origin if spec is not None else None
    for location in spec.submodule_search_locations or []:
        folder = Path(location).joinpath(*rest[:-1])
        for candidate in (folder / f"{rest[-1]}.py", folder / rest[-1] / "__init__.py"):
            if candidate.is_file():
                return str(candidate)
    return None


@dataclass(frozen=True)
class Mutant:
    name: str  # short, used as the test id: "keys not chained"
    mistake: str  # the student's mistake in a sentence, for the instructors' page
    module: str  # the mini_vllm module it changes: "mini_vllm.engine.block_manager"
    old: str  # text that occurs exactly once in that module's source
    new: str  # what it becomes

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls, text: str) -> Mutant:
        return cls(**json.loads(text))

    def source_path(self) -> str:
        origin = _source_file(self.module)
        if origin is None or not origin.endswith(".py"):
            raise ValueError(f"mutant {self.name!r}: no Python source for module {self.module}")
        return origin

    def mutated_source(self) -> str:
        """The module's source with the mistake in it; raises if `old` is not there exactly once."""
        with open(self.source_path(), encoding="utf-8") as f:
            source = f.read()
        count = source.count(self.old)
        if count != 1:
            raise ValueError(
                f"mutant {self.name!r}: its text occurs {count} times in {self.module} "
                "(it must occur exactly once; the reference changed, so update the mutant)"
            )
        return source.replace(self.old, self.new)


@dataclass(frozen=True)
class Stubs:
    """Reference functions ("module:Class.method" or "module:function") whose bodies become
    `raise NotImplementedError`."""

    targets: tuple[str, ...]

    def to_env(self) -> str:
        return json.dumps({"stubs": list(self.targets)})

    def modules(self) -> dict[str, str]:
        """{module: its source with the targets stubbed}."""
        by_module: dict[str, list[str]] = {}
        for target in self.targets:
            module, _, qualname = target.partition(":")
            by_module.setdefault(module, []).append(qualname)
        return {module: _stubbed_source(module, names) for module, names in by_module.items()}


def _stubbed_source(module: str, qualnames: list[str]) -> str:
    import ast

    with open(_source_file(module), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    missing = set(qualnames)

    def visit(body: list, prefix: str) -> None:
        for node in body:
            name = f"{prefix}{getattr(node, 'name', '')}"
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and name in missing:
                message = ast.Constant(f"{name} is left out (a later step)")
                call = ast.Call(ast.Name("NotImplementedError", ast.Load()), [message], [])
                node.body = [ast.Raise(exc=call, cause=None)]
                missing.discard(name)

    visit(tree.body, "")
    if missing:
        raise ValueError(f"no function {sorted(missing)} in {module}: update the lab's STEPS")
    return ast.unparse(ast.fix_missing_locations(tree))


class _MutatedLoader(importlib.machinery.SourceFileLoader):
    def __init__(self, fullname: str, path: str, source: str):
        super().__init__(fullname, path)
        self._source = source.encode("utf-8")

    def get_data(self, path: str) -> bytes:
        if path == self.path:
            return self._source
        raise OSError("no cached bytecode for a mutated module")  # forces compiling the source

    def set_data(self, path: str, data: bytes, *, _mode: int = 0o666) -> None:
        pass  # never write the mutant's bytecode where the reference's would go


class _MutantFinder(importlib.abc.MetaPathFinder):
    def __init__(self, sources: dict[str, str]):
        self.sources = sources  # {module: changed source}

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.sources:
            return None
        origin = importlib.machinery.PathFinder.find_spec(fullname, path).origin
        loader = _MutatedLoader(fullname, origin, self.sources[fullname])
        return importlib.util.spec_from_file_location(fullname, origin, loader=loader)


def changed_sources(text: str) -> dict[str, str]:
    data = json.loads(text)
    if "stubs" in data:
        return Stubs(tuple(data["stubs"])).modules()
    mutant = Mutant(**data)
    return {mutant.module: mutant.mutated_source()}


def pytest_configure(config) -> None:
    text = os.environ.get(ENV_VAR)
    if not text:
        return
    sources = changed_sources(text)
    early = [module for module in sources if module in sys.modules]
    if early:
        raise RuntimeError(f"{early} imported before the change could be applied")
    sys.meta_path.insert(0, _MutantFinder(sources))
