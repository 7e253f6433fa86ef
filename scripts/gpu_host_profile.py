"""Where the host time of an async engine step goes (cProfile), compiled + FULL + async, batch 1."""
import cProfile
import pstats
import sys
import time

import torch

from mini_vllm.bench.decode_graphs import _engine_for
from mini_vllm.models.loader import load_model
from mini_vllm.sampling_params import SamplingParams

model_name = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m"
mode = sys.argv[2] if len(sys.argv) > 2 else "compile+full+async"
model, _, _ = load_model(model_name, device="cuda", progress=False)
engine = _engine_for(model, mode, [1], 128, 500, "cuda", "bfloat16", 16)
engine.add_request(list(range(3, 131)), SamplingParams(temperature=0, max_tokens=450, ignore_eos=True))
for _ in range(30):
    engine.step()
torch.cuda.synchronize()
start = time.perf_counter()
for _ in range(200):
    engine.step()
print(f"{mode}: {(time.perf_counter() - start) / 200 * 1e3:.3f} ms a step without the profiler")
profiler = cProfile.Profile()
profiler.enable()
for _ in range(200):
    engine.step()
profiler.disable()
stats = pstats.Stats(profiler)
stats.sort_stats("tottime").print_stats(22)
stats.sort_stats("cumulative").print_stats(30)
