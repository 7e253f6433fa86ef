"""Launching a Triton kernel that has run before for the price of one call.

vLLM counterpart: none is needed there, since vLLM's eager kernels are C++ ops called
through `torch.ops._C` (a few microseconds of host time each). The closest piece of
PyTorch is Inductor's launcher for the Triton kernels it generates
(torch/_inductor/runtime/triton_heuristics.py, `CachingAutotuner.run`, and
static_triton_launcher.py): it keeps each compiled kernel and calls its launcher
directly instead of going through Triton's front end again.

Why: `kernel[grid](*args)` runs Triton's whole front end on every call: it binds the
arguments to the kernel's signature, works out how each is specialised (the dtype of a
tensor and whether its address is 16-byte aligned, whether an integer is 1 or a multiple
of 16), builds the cache key, looks the compiled kernel up, checks the globals it read,
and gathers launch metadata; then the C launcher runs. Inside a CUDA graph that is paid
once, at capture. Eagerly it is paid on every launch, and a decode step launches a few
hundred kernels: it is a large share of what made the eager engine slow
(scripts/gpu/host_profile.py, benchmarks/results/eager-cuda.md).

`launch(kernel, grid, *args, **options)` is `kernel[grid](*args, **options)`. The first
call for a specialisation goes through Triton (which compiles, or loads from its cache)
and keeps the compiled kernel; later calls with the same specialisation call its C
launcher straight away, exactly as Triton's `JITFunction.run` ends. The specialisation
is worked out here the way Triton does it (with the values of the constexprs), so a
call never reaches a kernel compiled for other arguments. Every argument of the kernel
is passed positionally, in the order of its signature (constexprs included); `options`
are launch options only (`num_warps`, `launch_pdl`, ...). Triton's launch hooks (its
own profiler) are not called on the short path; CUDA-level profilers (torch.profiler,
Nsight) see every launch as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["direct_launcher", "launch", "specialisation"]

# (kernel, specialisation, options) -> the compiled kernel's direct launcher, or None
# where it has none (an older Triton): then Triton's front end every time.
_launchers: dict[tuple, Callable[[tuple, tuple], None] | None] = {}
_constexpr_positions: dict[Any, frozenset[int] | None] = {}  # per kernel


# ANCHOR: specialisation
def specialisation(args: tuple, constexprs: frozenset[int] | None = None) -> tuple:
    """What Triton's compiled kernel for `args` depends on, one entry an argument: the
    value of a constexpr (the positions in `constexprs`; None: every integer counts as
    one), a tensor's dtype and 16-byte alignment, an integer's being 1, a multiple of
    16, or beyond 32 bits, a float's type."""
    key = []
    for position, arg in enumerate(args):
        kind = type(arg)
        if isinstance(arg, torch.Tensor):
            key.append((arg.dtype, arg.data_ptr() % 16 == 0))
        elif constexprs is None or position in constexprs:
            key.append((kind, arg))
        elif kind is int:
            key.append(
                1 if arg == 1 else 16 if arg % 16 == 0 else 64 if not -(2**31) <= arg < 2**31 else 0
            )
        elif kind is float:
            key.append(float)
        else:  # bool, None, a dtype: part of the key as it is
            key.append((kind, arg))
    return tuple(key)


# ANCHOR_END: specialisation


# ANCHOR: direct_launcher
def direct_launcher(compiled: Any) -> Callable[[tuple, tuple], None] | None:
    """`launch(grid, args)` for a kernel Triton compiled and launched once (what
    `kernel[grid](...)` returned), or None if this Triton's compiled kernels lack the
    parts it needs."""
    parts = ("run", "function", "packed_metadata")
    if not all(hasattr(compiled, name) for name in parts):
        return None
    run, function, packed_metadata = (getattr(compiled, name) for name in parts)
    current_stream, current_device = torch._C._cuda_getCurrentRawStream, torch.cuda.current_device

    def launch_compiled(grid: tuple, args: tuple) -> None:
        x, y, z = (*grid, 1, 1)[:3]
        # What JITFunction.run ends with: grid, stream, kernel, its metadata, no launch
        # metadata and no hooks, then every argument.
        run(x, y, z, current_stream(current_device()), function, packed_metadata, None, None, None,
            *args)  # fmt: skip

    return launch_compiled


# ANCHOR_END: direct_launcher


# ANCHOR: launch
def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **options: Any) -> None:
    """`kernel[grid](*args, **options)`, without Triton's front end after the first call."""
    constexprs = _constexpr_positions.get(kernel, False)
    if constexprs is False:
        # A JITFunction lists its constexpr parameters; without the list, every integer is
        # taken as one (more entries, never a wrong kernel).
        positions = getattr(kernel, "constexprs", None)
        constexprs = _constexpr_positions[kernel] = (
            frozenset(positions) if positions is not None else None
        )
    key = (kernel, specialisation(args, constexprs), *options.items())
    launcher = _launchers.get(key, False)
    if launcher:
        launcher(grid, args)
        return
    compiled = kernel[grid](*args, **options)
    if launcher is False:  # the first call for this specialisation
        _launchers[key] = direct_launcher(compiled)


# ANCHOR_END: launch
