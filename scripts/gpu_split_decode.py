"""Paged decode attention: one program per (request, head) vs flash-decoding slices (µs, in a CUDA graph)."""
import torch
import triton.testing

from mini_vllm.attention.paged import allocate_paged_kv_caches
from mini_vllm.attention.triton_decode import decode_num_splits, triton_paged_decode

bench = getattr(triton.testing, "do_bench_cudagraph", None) or triton.testing.do_bench
for heads, kv_heads in [(9, 3), (32, 8)]:
    for reqs in (1, 8, 32):
        for ctx in (128, 1024):
            dim, block = 64, 16
            width = ctx // block + 1
            cache = allocate_paged_kv_caches(1, reqs * width + 1, block, kv_heads, dim, torch.bfloat16, "cuda")[0].normal_()
            tables = torch.arange(reqs * width, device="cuda").view(reqs, width)
            lens = torch.full((reqs,), ctx, device="cuda")
            slots = torch.full((reqs,), -1, device="cuda")
            q = torch.randn(reqs, heads, dim, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(reqs, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            out = torch.empty_like(q)
            auto = decode_num_splits(reqs, kv_heads)
            times = {s: bench(lambda s=s: triton_paged_decode(q, k, v, cache, tables, lens, slots, None, out, num_splits=s))
                     for s in sorted({1, auto})}
            print(f"heads {heads}/{kv_heads} batch {reqs:2d} ctx {ctx:4d}: " +
                  ", ".join(f"{s} slice{'s' if s > 1 else ''} {t * 1000:.1f} us" for s, t in times.items()) +
                  f" (auto: {auto})")
