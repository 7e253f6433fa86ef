"""Where the host time of one engine decode step goes (cProfile), compiled + FULL graphs, batch 1."""
import cProfile
import pstats
import sys

from mini_vllm.bench.decode_graphs import _engine_for
from mini_vllm.models.loader import load_model
from mini_vllm.sampling_params import SamplingParams

model_name = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m"
model, _, _ = load_model(model_name, device="cuda", progress=False)
engine = _engine_for(model, "compile+full", [1], 128, 300, "cuda", "bfloat16", 16)
engine.add_request(list(range(3, 131)), SamplingParams(temperature=0, max_tokens=250, ignore_eos=True))
for _ in range(20):
    engine.step()
profiler = cProfile.Profile()
profiler.enable()
for _ in range(200):
    engine.step()
profiler.disable()
pstats.Stats(profiler).sort_stats("tottime").print_stats(25)

# Which kernels the GPU spends the step on (one compiled + FULL decode step).
import torch
from torch.profiler import ProfilerActivity, profile

torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(10):
        engine.step()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=70))
