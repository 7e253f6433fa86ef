"""Is a compiler tracing the model right now? Layers ask before taking a fast path.

vLLM counterpart: vllm/model_executor/custom_op.py (`CustomOp.dispatch_forward`) makes
the same choice once per layer, at construction: when Inductor compiles the model,
custom ops are off by default and the compiler sees `forward_native`. Here one model
object runs both ways (eager and compiled, in the same test session), so the layers
ask at call time instead.

Eager fast paths (a Triton kernel on CUDA, cached views and shortcuts on CPU) are
right for eager runs, but Dynamo/Inductor should see plain torch ops, which it fuses
itself, and torch.fx records whatever runs, op by op, so it would bake the fast path
into the graph. The CPU split matrix product is the one path that Dynamo does get
(it is plain torch ops, and Inductor keeps it); torch.fx alone gets `F.linear`, so
its graph does not depend on the thread count (`fx_symbolic_tracing`).

The exception is compilation with fusion passes (mini_vllm/compilation/fusion.py):
a pass can only fold a norm or an activation into the product after it if each is
one recognisable node, so while such a compile traces (`use_custom_ops`), RMSNorm,
SiluAndMul, RoPE and the products become the `mini_vllm::` custom ops instead (vLLM's
passes were first written against its custom ops the same way; its newer matchers also
recognise the torch spelling).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.fx._symbolic_trace as _fx_trace

__all__ = ["compiler_is_tracing", "custom_ops_enabled", "fx_symbolic_tracing", "use_custom_ops"]

_custom_ops = {"enabled": False}

# torch >= 2.6 has a quiet spelling; `is_fx_tracing` logs a warning on every process.
fx_symbolic_tracing = getattr(_fx_trace, "is_fx_symbolic_tracing", _fx_trace.is_fx_tracing)


def compiler_is_tracing() -> bool:
    return torch.compiler.is_compiling() or fx_symbolic_tracing()


@torch.compiler.assume_constant_result
def _custom_ops_flag() -> bool:
    # Read once while Dynamo traces and baked into the graph: no guard, no recompile.
    return _custom_ops["enabled"]


def custom_ops_enabled() -> bool:
    """True while a compiler traces for the fusion passes: layers emit `mini_vllm::` ops."""
    return torch.compiler.is_compiling() and _custom_ops_flag()


@contextlib.contextmanager
def use_custom_ops(enabled: bool = True) -> Iterator[None]:
    """Trace with the `mini_vllm::` ops (set around the compiling call)."""
    previous = _custom_ops["enabled"]
    _custom_ops["enabled"] = enabled
    try:
        yield
    finally:
        _custom_ops["enabled"] = previous
