#!/usr/bin/env python3
"""Paged decode attention: one slice against flash-decoding's slices and merge, by context.

    python3 scripts/gpu/split_decode.py [--out DIR]

Microseconds a call (replayed in a CUDA graph where Triton can) for SmolLM2's heads (9
query, 3 KV) and Llama-3.2-1B's (32, 8), at batch 1 and 4: the grouped kernel in one
slice, and with the slices `decode_num_splits` would take plus the merge, and where the
slices start to win: the evidence for SINGLE_PASS_MAX_CONTEXT in
mini_vllm/kernels/paged_attention.py.
"""

from __future__ import annotations

import functools
import sys

from gpukit import decode_attention_inputs, run_script


def measure(args, report) -> None:
    import triton.testing

    from mini_vllm.kernels.paged_attention import (
        GROUPED_TILE,
        DecodePlan,
        decode_num_splits,
        triton_paged_decode,
    )

    bench = getattr(triton.testing, "do_bench_cudagraph", None) or triton.testing.do_bench
    for heads, kv_heads in [(9, 3), (32, 8)]:
        for reqs in (1, 4):
            crossover = None
            for ctx in (128, 192, 256, 384, 512, 768, 1024):
                (cache,), tables, lens, slots, q, k, v, out = decode_attention_inputs(
                    reqs, heads, kv_heads, 64, ctx
                )
                split = decode_num_splits(reqs, kv_heads, 64)  # the slices without the context rule
                attend = functools.partial(
                    triton_paged_decode, q, k, v, cache, tables, lens, slots, None, out
                )
                times = {
                    s: bench(functools.partial(attend, plan=DecodePlan(GROUPED_TILE, s))) * 1000
                    for s in sorted({1, split})
                }
                if crossover is None and split > 1 and times[split] < times[1]:
                    crossover = ctx
                report(
                    f"heads {heads}/{kv_heads} batch {reqs} "
                    f"context {ctx:4d}: one pass {times[1]:5.1f} us"
                    + (f", {split} slices + merge {times[split]:5.1f} us" if split > 1 else "")
                )
            report(
                f"heads {heads}/{kv_heads} batch {reqs}: slices first faster at context {crossover}"
            )


if __name__ == "__main__":
    sys.exit(run_script(__file__, __doc__.splitlines()[0], measure))
