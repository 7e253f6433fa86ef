"""Pick the implementation a lab's tests run against.

Every lab's tests start with

    impl = implementation(__file__, starter="cudagraph.py", reference="mini_vllm.cudagraph")

and then use `impl.GraphRunner`, `impl.SimDevice`, ... . With `--impl=student` (the
default) `impl` is the lab's own starter file; with `--impl=ref` it is the reference
module in mini_vllm. The tests are the same file either way, so they can only check
behaviour through the public names both expose.

The meta-test (tests/course/test_labs_meta.py) points MINI_VLLM_STARTER_DIR at pristine
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
            raise ValueError(f"{test_file} is not inside a labs/phase-*/lab-* folder")
        path = path.parent
    return path


def starter_path(lab_dir: Path, starter: str) -> Path:
    """The starter file to test: the lab's own, or one from MINI_VLLM_STARTER_DIR.

    That folder is laid out like labs/ (phase-02/lab-01-block-manager/block_manager.py),
    or holds one lab's starter files side by side (a single submission).
    """
    override = os.environ.get("MINI_VLLM_STARTER_DIR")
    if not override:
        return lab_dir / starter
    nested = Path(override) / lab_dir.parent.name / lab_dir.name / starter
    flat = Path(override) / starter
    if nested.exists() or not flat.exists():
        return nested
    return flat


def load_starter(lab_dir: Path, starter: str) -> types.ModuleType:
    path = starter_path(lab_dir, starter)
    module_name = f"{lab_dir.parent.name}_{lab_dir.name}_{Path(starter).stem}_student".replace(
        "-", "_"
    )
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
