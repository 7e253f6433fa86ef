"""Where one engine decode step goes, compiled + FULL graphs, batch 1: host time (cProfile),
then the GPU kernels (torch.profiler). `kernel_table` is shared with the other GPU scripts.

Run it with MINI_VLLM_PDL=0 for per-kernel costs: under programmatic dependent launch a
kernel starts before the one ahead of it ends and waits, and the profiler counts the wait."""
import cProfile
import pstats
import sys

import torch
from torch.profiler import ProfilerActivity, profile


def kernel_table(engine, steps: int = 10, rows: int = 18) -> str:
    """The GPU kernels of `steps` engine steps, by total GPU time (the engine must be decoding)."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=70)


def main() -> None:
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
    print(kernel_table(engine))


if __name__ == "__main__":
    main()
