"""Host time of one CUDA graph launch (`graph.replay()`), by graph: the FULL decode graph
of the eager and the compiled model at batch 1 (SmolLM2 shape). Run it twice, with and
without MINI_VLLM_PDL=0, to see what programmatic dependent launch edges cost the host."""
import os
import statistics
import time

import torch

from mini_vllm.bench.decode_graphs import _engine_for
from mini_vllm.models.loader import load_model
from mini_vllm.sampling_params import SamplingParams


def launch_cost(mode: str, model) -> tuple[float, float]:
    engine = _engine_for(model, mode, [1], 128, 300, "cuda", torch.bfloat16, 16)
    engine.add_request(list(range(3, 131)), SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
    for _ in range(10):
        engine.step()
    (entry,) = engine.runner.graphs.full_wrapper.entries.values()
    host, whole = [], []
    for _ in range(20):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(10):  # ten back to back: the GPU stays busy, the host only launches
            t = time.perf_counter()
            entry.graph.replay()
            host.append(time.perf_counter() - t)
        torch.cuda.synchronize()
        whole.append((time.perf_counter() - start) / 10)
    while engine.has_unfinished_requests():
        engine.step()
    return statistics.median(host) * 1e3, statistics.median(whole) * 1e3


def main() -> None:
    model, _, _ = load_model("smollm2-135m", device="cuda", dtype=torch.bfloat16, progress=False)
    pdl = os.environ.get("MINI_VLLM_PDL", "1")
    for mode in ("full", "compile+full"):
        host_ms, replay_ms = launch_cost(mode, model)
        print(f"PDL={pdl} {mode:>13}: host time of replay() {host_ms:.3f} ms, "
              f"replays back to back {replay_ms:.3f} ms each")


if __name__ == "__main__":
    main()
