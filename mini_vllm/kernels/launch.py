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
launcher straight away, as Triton's `JITFunction.run` ends, with each tensor passed as
its address (`specialise`). The specialisation
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

from mini_vllm import compat

__all__ = ["cdiv", "direct_launcher", "launch", "next_power_of_2", "specialise", "specialisation"]

# (id(kernel), device, specialisation, options) -> the compiled kernel's direct launcher,
# or None where there is none (mini_vllm/compat.py): then Triton's front end every time.
_launchers: dict[tuple, Callable[[tuple, tuple], None] | None] = {}
# id(kernel) -> (kernel, the positions of its constexprs). Kernels are told apart by
# identity: hashing a JITFunction takes a lock and hashes its source key (Triton's
# `__hash__`), twice a launch otherwise. The kernel is held so that its id stays its own.
_kernels: dict[int, tuple[Any, frozenset[int] | None]] = {}
_current_device = compat.raw_stream_getters()[1]


# Host-side sizes of a launch. Triton's `triton.next_power_of_2` and `triton.cdiv` are
# constexpr functions, usable inside kernels too, and a call from the host costs as much
# as a small kernel's whole short launch (scripts/gpu/host_launch_costs.py,
# benchmarks/results/eager-cuda.md): several a kernel, at every eager launch.
def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (n >= 1), as `triton.next_power_of_2`."""
    return 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """a / b rounded up, as `triton.cdiv`."""
    return -(-a // b)


# ANCHOR: specialisation
def specialisation(args: tuple, constexprs: frozenset[int] | None = None) -> tuple:
    """What Triton's compiled kernel for `args` depends on, one entry an argument: the
    value of a constexpr (the positions in `constexprs`; None: every integer counts as
    one), a tensor's dtype, 16-byte alignment and being on the GPU, an integer's being 1,
    a multiple of 16, or beyond 32 bits, a float's type."""
    return specialise(args, constexprs)[0]


def specialise(args: tuple, constexprs: frozenset[int] | None = None) -> tuple[tuple, list]:
    """`(specialisation(args), arguments for the C launcher)`, in one pass over `args`.

    The C launcher takes a pointer argument as a tensor or as an address. Given a tensor
    it calls the tensor's `data_ptr` through Python and asks the CUDA driver whether the
    address is the GPU's, a microsecond or more for a kernel of five tensors
    (scripts/gpu/host_launch_costs.py), and the decode attention passes a dozen. The key
    has just read each address for its alignment and records whether the tensor is on
    the GPU, so the short path passes the addresses; Triton's front end, which checks
    them, has seen the first call of every key."""
    key, arguments = [], list(args)
    for position, arg in enumerate(args):
        if isinstance(arg, torch.Tensor):
            address = arguments[position] = arg.data_ptr()
            key.append((arg.dtype, address % 16 == 0, arg.is_cuda))
            continue
        kind = type(arg)
        if constexprs is None or position in constexprs:
            key.append((kind, arg))
        elif kind is int:
            key.append(
                1 if arg == 1 else 16 if arg % 16 == 0 else 64 if not -(2**31) <= arg < 2**31 else 0
            )
        elif kind is float:
            key.append(float)
        else:  # bool, None, a dtype: part of the key as it is
            key.append((kind, arg))
    return tuple(key), arguments


# ANCHOR_END: specialisation


# ANCHOR: direct_launcher
def direct_launcher(compiled: Any) -> Callable[[tuple, tuple], None] | None:
    """`launch(grid, args)` for a kernel Triton compiled and launched once (what
    `kernel[grid](...)` returned), or None: on a Triton this was not verified on
    (mini_vllm/compat.py; every launch then goes through Triton's front end), or where its
    compiled kernels lack the parts it needs. `args` may hold tensors or their addresses."""
    parts = compat.launch_parts(compiled)
    if parts is None:
        return None
    function, packed_metadata = parts.function, parts.packed_metadata
    # The current stream of the current device, read without torch.cuda's Python layer
    # (CUDA is initialised: the kernel has run once).
    current_stream, current_device = compat.raw_stream_getters()
    if parts.bare is not None:
        # The C function itself, past the Python wrapper around it (which only allocates
        # scratch memory these kernels never ask for): grid, stream, function, cooperative,
        # PDL, two scratch buffers, metadata, launch metadata and two hooks, then arguments.
        bare, cooperative, pdl = parts.bare, parts.cooperative, parts.pdl

        def launch_bare(grid: tuple, args: tuple) -> None:
            x, y, z = (*grid, 1, 1)[:3]
            bare(x, y, z, current_stream(current_device()), function, cooperative, pdl,
                 None, None, packed_metadata, None, None, None, *args)  # fmt: skip

        return launch_bare
    run = parts.run

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
    known = _kernels.get(id(kernel))
    if known is None:
        # A JITFunction lists its constexpr parameters; without the list, every integer is
        # taken as one (more entries, never a wrong kernel).
        positions = getattr(kernel, "constexprs", None)
        known = _kernels[id(kernel)] = (
            kernel,
            frozenset(positions) if positions is not None else None,
        )
    specialised, arguments = specialise(args, known[1])
    # The device too: Triton compiles a kernel for one GPU, and a process may drive several.
    key = (id(kernel), _current_device(), specialised, *options.items())
    launcher = _launchers.get(key, False)
    if launcher:
        launcher(grid, arguments)
        return
    compiled = kernel[grid](*args, **options)
    if launcher is False:  # the first call for this specialisation
        _launchers[key] = direct_launcher(compiled)


# ANCHOR_END: launch
