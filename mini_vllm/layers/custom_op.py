"""One layer, several implementations, and the one place that decides which of them runs.

vLLM counterpart: vllm/model_executor/custom_op.py (`CustomOp`: a layer writes
`forward_native` and, where a faster kernel exists, `forward_cuda`, `forward_cpu`, ...;
`dispatch_forward` picks one when the layer is built, from the platform and from whether
the `custom_ops` setting enables the op, `CustomOp.enabled()`).

A layer subclasses `CustomOp`, names its op (`name`, as the `custom_ops` switch knows it),
writes `forward_native`, plain torch that any device runs, and overrides only what
differs. Whether the layer may use the kernels at all is decided when it is built, as in
vLLM (`use_kernels`, from the switch: mini_vllm/_custom_ops.py); the engine sets it again
on every layer of the model it runs (`set_custom_ops`). With the kernels off, every call
is `forward_native`.

With them on, the choice is made on every call, because one model object runs in several
ways in the same process (eagerly, traced by torch.fx for piecewise graphs, compiled by
Dynamo and Inductor, compiled for the fusion passes), in this order:

1. torch.fx traces (its inputs are proxies): `forward_native`. FX records whatever runs,
   op by op, so a kernel call would be baked into the graph. The piecewise split of an
   uncompiled model (mini_vllm/compilation/split.py) does not trace into these layers at
   all: each stays one call in the graph and chooses as below when the piece runs.
2. Dynamo traces for the fusion passes (inside `emit_custom_ops`): `forward_custom_op`,
   one `mini_vllm::` op a pass can recognise and fold into its neighbour
   (mini_vllm/compilation/passes/fusion.py).
3. Dynamo traces otherwise: `forward_compiled`, by default `forward_native`: plain torch
   ops, which Inductor fuses itself better than any eager shortcut.
4. Eagerly: `forward_cuda` for a CUDA input, `forward_cpu` for a CPU one; each is
   `forward_native` unless the layer has something faster.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from torch import nn

from mini_vllm import _custom_ops as ops

__all__ = ["CustomOp", "emit_custom_ops", "emitting_custom_ops", "set_custom_ops"]

_emit = {"enabled": False}


@torch.compiler.assume_constant_result
def _emit_flag() -> bool:
    # Read once while Dynamo traces and baked into the graph: no guard, no recompile.
    return _emit["enabled"]


def emitting_custom_ops() -> bool:
    """True while Dynamo traces for the fusion passes: layers emit their `mini_vllm::` ops."""
    return torch.compiler.is_compiling() and _emit_flag()


@contextlib.contextmanager
def emit_custom_ops(enabled: bool = True) -> Iterator[None]:
    """Trace with the layers' `mini_vllm::` ops (the compile wrapper sets it around the
    call that traces, for a backend that runs the fusion passes)."""
    previous = _emit["enabled"]
    _emit["enabled"] = enabled
    try:
        yield
    finally:
        _emit["enabled"] = previous


# ANCHOR: custom_op
class CustomOp(nn.Module):
    """Base of the layers with several implementations; `forward` picks one per call."""

    name: ClassVar[str] = ""  # the op's name in the `custom_ops` switch

    def __init__(self) -> None:
        super().__init__()
        self.use_kernels = ops.enabled(self.name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        first = args[0]  # every layer's first argument is a tensor
        if not self.use_kernels or isinstance(first, torch.fx.Proxy):
            return self.forward_native(*args, **kwargs)
        if torch.compiler.is_compiling():
            if _emit_flag():
                return self.forward_custom_op(*args, **kwargs)
            return self.forward_compiled(*args, **kwargs)
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


def set_custom_ops(model: nn.Module, chosen: frozenset[str]) -> None:
    """Turn every CustomOp layer of `model` to its kernels or to `forward_native`, as the
    `custom_ops` setting `chosen` says (what an engine does to the model it runs)."""
    for module in model.modules():
        if isinstance(module, CustomOp):
            module.use_kernels = ops.enabled(module.name, chosen)
