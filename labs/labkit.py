"""Pick the implementation a lab's tests run against.

Every lab's tests start with

    impl = implementation(__file__, starter="cudagraph.py", reference="mini_vllm.cudagraph")

and then use `impl.GraphRunner`, `impl.SimDevice`, ... . With `--impl=student` (the
default) `impl` is the lab's own starter file; with `--impl=ref` it is the reference
module in mini_vllm. The tests are the same file either way, so they can only check
behaviour through the public names both expose.

The meta-test (tests/test_labs_meta.py) points MINI_VLLM_STARTER_DIR at pristine
copies of the starters taken from git, so a student's filled-in starter cannot hide
a test that would pass on the untouched one.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path


def chosen_impl() -> str:
    impl = os.environ.get("MINI_VLLM_IMPL", "student")
    if impl not in ("student", "ref"):
        raise ValueError(f"MINI_VLLM_IMPL must be 'student' or 'ref', not {impl!r}")
    return impl


def lab_dir_of(test_file: str) -> Path:
    path = Path(test_file).resolve().parent
    while not path.name.startswith("lab-"):
        if path.parent == path:
            raise ValueError(f"{test_file} is not inside a labs/lab-* folder")
        path = path.parent
    return path


def load_starter(lab_dir: Path, starter: str) -> types.ModuleType:
    override = os.environ.get("MINI_VLLM_STARTER_DIR")
    path = Path(override) / lab_dir.name / starter if override else lab_dir / starter
    module_name = f"{lab_dir.name.replace('-', '_')}_{Path(starter).stem}_student"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the starter {path}")
    module = importlib.util.module_from_spec(spec)
    # Registered before running it: dataclasses and pickling look modules up by name.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def load_reference(reference: str | list[str]) -> types.ModuleType | types.SimpleNamespace:
    names = [reference] if isinstance(reference, str) else list(reference)
    modules = [importlib.import_module(name) for name in names]
    if len(modules) == 1:
        return modules[0]
    merged: dict[str, object] = {}
    for module in modules:
        merged.update({k: v for k, v in vars(module).items() if not k.startswith("_")})
    return types.SimpleNamespace(**merged)


def implementation(test_file: str, starter: str, reference: str | list[str]):
    """The module the lab's tests exercise: the starter or the mini_vllm reference."""
    if chosen_impl() == "ref":
        return load_reference(reference)
    return load_starter(lab_dir_of(test_file), starter)
