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
  Inductor per piece, PIECEWISE CUDA-graph wrappers).
The token dimension of the tensor arguments is marked dynamic before the one trace,
so one compiled graph serves every batch size.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import torch

from mini_vllm.compilation.attention_op import use_attention_op
from mini_vllm.compilation.piecewise_backend import CompileStats, inductor_compile
from mini_vllm.config.compilation import CompilationMode
from mini_vllm.layers.custom_op import use_custom_ops

__all__ = ["TorchCompileWrapper", "support_torch_compile"]


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
        self._original_code = type(model).forward.__code__
        self._compiled_code = None
        self._capturing_code = False
        # Removed once the compiled code is captured: a hook left registered would keep
        # this wrapper, and through it the model and its KV cache, alive for ever.
        self._hook = torch._dynamo.convert_frame.register_bytecode_hook(self._bytecode_hook)
        # One entry per compiled model in Dynamo's cache of this code object; tests and
        # benchmarks build many engines in one process.
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        self.compiled = torch.compile(
            model.forward, backend=self.backend, fullgraph=True, dynamic=False
        )
        use_attention_op(model)
        model.__dict__["_compile_wrapper"] = self  # the decorated __call__ routes here

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
        if self.trace_once and self._compiled_code is not None:
            with self._dispatch_to_compiled_code():
                return self.model.forward(*args, **kwargs)
        if self._compiled_code is None:
            self._mark_dynamic(args, kwargs)
            self._capturing_code = True
            # A backend with fusion passes needs the layers' custom ops in the trace.
            try:
                with use_custom_ops(getattr(self.backend, "uses_custom_ops", False)):
                    return self.compiled(*args, **kwargs)
            finally:
                self._capturing_code = False
                if self._compiled_code is not None:
                    self._hook.remove()
        return self.compiled(*args, **kwargs)

    # ANCHOR_END: trace_once

    def _mark_dynamic(self, args: tuple, kwargs: dict) -> None:
        import inspect

        bound = inspect.signature(type(self.model).forward).bind(self.model, *args, **kwargs)
        for name, dim in type(self.model)._dynamic_arg_dims.items():
            value = bound.arguments.get(name)
            if isinstance(value, torch.Tensor):
                torch._dynamo.mark_dynamic(value, dim)

    @property
    def num_recompiles(self) -> int:
        return max(0, self.stats.dynamo_graphs - 1)

    @staticmethod
    def detach(model: torch.nn.Module) -> None:
        """Make `model` run as written again (an engine without compilation may reuse a
        model that an earlier engine compiled: benchmarks share one model between modes)."""
        wrapper = model.__dict__.pop("_compile_wrapper", None)
        if wrapper is not None:
            wrapper._hook.remove()
        use_attention_op(model, enabled=False)


# ANCHOR_END: compile_wrapper
