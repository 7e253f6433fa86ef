"""`@support_torch_compile`: the one seam between a model class and the compiler.

vLLM counterpart: vllm/compilation/decorators.py (`support_torch_compile`,
`_support_torch_compile`) and vllm/compilation/wrapper.py
(`TorchCompileWrapperWithCustomDispatcher`). The model file only carries the
decorator; everything about compilation lives here.

How a decorated model runs, by CompilationMode:
- NONE: exactly as written (the decorator's `__call__` passes through).
- STOCK_TORCH_COMPILE: `torch.compile(fullgraph=True)` with Inductor. Dynamo checks its
  guards on every call and recompiles when one fails (for instance the first call with
  one token: Dynamo specialises sizes 0 and 1).
- DYNAMO_TRACE_ONCE: the same compile, traced once; afterwards the forward runs the
  bytecode Dynamo produced directly, skipping the guards, so it never recompiles. This
  is safe because everything that changes between steps is a tensor (or its first
  dimension, which is symbolic), never Python state the guards would protect.
- VLLM_COMPILE: trace once, with mini_vllm's piecewise backend (split at attention,
  Inductor per piece, PIECEWISE CUDA-graph wrappers). Where torch can (2.10 on), the
  one trace is an AOT compile whose result is saved, and a later start of the same
  model loads it without tracing (mini_vllm/compilation/caching/aot_cache.py; vLLM's
  VLLM_USE_AOT_COMPILE).
The token dimension of the tensor arguments is marked dynamic before the one trace,
so one compiled graph serves every batch size.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch

from mini_vllm import compat
from mini_vllm.compilation.attention_op import use_attention_op
from mini_vllm.compilation.caching import aot_cache
from mini_vllm.compilation.piecewise_backend import (
    CompileStats,
    PiecewiseCompileBackend,
    inductor_compile,
)
from mini_vllm.config.compilation import CompilationMode
from mini_vllm.layers.custom_op import emit_custom_ops

__all__ = ["TorchCompileWrapper", "support_torch_compile"]

logger = logging.getLogger(__name__)


# ANCHOR: support_torch_compile
def support_torch_compile(cls=None, *, dynamic_arg_dims: dict[str, int] | None = None):
    """Class decorator: instances can be compiled with `TorchCompileWrapper(model, mode, ...)`.

    `dynamic_arg_dims` names the forward arguments whose dimension is symbolic; by
    default dimension 0 of `input_ids` and `positions`, the token dimension.
    """

    def decorate(cls):
        cls._dynamic_arg_dims = dict(dynamic_arg_dims or {"input_ids": 0, "positions": 0})
        module_call = cls.__call__

        def __call__(self, *args, **kwargs):
            wrapper = self.__dict__.get("_compile_wrapper")
            if wrapper is None:
                return module_call(self, *args, **kwargs)
            return wrapper(*args, **kwargs)

        cls.__call__ = __call__
        cls._supports_torch_compile = True
        # Whether calls run compiled code now (the CPU graph backend records those whole).
        cls.runs_compiled_code = property(lambda self: "_compile_wrapper" in self.__dict__)
        return cls

    return decorate(cls) if cls is not None else decorate


# ANCHOR_END: support_torch_compile


class _CountingInductor:
    """The backend of the plain compile levels: Inductor, counting what it compiles.

    An object of its own, not a method of the wrapper: torch keeps every backend it was
    given in a process-wide cache, and a bound method would keep the model (and the KV
    cache bound to it) alive after its engine is gone.
    """

    def __init__(self, stats: CompileStats) -> None:
        self.stats = stats

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        start = time.perf_counter()
        self.stats.dynamo_graphs += 1
        self.stats.graph = gm
        compiled = inductor_compile(gm, example_inputs)
        self.stats.compiled_pieces += 1
        self.stats.seconds += time.perf_counter() - start
        return compiled


# ANCHOR: compile_wrapper
class TorchCompileWrapper:
    """Compiles a decorated model's forward once and dispatches every later call to it.

    Building one attaches it: from then on, calling the model runs the compiled code (and
    its attention layers go through the opaque op), until `detach(model)`.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        mode: CompilationMode,
        backend: Callable | None = None,
        stats: CompileStats | None = None,
    ) -> None:
        if not getattr(type(model), "_supports_torch_compile", False):
            raise TypeError(f"{type(model).__name__} is not decorated with @support_torch_compile")
        if mode is CompilationMode.NONE:
            raise ValueError("CompilationMode.NONE compiles nothing; do not build a wrapper")
        self.model = model
        self.mode = mode
        self.stats = stats if stats is not None else CompileStats()
        self.backend = backend if backend is not None else _CountingInductor(self.stats)
        self.trace_once = mode in (CompilationMode.DYNAMO_TRACE_ONCE, CompilationMode.VLLM_COMPILE)
        # Where the whole compiled model is saved and loaded (VLLM_COMPILE with a torch
        # that has AOT compile); set by compile_and_record before the first call.
        self.artifact_path: Path | None = None
        self.loaded_from_disk = False  # this start loaded the saved compiled model
        self.saved_to_disk = False  # this start compiled the model and saved it
        self._aot_compiled = None
        self._original_code = type(model).forward.__code__
        self._compiled_code = None
        self._capturing_code = False
        self._traced = False  # the first call has traced and compiled the model
        # Removed once the compiled code is captured: a hook left registered would keep
        # this wrapper, and through it the model and its KV cache, alive for ever. Where
        # torch has no such hook (mini_vllm/compat.py), Dynamo checks its guards on every
        # call instead of the code running once traced.
        self._hook = compat.register_bytecode_hook(self._bytecode_hook)
        # One entry per compiled model in Dynamo's cache of this code object; tests and
        # benchmarks build many engines in one process.
        compat.raise_recompile_limit(64)
        # ANCHOR: compile_attach
        self.compiled = torch.compile(
            model.forward, backend=self.backend, fullgraph=True, dynamic=False
        )
        use_attention_op(model)
        model.__dict__["_compile_wrapper"] = self  # the decorated __call__ routes here
        # ANCHOR_END: compile_attach

    # ANCHOR: trace_once
    def _bytecode_hook(self, old_code, new_code) -> None:
        # Dynamo rewrites the forward's bytecode into code that calls the compiled graph;
        # keep it, to run it later without Dynamo's guard checks (trace once).
        if self._capturing_code and old_code is self._original_code:
            self._compiled_code = new_code

    @contextlib.contextmanager
    def _dispatch_to_compiled_code(self):
        forward = type(self.model).forward
        forward.__code__ = self._compiled_code
        try:
            yield
        finally:
            forward.__code__ = self._original_code

    def __call__(self, *args, **kwargs):
        if self._aot_compiled is not None:
            return self._aot_compiled(self.model, *args, **kwargs)
        if self.trace_once and self._compiled_code is not None:
            with self._dispatch_to_compiled_code():
                return self.model.forward(*args, **kwargs)
        if self._traced:  # without the bytecode hook: Dynamo checks its guards each call
            return self.compiled(*args, **kwargs)
        if self._uses_aot_compile():
            self._aot_compiled = self._load_or_aot_compile(args, kwargs)
            if self._aot_compiled is not None:
                return self._aot_compiled(self.model, *args, **kwargs)
        self._mark_dynamic(args, kwargs)
        self._capturing_code = True
        # A backend with fusion passes needs the layers' custom ops in the trace.
        try:
            with emit_custom_ops(getattr(self.backend, "uses_custom_ops", False)):
                result = self.compiled(*args, **kwargs)
        finally:
            self._capturing_code = False
        self._traced = True
        self._remove_hook()
        return result

    # ANCHOR_END: trace_once

    def _uses_aot_compile(self) -> bool:
        return (
            self.artifact_path is not None
            and isinstance(self.backend, PiecewiseCompileBackend)
            and aot_cache.aot_compile_supported()
        )

    # ANCHOR: aot_compile
    def _load_or_aot_compile(self, args: tuple, kwargs: dict):
        """The saved compiled model if there is a usable one, else compile it and save it.

        None when torch cannot AOT-compile this model: the caller then compiles it the
        usual way, and every start traces again.
        """
        forward = type(self.model).forward
        loaded = aot_cache.load_compiled_model(self.artifact_path, forward.__globals__)
        if loaded is not None:
            compiled, saved = loaded
            self.backend.adopt(saved)
            self.loaded_from_disk = True
            self._remove_hook()
            return compiled
        self._mark_dynamic(args, kwargs)
        self.backend.serializable = True
        # torch 2.10/2.11 give `aot_compile` only to a function compiled under this flag.
        # No guards are kept: as with trace once, nothing they would check varies, and a
        # guard on the model would have to save the model's state with the compiled code.
        with compat.aot_compile_context():
            compiler = torch.compile(
                forward,
                backend=self.backend,
                fullgraph=True,
                dynamic=False,
                options={"guard_filter_fn": lambda guards: [False for _ in guards]},
            )
        try:
            with emit_custom_ops(getattr(self.backend, "uses_custom_ops", False)):
                compiled = compiler.aot_compile(((self.model, *args), kwargs))
        except Exception as error:
            logger.warning(
                "torch could not AOT-compile %s (%s: %s); compiling it without saving it",
                type(self.model).__name__,
                type(error).__name__,
                error,
            )
            self.backend.serializable = False
            self.backend.forget_pieces()
            return None
        compiled.disable_guard_check()  # as trace once: nothing the guards check varies
        self.saved_to_disk = aot_cache.save_compiled_model(compiled, self.artifact_path)
        self._remove_hook()
        return compiled

    # ANCHOR_END: aot_compile

    def _mark_dynamic(self, args: tuple, kwargs: dict) -> None:
        import inspect

        bound = inspect.signature(type(self.model).forward).bind(self.model, *args, **kwargs)
        for name, dim in type(self.model)._dynamic_arg_dims.items():
            value = bound.arguments.get(name)
            if isinstance(value, torch.Tensor):
                compat.mark_dynamic(value, dim)

    @property
    def num_recompiles(self) -> int:
        return max(0, self.stats.dynamo_graphs - 1)

    @staticmethod
    def detach(model: torch.nn.Module) -> None:
        """Make `model` run as written again (an engine without compilation may reuse a
        model that an earlier engine compiled: benchmarks share one model between modes)."""
        wrapper = model.__dict__.pop("_compile_wrapper", None)
        if wrapper is not None:
            wrapper._remove_hook()
        use_attention_op(model, enabled=False)

    def _remove_hook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None


# ANCHOR_END: compile_wrapper
