"""Inductor option variants for the compiled pieces, compile+full+async at batch 1 (one-off GPU experiment).

Prints step and forward time and kernels for each variant and model, then the top kernels of
one step of the base variant (where the GPU time goes).
"""
import sys

import torch
from gpu_step_profile import kernel_table  # this script runs from scripts/, beside it

import mini_vllm.compilation.piecewise_backend as pb
from mini_vllm.bench.decode_graphs import _engine_for, _measure_batch
from mini_vllm.models.loader import load_model

BASE = dict(pb.INDUCTOR_CONFIG)
VARIANTS = {
    "base": BASE,
    "coordinate_descent": {**BASE, "coordinate_descent_tuning": True},
    "autotune_pointwise": {**BASE, "max_autotune_pointwise": True, "coordinate_descent_tuning": True},
}
models = sys.argv[1].split(",") if len(sys.argv) > 1 else ["llama-3.2-1b-like", "smollm2-135m"]
device = torch.device("cuda")
for name in models:
    model, _, _ = load_model(name, device="cuda", progress=False)
    for variant, patches in VARIANTS.items():
        pb.INDUCTOR_CONFIG.clear()
        pb.INDUCTOR_CONFIG.update(patches)
        engine = _engine_for(model, "compile+full+async", [1], 128, 120, "cuda", "bfloat16", 16)
        r = _measure_batch(engine, 1, 128, 30, 5, device)
        print(f"{name} {variant}: step {r.step_ms:.3f} ms fwd {r.forward_ms:.3f} ms kernels {r.kernels} "
              f"kernel-sum {r.kernel_ms}", flush=True)
        if variant == "base":
            from mini_vllm.sampling_params import SamplingParams
            engine.add_request(list(range(3, 131)), SamplingParams(temperature=0, max_tokens=60, ignore_eos=True))
            for _ in range(10):
                engine.step()
            print(kernel_table(engine, rows=14))
            while engine.has_unfinished_requests():
                engine.step()
        del engine
        torch.cuda.empty_cache()
    del model
