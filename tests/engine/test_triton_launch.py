"""Triton kernels launched past Triton's front end (mini_vllm/kernels/launch.py).

The short path must never reach a kernel compiled for other arguments: the
specialisation it keys on is checked here on any machine, and on a GPU (GPU-REQ,
tests/gpu/test_triton_launch_cuda.py) a kernel launched both ways, on aligned and
misaligned rows, on a side stream and inside a CUDA graph, gives what Triton's own
launch gives.
"""

from __future__ import annotations

import torch

from mini_vllm.kernels.launch import specialisation


def test_the_specialisation_tells_apart_what_triton_compiles_for():
    def key(*args, constexprs=frozenset()):
        return specialisation(args, constexprs)

    rows = torch.empty(4, 8)
    aligned, misaligned = rows[1:], rows[:, 1:]  # 32 bytes in: aligned; 4 bytes in: not
    assert key(rows) == key(aligned)
    assert key(rows) != key(misaligned)
    assert key(rows) != key(rows.to(torch.bfloat16))
    # Integers: 1, multiples of 16, others, and those beyond 32 bits are four kernels.
    assert len({key(1), key(2), key(32), key(2**40 + 3)}) == 4
    assert key(3) == key(5) and key(32) == key(48)
    # A float's value is an argument, not part of the kernel; a boolean's is.
    assert key(0.5) == key(2.0)
    assert key(True) != key(False)
    assert key(None) != key(0)
    # A constexpr is compiled in: each value is its own kernel.
    assert key(3, 3, constexprs=frozenset({1})) != key(3, 5, constexprs=frozenset({1}))
    assert key(3, 3, constexprs=frozenset({1})) == key(5, 3, constexprs=frozenset({1}))
    assert key(3, constexprs=None) != key(5, constexprs=None)  # unknown: every int by value
