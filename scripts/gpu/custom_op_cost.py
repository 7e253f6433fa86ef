#!/usr/bin/env python3
"""Host time of one custom-op call: `torch.library.custom_op` against direct registration.

    python3 scripts/gpu/custom_op_cost.py [--out DIR]

The same body, an in-place add of 1024 floats, called three ways: as a plain torch op; as
an op made with `torch.library.custom_op` (Python wrappers around every call); and as an
op whose schema is defined in a library fragment with the function registered as its
CUDA kernel (vLLM's `direct_register_custom_op`, mini_vllm/torch_utils.py). Then
mini_vllm's own `torch.ops.mini_vllm.linear` at 8 rows of the SmolLM2 shape against
calling its kernel function. Each call is timed on the host (no synchronisation inside
the loop), median of 2000, under `torch.inference_mode()` as the engine runs, then with
autograd on.
"""

import sys

from gpukit import host_us, run_script


def measure(args, report) -> None:
    import torch

    # Importing mini_vllm.kernels registers its ops, torch.ops.mini_vllm.linear among them.
    from mini_vllm.kernels.gemv import linear_cuda
    from mini_vllm.torch_utils import direct_register_custom_op

    def add_one_(x: torch.Tensor) -> None:
        x.add_(1.0)

    wrapped = torch.library.custom_op("mini_vllm::probe_add_one", mutates_args=("x",))(add_one_)
    direct = direct_register_custom_op("probe_add_one_direct", add_one_, mutates_args=["x"])
    x = torch.zeros(1024, device="cuda")
    rows = torch.randn(8, 576, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(1536, 576, device="cuda", dtype=torch.bfloat16)
    op_linear = torch.ops.mini_vllm.linear
    calls = [
        ("plain torch op `x.add_(1)`", lambda: x.add_(1.0)),
        ("`torch.library.custom_op` around it", lambda: wrapped(x)),
        ("direct registration (`direct_register_custom_op`)", lambda: direct(x)),
        ("`linear_cuda(x, w)`, 8 x 576 by 1536 x 576, bf16", lambda: linear_cuda(rows, weight)),
        ("`torch.ops.mini_vllm.linear(x, w)`, the same", lambda: op_linear(rows, weight)),
    ]  # fmt: skip
    report("host us a call (median of 2000): inference mode | autograd on")
    for label, fn in calls:
        with torch.inference_mode():
            inference = host_us(fn, calls=2000, warmups=50)
        autograd = host_us(fn, calls=2000, warmups=50)
        report(f"  {label:<55} {inference:7.2f} | {autograd:7.2f}")


if __name__ == "__main__":
    sys.exit(run_script(__file__, __doc__.splitlines()[0], measure))
