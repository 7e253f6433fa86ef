"""One layer, several implementations, and the one place that decides which of them runs.

vLLM counterpart: vllm/model_executor/custom_op.py (`CustomOp`: a layer writes
`forward_native` and, where a faster kernel exists, `forward_cuda`, `forward_cpu`, ...;
`dispatch_forward` picks one when the layer is built, from the platform and from whether
the compile configuration enables custom ops).

Here one model object runs in several ways in the same process (eagerly, traced by
torch.fx for piecewise graphs, compiled by Dynamo and Inductor, compiled for the fusion
passes), so the choice is made on every call, by `CustomOp.forward`, in this order:

1. Dynamo traces for the fusion passes (inside `use_custom_ops`): `forward_custom_op`,
   one `mini_vllm::` op a pass can recognise and fold into its neighbour
   (mini_vllm/compilation/fusion.py; vLLM's passes match its `torch.ops._C` ops).
2. Dynamo traces otherwise: `forward_compiled`, by default `forward_native`: plain torch
   ops, which Inductor fuses itself better than any eager shortcut.
3. torch.fx traces (the piecewise split of an uncompiled model): `forward_native`. FX
   records whatever runs, op by op, so an eager shortcut would be baked into the graph.
4. Eagerly: `forward_cuda` for a CUDA input, `forward_cpu` for a CPU one; each is
   `forward_native` unless the layer has something faster.

A layer subclasses `CustomOp`, writes `forward_native`, and overrides only what differs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx._symbolic_trace as _fx_trace
from torch import nn

__all__ = ["CustomOp", "custom_ops_enabled", "use_custom_ops"]

# torch >= 2.6 has a quiet spelling; `is_fx_tracing` logs a warning on every process.
_fx_symbolic_tracing = getattr(_fx_trace, "is_fx_symbolic_tracing", _fx_trace.is_fx_tracing)

_custom_ops = {"enabled": False}


@torch.compiler.assume_constant_result
def _custom_ops_flag() -> bool:
    # Read once while Dynamo traces and baked into the graph: no guard, no recompile.
    return _custom_ops["enabled"]


def custom_ops_enabled() -> bool:
    """True while Dynamo traces for the fusion passes: layers emit their `mini_vllm::` ops."""
    return torch.compiler.is_compiling() and _custom_ops_flag()


@contextlib.contextmanager
def use_custom_ops(enabled: bool = True) -> Iterator[None]:
    """Trace with the layers' `mini_vllm::` ops (the compile wrapper sets it around the
    call that traces, for a backend that runs the fusion passes)."""
    previous = _custom_ops["enabled"]
    _custom_ops["enabled"] = enabled
    try:
        yield
    finally:
        _custom_ops["enabled"] = previous


# ANCHOR: custom_op
class CustomOp(nn.Module):
    """Base of the layers with several implementations; `forward` picks one per call."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            if _custom_ops_flag():
                return self.forward_custom_op(*args, **kwargs)
            return self.forward_compiled(*args, **kwargs)
        if _fx_symbolic_tracing():
            return self.forward_native(*args, **kwargs)
        first = args[0]  # every layer's first argument is a tensor
        # (`is_cuda` rather than `device.type`: a third of the cost, on every eager call.)
        if first.is_cuda:
            return self.forward_cuda(*args, **kwargs)
        if first.is_cpu:
            return self.forward_cpu(*args, **kwargs)
        return self.forward_native(*args, **kwargs)

    def forward_native(self, *args: Any, **kwargs: Any) -> Any:
        """Plain torch ops: correct on every device, and what compilers should see."""
        raise NotImplementedError(f"{type(self).__name__} must define forward_native")

    def forward_custom_op(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward_native(*args, **kwargs)

    def forward_compiled(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward_native(*args, **kwargs)

    def forward_cuda(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward_native(*args, **kwargs)

    def forward_cpu(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward_native(*args, **kwargs)


# ANCHOR_END: custom_op
