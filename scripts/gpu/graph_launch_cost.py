#!/usr/bin/env python3
"""Host time of one CUDA graph launch (`graph.replay()`):
the FULL decode graph at batch 1 (SmolLM2 shape).

    python3 scripts/gpu/graph_launch_cost.py [--out DIR]
    MINI_VLLM_PDL=0 python3 scripts/gpu/graph_launch_cost.py
    # without programmatic dependent launch

For the uncompiled and the compiled model: the host time `replay()` takes to return, and
the time each replay takes when ten run back to back (the GPU stays busy, the host only
launches). Run it with and without MINI_VLLM_PDL=0 to see what PDL edges cost the host.
"""

from __future__ import annotations

import statistics
import sys
import time

from gpukit import run_script


def launch_cost(model, mode: str) -> tuple[float, float]:
    import torch

    from mini_vllm.bench.harness import decode_engine, start_decoding

    engine = decode_engine(model, mode, [1], context_len=128, new_tokens=300)
    start_decoding(engine, batch=1, context_len=128, new_tokens=300)
    for _ in range(10):
        engine.step()
    (entry,) = engine.runner.graphs.full_wrapper.entries.values()
    host, whole = [], []
    for _ in range(20):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(10):
            launched = time.perf_counter()
            entry.graph.replay()
            host.append(time.perf_counter() - launched)
        torch.cuda.synchronize()
        whole.append((time.perf_counter() - start) / 10)
    while engine.has_unfinished_requests():
        engine.step()
    return statistics.median(host) * 1e3, statistics.median(whole) * 1e3


def measure(args, report) -> None:
    import torch

    from mini_vllm import envs
    from mini_vllm.models.loader import load_model

    model, _, _ = load_model("smollm2-135m", device="cuda", dtype=torch.bfloat16, progress=False)
    for mode in ("full", "compile+full"):
        host_ms, replay_ms = launch_cost(model, mode)
        report(
            f"PDL={'on' if envs.MINI_VLLM_PDL else 'off'} {mode:>13}: host time of "
            f"replay() {host_ms:.3f} ms, replays back to back {replay_ms:.3f} ms each"
        )


if __name__ == "__main__":
    sys.exit(run_script(__file__, __doc__.splitlines()[0], measure))
