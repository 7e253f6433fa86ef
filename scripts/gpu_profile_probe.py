"""Check what torch.profiler reports for GPU kernels on this machine (eager and graph replay)."""
import collections

import torch
from torch.profiler import ProfilerActivity, profile

x = torch.randn(1024, 1024, device="cuda")
g = torch.cuda.CUDAGraph()
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    y = x @ x
torch.cuda.synchronize()
with torch.cuda.graph(g):
    y = (x @ x).relu() + 1
for label, fn in [("eager", lambda: (x @ x).relu() + 1), ("graph", g.replay)]:
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kinds = collections.Counter(str(e.device_type) for e in prof.events())
    raw = collections.Counter(str(e.device_type()) for e in prof.profiler.kineto_results.events())
    print(label, "events:", dict(kinds), "raw:", dict(raw))
    print("  cuda names:", [e.name for e in prof.events() if str(e.device_type).endswith("CUDA")][:5])
