#!/usr/bin/env python3
"""Host time of the calls a decode step makes outside a graph (batch 1, SmolLM2 shape).

    python3 scripts/gpu/host_launch_costs.py [--out DIR]

First the calls an async step makes after the graph replay: the LM head's product
(Triton GEMV and cuBLAS), the argmax, small non-blocking copies, an event, an
allocation. Then what one eager kernel costs, layer by layer down to the C launcher: an
RMSNorm module call, the function it calls, `launch` of mini_vllm/kernels/launch.py
(on a kernel of the same signature), its specialisation key, the compiled kernel's
launcher alone (given tensors, or their addresses), and the small helpers around them.
Each call is timed on the host only (no sync inside the loop), after a sync, 200 calls
back to back, median; the GPU work queues up behind. What a call costs the host is what
a step's host side pays for it every time.
"""

from __future__ import annotations

import sys

from gpukit import host_us, run_script


def measure(args, report) -> None:
    import torch
    import torch.nn.functional as F

    from mini_vllm.kernels.gemv import triton_gemv

    device = torch.device("cuda")
    x = torch.randn(1, 576, device=device, dtype=torch.bfloat16)
    lm_head = torch.randn(49152, 576, device=device, dtype=torch.bfloat16)
    logits = torch.randn(1, 49152, device=device, dtype=torch.bfloat16)
    pinned = torch.zeros(4096, dtype=torch.long, pin_memory=True)
    on_device = torch.zeros(4096, dtype=torch.long, device=device)
    costs = {
        "triton_gemv (LM head)": lambda: triton_gemv(x, lm_head),
        "F.linear (LM head)": lambda: F.linear(x, lm_head),
        "argmax": lambda: logits.argmax(dim=-1),
        "copy_ 128 ints, pinned -> device, non_blocking": lambda: on_device[:128].copy_(
            pinned[:128], non_blocking=True
        ),
        "copy_ 4096 ints, pinned -> device, non_blocking": lambda: on_device.copy_(
            pinned, non_blocking=True
        ),
        "Event() + record()": lambda: torch.cuda.Event().record(),
        "torch.empty (1, 576)": lambda: torch.empty((1, 576), device=device, dtype=torch.bfloat16),
    }
    for name, fn in costs.items():
        report(f"{name:>50}: {host_us(fn):6.1f} us on the host")
    report("")
    report("one eager kernel, from the module call down (RMSNorm, 576 wide, one row):")
    for name, fn in _eager_kernel_costs(device).items():
        report(f"{name:>50}: {host_us(fn):6.1f} us on the host")


def _eager_kernel_costs(device) -> dict:
    import torch
    import triton
    import triton.language as tl

    from mini_vllm.kernels import launch as kernel_launch
    from mini_vllm.kernels.gemv import linear_cuda, triton_gemv_available
    from mini_vllm.kernels.rms_norm import triton_rmsnorm
    from mini_vllm.layers.layernorm import RMSNorm

    # A kernel with the signature of the RMSNorm kernel's (five pointers, three integers,
    # a float, two constexprs), to time `launch` and its parts on their own.
    @triton.jit
    def scale_rows(x, residual, weight, out, residual_out, stride_x, stride_r, hidden, eps,
                   HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
        offsets = tl.arange(0, BLOCK)
        mask = offsets < hidden
        row = tl.load(x + tl.program_id(0) * stride_x + offsets, mask=mask)
        tl.store(out + tl.program_id(0) * hidden + offsets, row * eps, mask=mask)

    norm = RMSNorm(576, 1e-5).to(device=device, dtype=torch.bfloat16)
    x = torch.randn(1, 576, device=device, dtype=torch.bfloat16)
    weight = torch.randn(576, 576, device=device, dtype=torch.bfloat16)
    out = torch.empty_like(x)
    args = (x, x, norm.weight, out, out, x.stride(0), 0, 576, 1e-5, False, 1024)
    constexprs = frozenset((9, 10))
    launcher = kernel_launch.direct_launcher(scale_rows[(1,)](*args, num_warps=4))
    addresses = kernel_launch.specialise(args, constexprs)[1]
    return {
        "RMSNorm module call (norm(x))": lambda: norm(x),
        "triton_rmsnorm(x, weight, eps)": lambda: triton_rmsnorm(x, norm.weight, 1e-5),
        "launch(kernel, grid, *11 args)": lambda: kernel_launch.launch(
            scale_rows, (1,), *args, num_warps=4
        ),
        "specialise(11 args)": lambda: kernel_launch.specialise(args, constexprs),
        "launcher alone, tensors as addresses": lambda: launcher((1,), addresses),
        "launcher alone, tensors as tensors": lambda: launcher((1,), args),
        "torch.empty((1, 576))": lambda: torch.empty((1, 576), dtype=x.dtype, device=device),
        "triton.next_power_of_2(576)": lambda: triton.next_power_of_2(576),
        "mini_vllm.kernels.launch.next_power_of_2(576)": lambda: kernel_launch.next_power_of_2(576),
        "triton_gemv_available(x, weight)": lambda: triton_gemv_available(x, weight),
        "linear_cuda 576x576, one row (Triton GEMV)": lambda: linear_cuda(x, weight),
    }


if __name__ == "__main__":
    sys.exit(run_script(__file__, __doc__.splitlines()[0], measure))
