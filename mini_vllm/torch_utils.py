"""Registering mini_vllm's custom ops with PyTorch's dispatcher, directly; and small host
values sent to the device without making the host wait.

vLLM counterpart: vllm/utils/torch_utils.py (`direct_register_custom_op` and the
`vllm_lib` library fragment it registers into; `async_tensor_h2d`).

A custom op is what a compiler must not look into: attention, whose work depends on each
step's metadata, and the products whose kernel is chosen by row count when they run.
`torch.library.custom_op` would register one, but every call then passes through its
Python wrappers: an alias check of the outputs, a Dynamo-disabling frame, and for an op
that writes into an argument a Python kernel for the in-place bookkeeping of autograd.
Measured on an H100 host (`scripts/gpu/factcheck.py`, part a) that made a
one-add op cost about three plain torch ops. Like vLLM, mini_vllm instead defines the op's
schema in a library fragment, registers the function itself as the op's CPU and CUDA
kernel and a fake (shape-only) version for tracing: a call is the dispatcher, then the
function. What the wrappers checked becomes the op author's contract: outputs never
share storage with inputs, and `mutates_args` names every argument the op writes into.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = ["async_tensor_h2d", "direct_register_custom_op"]

# Every op lives as long as the library object that registered it: a module global.
_LIBRARY = torch.library.Library("mini_vllm", "FRAGMENT")


# ANCHOR: direct_register
def direct_register_custom_op(
    op_name: str,
    op_func: Callable,
    mutates_args: Sequence[str] = (),
    fake_impl: Callable | None = None,
):
    """Define `torch.ops.mini_vllm.<op_name>` with `op_func` as its kernel on the CPU and
    CUDA, and `fake_impl` for tracing; returns the op. The schema comes from `op_func`'s
    type annotations."""
    schema = torch.library.infer_schema(op_func, mutates_args=tuple(mutates_args))
    _LIBRARY.define(op_name + schema)
    for dispatch_key in ("CPU", "CUDA"):
        _LIBRARY.impl(op_name, op_func, dispatch_key)
    if fake_impl is not None:
        torch.library.register_fake(f"mini_vllm::{op_name}", fake_impl, lib=_LIBRARY)
    return getattr(torch.ops.mini_vllm, op_name)


# ANCHOR_END: direct_register


# ANCHOR: async_tensor_h2d
def async_tensor_h2d(values, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """`values` (a list or numpy array) as a tensor on `device`, without a host wait.

    `torch.tensor(values, device="cuda")` copies from pageable memory and then waits for
    the stream: every kernel queued before it, a whole forward pass, must finish first,
    and under async scheduling that wait is exactly what the overlap was meant to hide.
    Staged in pinned memory (PyTorch's caching host allocator, which reuses a block only
    once the copy that reads it has run), the copy is queued like a kernel.
    """
    device = torch.device(device)
    host = torch.as_tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


# ANCHOR_END: async_tensor_h2d
