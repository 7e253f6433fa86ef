#!/usr/bin/env python3
"""Host time of the calls an async decode step makes
after the graph replay (batch 1, SmolLM2 shape).

    python3 scripts/gpu/host_launch_costs.py [--out DIR]

The LM head's product (Triton GEMV and cuBLAS), the argmax, small non-blocking copies, an
event, an allocation. Each call is timed on the host only (no sync inside the loop),
after a sync, 200 calls back to back, median; the GPU work queues up behind. What a call
costs the host is what an async step's host side pays for it every step.
"""

from __future__ import annotations

import sys

from gpukit import host_us, run_script


def measure(args, report) -> None:
    import torch
    import torch.nn.functional as F

    from mini_vllm.layers.triton_gemv import triton_gemv

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


if __name__ == "__main__":
    sys.exit(run_script(__file__, __doc__.splitlines()[0], measure))
