"""Planted mistakes: the reference with one student error in it, which a lab's tests must catch.

A `Mutant` names one mistake students make in a lab, as a textual change to one module
of `mini_vllm`: `old` must occur exactly once in that module's source and becomes `new`.
Each lab's mutants live in `tests/lab_mutants/<phase>_<lab>.py` (instructors read them
as the lab's common mistakes); `tests/test_lab_mutants.py` runs the lab's tests against
the reference with each mutant applied and fails if any mutant passes them all.

Applied on the fly, never on disk: run pytest with `-p mutation` and the environment
variable MINI_VLLM_MUTANT holding a mutant as JSON (`Mutant.to_env()`). The plugin puts
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

ENV_VAR = "MINI_VLLM_MUTANT"


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
        spec = importlib.util.find_spec(self.module)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            raise ValueError(f"mutant {self.name!r}: no Python source for module {self.module}")
        return spec.origin

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
    def __init__(self, mutant: Mutant):
        self.mutant = mutant
        self.source = mutant.mutated_source()
        self.path = mutant.source_path()

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.mutant.module:
            return None
        loader = _MutatedLoader(fullname, self.path, self.source)
        return importlib.util.spec_from_file_location(fullname, self.path, loader=loader)


def pytest_configure(config) -> None:
    text = os.environ.get(ENV_VAR)
    if not text:
        return
    mutant = Mutant.from_env(text)
    if mutant.module in sys.modules:
        raise RuntimeError(f"{mutant.module} was imported before the mutant could be applied")
    sys.meta_path.insert(0, _MutantFinder(mutant))
