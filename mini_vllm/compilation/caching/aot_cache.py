"""The compiled model saved whole, so that a restart loads it instead of tracing again.

vLLM counterpart, at the pinned commit: vllm/compilation/caching.py
(`VllmSerializableFunction`, which torch's AOT compile asks to serialise the backend's
result, and `StandaloneCompiledArtifacts`, the compiled pieces kept once per distinct
content) and vllm/compilation/decorators.py (`_try_load_aot_compiled_fn`,
`save_aot_compiled_function`, `_verify_source_unchanged`), used when
VLLM_USE_AOT_COMPILE is on (its default from torch 2.10).

Without it, every start pays for Dynamo tracing the model again (seconds for a 30-layer
model) and for the backend running every piece on fake tensors to look its compiled code
up in Inductor's cache, even when nothing changed. With it, the first start compiles
through `torch.compile(...).aot_compile(...)`: Dynamo traces once, the piecewise backend
compiles each piece with Inductor's standalone compile and returns a
`CompiledSplitModel`, which can write itself out. Torch saves that together with the
bytecode Dynamo produced; a later start reads the file, checks that the source files
Dynamo traced are unchanged, and calls the saved bytecode directly: no trace, no fake
run, one deserialisation per distinct piece (the middle layers compile to the same code).

The file is found by a key over what the file cannot check itself (model shape, dtype,
compilation mode, fusion, device, torch version, and mini_vllm's compiler sources:
fusion passes and Inductor settings run in the backend, not in the traced code) and is
verified at load against the traced sources it names. A file that cannot be read, or
whose sources changed, is compiled again and replaced. `MINI_VLLM_COMPILE_CACHE=0`
turns saving and loading off.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import os
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mini_vllm import compat, envs

__all__ = [
    "CompiledSplitModel",
    "aot_compile_supported",
    "compiler_sources_digest",
    "load_compiled_model",
    "save_compiled_model",
]

logger = logging.getLogger(__name__)


def aot_compile_supported() -> bool:
    """Torch can save a compiled function with a custom backend (torch 2.10 on: see
    mini_vllm/compat.py), and the user allows it."""
    return envs.MINI_VLLM_COMPILE_CACHE and compat.aot_compile_missing() is None


@functools.cache  # read once a process: every engine's start asks for it
def compiler_sources_digest() -> str:
    """A hash of mini_vllm's compiler code (mini_vllm/compilation/, its passes included):
    what changes the artifact without being traced."""
    digest = hashlib.sha256()
    compilation = Path(__file__).resolve().parent.parent
    for path in sorted(compilation.rglob("*.py")):
        digest.update(str(path.relative_to(compilation)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _plain_graph_module(module: torch.fx.GraphModule, children: dict[str, Any]) -> Any:
    """A copy of `module` that pickles as its code: the given children, no node metadata."""
    plain = torch.fx.GraphModule(children, module.graph, class_name=type(module).__name__)
    plain.meta = {}
    return plain


# Without AOT compile (torch before 2.10) the class is never saved: any base will do.
_Base: type = compat.SerializableCallable or object


# ANCHOR: compiled_split_model
class CompiledSplitModel(_Base):
    """What the piecewise backend returns under AOT compile: the split module and, for each
    compiled piece, its standalone Inductor artifact as bytes.

    At run time it is the split module. To save, the split module is written as its code
    with placeholders where the compiled pieces go, and the artifacts are kept once per
    distinct content. After a load the placeholders are still there: the engine installs
    the loaded pieces (in their CUDA-graph wrappers) with `PiecewiseCompileBackend.adopt`.
    """

    def __init__(
        self,
        split: torch.fx.GraphModule,
        dynamo_graph: torch.fx.GraphModule,
        artifacts: dict[str, bytes],
        returns_tuple: dict[str, bool],
        splitting: dict[str, bool],
        fused_pairs: int,
    ) -> None:
        self.split = split
        self.dynamo_graph = dynamo_graph  # the traced graph (after fusion), for diagnostics
        self.artifacts = artifacts  # compiled piece name -> serialised artifact
        self.returns_tuple = returns_tuple  # compiled piece name -> its graph returns a tuple
        self.splitting = splitting  # piece name -> it is an attention call (run eagerly)
        self.fused_pairs = fused_pairs
        self.loaded: dict[str, Callable[..., Any]] = {}  # set by a load

    def __call__(self, *args: Any) -> Any:
        return self.split(*args)

    @classmethod
    def serialize_compile_artifacts(cls, fn: CompiledSplitModel) -> bytes:
        children = {
            name: fn.split.get_submodule(name) if is_splitting else torch.nn.Module()
            for name, is_splitting in fn.splitting.items()
        }
        store: dict[str, bytes] = {}  # content hash -> bytes: identical layers stored once
        names: dict[str, str] = {}
        for name, blob in fn.artifacts.items():
            key = hashlib.sha256(blob).hexdigest()
            store.setdefault(key, blob)
            names[name] = key
        state = {
            "split": _plain_graph_module(fn.split, children),
            "dynamo_graph": _plain_graph_module(fn.dynamo_graph, fn.dynamo_graph._modules),
            "store": store,
            "names": names,
            "returns_tuple": fn.returns_tuple,
            "splitting": fn.splitting,
            "fused_pairs": fn.fused_pairs,
        }
        return pickle.dumps(state)

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> CompiledSplitModel:
        state = pickle.loads(data)
        loaded_by_key = {
            key: compat.load_standalone_artifact(pickle.loads(blob))
            for key, blob in state["store"].items()
        }
        fn = cls(
            state["split"],
            state["dynamo_graph"],
            {name: state["store"][key] for name, key in state["names"].items()},
            state["returns_tuple"],
            state["splitting"],
            state["fused_pairs"],
        )
        fn.loaded = {
            name: piece_callable(loaded_by_key[key], state["returns_tuple"][name])
            for name, key in state["names"].items()
        }
        return fn


# ANCHOR_END: compiled_split_model


def piece_callable(artifact: Any, returns_tuple: bool) -> Callable[..., Any]:
    """A loaded standalone artifact returns its outputs as a sequence; a piece whose graph
    returns one value is called for that value (vLLM: `compiled_graph_wrapper` in
    `InductorStandaloneAdaptor.load`)."""
    if returns_tuple:
        return artifact

    def single_output(*args: Any) -> Any:
        return artifact(*args)[0]

    return single_output


def _sources_changed(fn: Any) -> list[str]:
    """The modules Dynamo traced whose source differs from what was compiled."""
    changed = []
    for name, content in compat.aot_traced_sources(fn):
        module = sys.modules.get(name)
        try:
            current = inspect.getsource(module) if module is not None else None
        except (OSError, TypeError):
            current = None
        if current != content:
            changed.append(name)
    return sorted(set(changed))


# ANCHOR: load_compiled_model
def load_compiled_model(
    path: Path, f_globals: dict[str, Any]
) -> tuple[Any, CompiledSplitModel] | None:
    """The saved compiled model at `path`, ready to call, and the `CompiledSplitModel` the
    backend returned when it was compiled (its pieces, for the engine to install); None
    when there is none to use."""
    if not path.exists():
        return None
    try:
        with open(path, "rb") as file:
            fn = torch.compiler.load_compiled_function(file, f_globals=f_globals)
        changed = _sources_changed(fn)
        if changed:
            logger.info("compiling again: %s changed since %s was saved", changed, path)
            return None
        saved = compat.aot_backend_result(fn)
    except Exception as error:  # a file from another torch, truncated, or stale
        logger.warning(
            "could not load the compiled model from %s (%s: %s); compiling it again",
            path,
            type(error).__name__,
            error,
        )
        return None
    fn.disable_guard_check()  # everything that varies between steps is a tensor (trace once)
    return fn, saved


# ANCHOR_END: load_compiled_model


def save_compiled_model(fn: Any, path: Path) -> bool:
    """Write the AOT-compiled function to `path` atomically; a failure only costs the cache."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(compat.aot_serialized_bytes(fn))
        os.replace(tmp, path)
        return True
    except Exception as error:
        logger.warning(
            "could not save the compiled model to %s (%s: %s); the next start compiles again",
            path,
            type(error).__name__,
            error,
        )
        return False
