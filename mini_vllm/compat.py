"""Every private torch and Triton name mini_vllm uses, looked up in one place, and the
versions they were checked on.

vLLM counterpart: vllm/utils/torch_utils.py (`is_torch_equal_or_newer`, with which vLLM
gates what a torch release can do) and vllm/env_override.py, where vLLM patches the torch
internals it depends on. vLLM pins one torch per release; mini_vllm accepts a range, so
it checks instead.

A private name (a module or attribute whose name starts with `_`) may change or vanish in
any release. Each one the package needs is looked up here, by a function that says what
it is for; the rest of the package calls these functions and never spells a private name.
When a name is missing, the function returns None (or False) and the fast path that needed
it is off; `fast_paths()` lists every fast path with why it is on or off, `fast_paths_line()`
says it in one line, which an engine logs when it starts (a warning when a path is off
because this torch or Triton lacks what it needs) and `python -m mini_vllm doctor` prints.

Checked on (`VERIFIED_TORCH`, `VERIFIED_TRITON`): torch 2.13, the CPU build the test suite
runs on, and torch 2.11 with Triton 3.6, where the GPU suite ran on an H100. A torch
outside that list runs, with whatever of these names it has. A Triton outside it fails
closed: its compiled kernels are launched through Triton's own front end, never through
the C launcher directly (mini_vllm/kernels/launch.py), whose calling convention is not
part of Triton's API and changes between releases.

One use stays in place: the Triton kernels call `tl.extra.cuda.gdc_wait` and
`gdc_launch_dependents` inside code that Triton compiles only when their `PDL` argument is
true, which `pdl_available` allows only when this Triton has both.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "VERIFIED_TORCH",
    "VERIFIED_TRITON",
    "FastPath",
    "fast_paths",
    "fast_paths_line",
    "log_fast_paths",
]

logger = logging.getLogger(__name__)

VERIFIED_TORCH = ("2.11", "2.13")
VERIFIED_TRITON = ("3.6",)


def release(version: str) -> str:
    """'2.13.0+cpu' -> '2.13'."""
    return ".".join(version.split("+")[0].split(".")[:2])


def torch_verified() -> bool:
    return release(torch.__version__) in VERIFIED_TORCH


def _attribute(path: str) -> Any:
    """The object at a dotted `path` ('torch._dynamo.config.patch'), or None if any part
    of it is missing in this installation."""
    module_path, _, rest = path.partition(".")
    try:
        target: Any = importlib.import_module(module_path)
        parts = rest.split(".") if rest else []
        for index, part in enumerate(parts):
            if hasattr(target, part):
                target = getattr(target, part)
            else:  # a submodule not imported yet
                name = ".".join([module_path, *parts[: index + 1]])
                target = importlib.import_module(name)
        return target
    except (ImportError, AttributeError):
        return None


# --- Triton ------------------------------------------------------------------------------


@functools.cache
def triton() -> Any:
    """The `triton` package, or None where it is not installed."""
    try:
        return importlib.import_module("triton")  # by name: the kernels alone import it
    except ImportError:
        return None


def triton_verified() -> bool:
    module = triton()
    return module is not None and release(module.__version__) in VERIFIED_TRITON


def autotune_accepts(parameter: str) -> bool:
    """Whether this Triton's `triton.autotune` takes `parameter` ("do_bench" for our own
    timing of the tiles, "cache_results" for keeping the picks on disk)."""
    module = triton()
    return module is not None and parameter in inspect.signature(module.autotune).parameters


def autotuned_config(kernel: Any) -> Any:
    """The tile (a `triton.Config`) an autotuned kernel picked at its last tuning."""
    return kernel.best_config


@functools.cache
def pdl_available() -> bool:
    """This Triton can compile programmatic dependent launch (`gdc_wait` and
    `gdc_launch_dependents` in `triton.language.extra.cuda`)."""
    cuda = _attribute("triton.language.extra.cuda")
    return cuda is not None and all(
        hasattr(cuda, name) for name in ("gdc_wait", "gdc_launch_dependents")
    )


@dataclass(frozen=True)
class LaunchParts:
    """What a compiled Triton kernel is launched with, past Triton's front end: its
    launcher `run`, the CUDA function, the packed metadata, and, where calling it is safe,
    the C function under `run` (`bare`) with its cooperative-grid and PDL flags."""

    run: Callable[..., None]
    function: Any
    packed_metadata: Any
    bare: Callable[..., None] | None
    cooperative: bool
    pdl: bool


def launch_parts(compiled: Any) -> LaunchParts | None:
    """The parts of `compiled` (what `kernel[grid](...)` returned) that launch it directly,
    or None: on a Triton outside VERIFIED_TRITON (fail closed) or where they are missing."""
    if not triton_verified():
        return None
    names = ("run", "function", "packed_metadata")
    if not all(hasattr(compiled, name) for name in names):
        return None
    run = compiled.run
    # The C function under the launcher, for a kernel that needs no scratch memory (the
    # Python wrapper around it only allocates that).
    bare = None
    if all(hasattr(run, n) for n in ("launch", "launch_cooperative_grid", "launch_pdl")) and not (
        getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1)
    ):
        bare = run.launch
    return LaunchParts(
        run,
        compiled.function,
        compiled.packed_metadata,
        bare,
        bool(getattr(run, "launch_cooperative_grid", False)),
        bool(getattr(run, "launch_pdl", False)),
    )


def raw_stream_getters() -> tuple[Callable[[int], int], Callable[[], int]]:
    """(the current CUDA stream of a device as an integer handle, the current device's
    index): read without torch.cuda's Python layer, which costs microseconds a call, where
    this torch allows it."""
    stream = _attribute("torch._C._cuda_getCurrentRawStream")
    device = _attribute("torch._C._cuda_getDevice")
    if stream is not None and device is not None:
        return stream, device
    return (
        lambda index: torch.cuda.current_stream(index).cuda_stream,
        torch.cuda.current_device,
    )


# --- Dynamo --------------------------------------------------------------------------------


def register_bytecode_hook(hook: Callable[[Any, Any], None]) -> Any:
    """Register `hook(old_code, new_code)`, called when Dynamo rewrites a function's
    bytecode; returns a handle with `remove()`, or None where this torch has no such hook
    (then compiled code cannot be run past Dynamo's guards: no "trace once")."""
    register = _attribute("torch._dynamo.convert_frame.register_bytecode_hook")
    return register(hook) if register is not None else None


def raise_recompile_limit(limit: int) -> None:
    """Let Dynamo keep at least `limit` compiled entries per code object (tests and
    benchmarks build many engines around one model class in one process)."""
    config = _attribute("torch._dynamo.config")
    for name in ("cache_size_limit", "recompile_limit"):
        if config is not None and hasattr(config, name):
            setattr(config, name, max(getattr(config, name), limit))


def mark_dynamic(tensor: torch.Tensor, dim: int) -> None:
    """Trace `dim` of `tensor` as a symbol, so one graph serves every size."""
    torch._dynamo.mark_dynamic(tensor, dim)


def dynamo_explain(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`torch._dynamo.explain(fn)`: call the result with the arguments to trace and report."""
    return torch._dynamo.explain(fn)


def aot_compile_context() -> contextlib.AbstractContextManager:
    """The setting under which torch 2.10 and 2.11 give a compiled function `aot_compile`."""
    config = _attribute("torch._dynamo.config")
    if config is not None and hasattr(config, "enable_aot_compile"):
        return config.patch(enable_aot_compile=True)
    return contextlib.nullcontext()


# --- saving a compiled model (AOT compile) -----------------------------------------------------

SerializableCallable: type | None = _attribute(
    "torch._dynamo.aot_compile_types.SerializableCallable"
)


def aot_compile_missing() -> str | None:
    """What this torch lacks to save and load a model compiled with a custom backend, or
    None when it has everything (torch 2.10 on)."""
    needed = {
        "torch._dynamo.aot_compile_types.SerializableCallable": SerializableCallable,
        "torch.compiler.load_compiled_function": _attribute(
            "torch.compiler.load_compiled_function"
        ),
        "torch._dynamo.config.enable_aot_compile": getattr(
            _attribute("torch._dynamo.config"), "enable_aot_compile", None
        ),
    }
    absent = [name for name, value in needed.items() if value is None]
    standalone = _attribute("torch._inductor.standalone_compile")
    if standalone is None or "aot" not in inspect.signature(standalone).parameters:
        absent.append("torch._inductor.standalone_compile(aot=...)")
    return ", ".join(absent) or None


def aot_backend_result(loaded: Any) -> Any:
    """What the compile backend returned, as a loaded AOT-compiled function keeps it (vLLM
    reads it there too); raises AttributeError where this torch keeps it elsewhere."""
    return loaded._artifacts.compiled_fn


def aot_traced_sources(fn: Any) -> list[tuple[str, str]]:
    """(module name, source text) of every module Dynamo traced into an AOT-compiled `fn`."""
    return [(source.module, source.content) for source in fn.source_info().inlined_sources]


def aot_serialized_bytes(fn: Any) -> bytes:
    """An AOT-compiled function as the bytes `torch.compiler.load_compiled_function` reads."""
    return type(fn).serialize(fn).serialized_data


def standalone_compile(gm: torch.fx.GraphModule, example_inputs: list, config_patches: dict):
    """Inductor on one graph, as an artifact that can be saved (`serialize()`) and loaded;
    the graph's symbolic sizes stay symbolic."""
    return torch._inductor.standalone_compile(
        gm,
        example_inputs,
        dynamic_shapes="from_graph",
        options={"config_patches": config_patches},
        aot=True,
    )


def load_standalone_artifact(data: Any) -> Any:
    """The inverse of a standalone artifact's `serialize()`."""
    from torch._inductor.standalone_compile import AOTCompiledArtifact

    return AOTCompiledArtifact.deserialize(data)


# --- Inductor --------------------------------------------------------------------------------


def inductor_compile(gm: torch.fx.GraphModule, example_inputs: list, config_patches: dict):
    """Inductor on one FX graph (what `torch.compile`'s default backend runs)."""
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs, config_patches=config_patches)


def graph_returns_tuple(gm: torch.fx.GraphModule) -> bool:
    from torch._inductor.compile_fx import graph_returns_tuple as returns_tuple

    return returns_tuple(gm)


def inductor_default_cache_dir() -> str:
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return default_cache_dir()


def inductor_caches_missing() -> str | None:
    """The on-disk cache settings this torch lacks, or None."""
    absent = []
    for module, name in (
        ("torch._inductor.config", "fx_graph_cache"),
        ("torch._functorch.config", "enable_autograd_cache"),
    ):
        if not hasattr(_attribute(module), name):
            absent.append(f"{module}.{name}")
    return ", ".join(absent) or None


def enable_inductor_caches() -> None:
    """Keep compiled FX graphs and AOT-autograd results on disk, where this torch can."""
    for module, name in (
        ("torch._inductor.config", "fx_graph_cache"),
        ("torch._functorch.config", "enable_autograd_cache"),
    ):
        config = _attribute(module)
        if config is not None and hasattr(config, name):
            setattr(config, name, True)


# --- fake tensors and the dispatcher --------------------------------------------------------


def fake_tensor_context(example_inputs: list) -> tuple[Any, list]:
    """(a context to run on fake tensors, `example_inputs` as fake tensors of that mode):
    Dynamo's fake mode if the inputs carry one, a new one otherwise, with the Python
    dispatcher on so that meta functions see symbolic sizes."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    mode = detect_fake_mode(example_inputs) or FakeTensorMode()
    fakes = [
        mode.from_tensor(x) if isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor) else x
        for x in example_inputs
    ]
    context = contextlib.ExitStack()
    context.enter_context(mode)
    context.enter_context(enable_python_dispatcher())
    return context, fakes


def dispatch_mode_base() -> type:
    """The base class of a mode that sees every ATen op run under it (`__torch_dispatch__`)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


def tree_flatten(tree: Any) -> tuple[list, Any]:
    from torch.utils._pytree import tree_flatten as flatten

    return flatten(tree)


def tree_map(fn: Callable[..., Any], tree: Any, *rests: Any) -> Any:
    from torch.utils._pytree import tree_map as map_tree

    return map_tree(fn, tree, *rests)


def op_schema(op: Any) -> Any:
    """The schema of an ATen or custom op overload (its arguments' alias information)."""
    return op._schema


def qualified_op_name(target: Any) -> str | None:
    """'namespace::name' of a torch.ops operator (an overload or its packet), else None."""
    name = getattr(target, "_qualified_op_name", None)  # an OpOverloadPacket
    if name is None and isinstance(target, torch._ops.OpOverload):
        name = target._schema.name
    return name


@functools.cache
def op_names_resolve() -> bool:
    """Whether `qualified_op_name` works on this torch (the fusion passes find their ops
    by it): checked on two ATen ops."""
    try:
        return (
            qualified_op_name(torch.ops.aten.add.Tensor) == "aten::add"
            and qualified_op_name(torch.ops.aten.add) == "aten::add"
        )
    except Exception:
        return False


# --- the report ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FastPath:
    """One fast path: whether it is on, and why (what it does, or what stops it)."""

    name: str
    on: bool
    why: str
    # Off because this torch or Triton lacks a name it needs: the one kind of "off" that
    # changed without anyone asking, so the engine warns about it.
    degraded: bool = False


def _pdl_path(cuda: bool) -> FastPath:
    from mini_vllm import envs

    if not cuda or triton() is None:
        return FastPath("PDL", False, "no CUDA device" if not cuda else "Triton is not installed")
    if not envs.MINI_VLLM_PDL:
        return FastPath("PDL", False, "MINI_VLLM_PDL=0")
    if not pdl_available():
        return FastPath("PDL", False, "this Triton has no gdc_wait", degraded=True)
    if torch.cuda.get_device_capability()[0] < 9:
        return FastPath("PDL", False, "the GPU is older than Hopper")
    return FastPath("PDL", True, "kernels overlap the tail of the one before")


def fast_paths(kernels: str | None = None) -> list[FastPath]:
    """Every fast path of this installation, on or off, and why. `kernels`: what the
    kernel table says of mini_vllm's own kernels (None: not asked)."""
    from mini_vllm import envs

    cuda = torch.cuda.is_available()
    module = triton()
    paths = []
    if kernels is not None:
        paths.append(FastPath("own kernels", not kernels.startswith("off"), kernels))
    if module is None or not cuda:
        why = "no CUDA device" if not cuda else "Triton is not installed"
        paths.append(FastPath("Triton kernels", False, why))
        paths.append(FastPath("direct launch", False, why))
    else:
        version = release(module.__version__)
        paths.append(FastPath("Triton kernels", True, f"Triton {module.__version__}"))
        if triton_verified():
            paths.append(FastPath("direct launch", True, f"Triton {version} is verified"))
        else:
            paths.append(
                FastPath(
                    "direct launch",
                    False,
                    f"Triton {version} is not verified ({', '.join(VERIFIED_TRITON)}): "
                    "Triton's own launch path",
                    degraded=True,
                )
            )
    paths.append(_pdl_path(cuda))
    if module is not None and cuda:
        timing = envs.MINI_VLLM_TILE_TIMING
        if not autotune_accepts("do_bench"):
            why = "this Triton's autotune takes no do_bench: Triton's own timing"
            paths.append(FastPath("graph-timed tuning", False, why, degraded=True))
        elif timing != "graph":
            paths.append(FastPath("graph-timed tuning", False, "MINI_VLLM_TILE_TIMING=triton"))
        else:
            paths.append(FastPath("graph-timed tuning", True, "tiles timed as the engine runs"))
        cached = autotune_accepts("cache_results")
        paths.append(
            FastPath(
                "tuning cache",
                cached,
                "picks kept on disk"
                if cached
                else "this Triton's autotune takes no cache_results: tuned again at every start",
                degraded=not cached,
            )
        )
    hook = _attribute("torch._dynamo.convert_frame.register_bytecode_hook") is not None
    paths.append(
        FastPath(
            "trace once",
            hook,
            "compiled code runs past Dynamo's guards"
            if hook
            else "this torch has no register_bytecode_hook: guards checked on every call",
            degraded=not hook,
        )
    )
    missing = aot_compile_missing()
    if missing is not None:
        paths.append(FastPath("compiled-model cache", False, f"this torch lacks {missing}", True))
    elif not envs.MINI_VLLM_COMPILE_CACHE:
        paths.append(FastPath("compiled-model cache", False, "MINI_VLLM_COMPILE_CACHE=0"))
    else:
        paths.append(FastPath("compiled-model cache", True, "a restart loads the compiled model"))
    resolves = op_names_resolve()
    paths.append(
        FastPath(
            "fusion passes",
            resolves,
            "ops found by name" if resolves else "op names do not resolve on this torch",
            degraded=not resolves,
        )
    )
    missing = inductor_caches_missing()
    paths.append(
        FastPath(
            "Inductor caches",
            missing is None,
            "FX graphs and autograd on disk" if missing is None else f"this torch lacks {missing}",
            degraded=missing is not None,
        )
    )
    return paths


def fast_paths_line(kernels: str | None = None) -> str:
    """`fast_paths` in one line: the versions, then what is on, then what is off and why."""
    paths = fast_paths(kernels)
    module = triton()
    versions = f"torch {torch.__version__}" + ("" if torch_verified() else " (not verified)")
    if module is not None:
        versions += f", Triton {module.__version__}" + (
            "" if triton_verified() else " (not verified)"
        )
    on = ", ".join(p.name for p in paths if p.on) or "none"
    off = "; ".join(f"{p.name} ({p.why})" for p in paths if not p.on) or "none"
    return f"{versions}; fast paths on: {on}; off: {off}"


_logged: set[str] = set()


def log_fast_paths(kernels: str | None = None) -> None:
    """Log `fast_paths_line` once a process (again if it changes): a warning when a fast
    path is off because this torch or Triton lacks a name it needs, info otherwise."""
    line = fast_paths_line(kernels)
    if line in _logged:
        return
    _logged.add(line)
    degraded = [p.name for p in fast_paths(kernels) if p.degraded]
    if degraded:
        logger.warning("%s (slower, not wrong: %s)", line, ", ".join(degraded))
    else:
        logger.info(line)
