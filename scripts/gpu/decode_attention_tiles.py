#!/usr/bin/env python3
"""Paged decode attention's kernels and tiles, per head shape, batch and context.

    python3 scripts/gpu/decode_attention_tiles.py [--out DIR] [--batches 1,8,16,32,64]

For SmolLM2's heads (9 query, 3 KV, dim 64), Llama-3.2-1B's (32/8, 64) and Llama-3.1-8B's
(32/8, 128) at contexts 192 and 512, the µs of one call:
- of the per-head one pass (one program per query head; scripts/gpu/per_head_decode.py,
  kept to compare) for each tile of `SINGLE_PASS_TILES`;
- of the engine's grouped kernel (`triton_paged_decode` of
  mini_vllm/kernels/paged_attention.py: one program per KV head and slice, its query heads
  together on the tensor cores) for each tile of `GROUPED_TILES` and each count of slices,
  1 included (1: no merge);
- of what `decode_plan` picks (a tile and slices of the grouped kernel), and its time.
Tiles are (cached tokens an iteration, warps a program). Each call reads its own copy of
the KV cache, 16 copies in turn inside one CUDA graph, so that the reads come from memory
as in the engine, where a layer's weights have pushed the previous step's cache out of L2.
"""

from __future__ import annotations

import sys

from gpukit import decode_attention_inputs, run_script

HEADS = [(9, 3, 64), (32, 8, 64), (32, 8, 128)]
CONTEXTS = (192, 512)
COPIES = 16
SINGLE_PASS_TILES = [(32, 1), (64, 1), (64, 2)]
GROUPED_TILES = [(16, 1), (32, 2), (32, 4), (64, 4)]
SPLITS = (1, 2, 4, 8, 16)


def add_arguments(parser) -> None:
    parser.add_argument(
        "--batches", default="1,8,16,32,64", help="batch sizes (default: %(default)s)"
    )


def time_case(heads: int, kv_heads: int, dim: int, reqs: int, ctx: int):
    """µs a call: {tile: per-head one pass}, {(tile, slices): grouped}, and the plan's."""
    import triton.testing
    from per_head_decode import per_head_paged_decode

    from mini_vllm.kernels import paged_attention

    caches, tables, lens, slots, q, k, v, out = decode_attention_inputs(
        reqs, heads, kv_heads, dim, ctx, copies=COPIES
    )

    def time_us(attend):
        def calls():
            for cache in caches:
                attend(cache)

        return triton.testing.do_bench_cudagraph(calls) * 1000 / COPIES

    def grouped_us(plan=None):
        return time_us(
            lambda cache: paged_attention.triton_paged_decode(
                q, k, v, cache, tables, lens, slots, None, out, plan=plan
            )
        )

    def per_head_us(tile):
        return time_us(
            lambda cache: per_head_paged_decode(
                q, k, v, cache, tables, lens, slots, None, tile, out
            )
        )

    per_head = {tile: per_head_us(tile) for tile in SINGLE_PASS_TILES}
    grouped = {
        (tile, splits): grouped_us(paged_attention.DecodePlan(tile, splits))
        for tile in GROUPED_TILES
        for splits in SPLITS
    }
    max_context = tables.shape[1] * caches[0].shape[2]
    plan = paged_attention.decode_plan(reqs, kv_heads, dim, max_context)
    return per_head, grouped, plan, grouped_us()


def measure(args, report) -> None:
    import torch

    report(
        "us a call; tiles (tokens an iteration, warps a program); `plan`: what decode_plan "
        "picks (the grouped kernel, tile, slices)"
    )
    report()
    report(
        "| heads x dim | batch | context | per-head: best | its tile | grouped: best "
        "| its tile, slices | grouped, 1 slice: best | plan | its time | plan / best |"
    )
    report("|---|---|---|---|---|---|---|---|---|---|---|")
    details = []
    for heads, kv_heads, dim in HEADS:
        for reqs in [int(b) for b in args.batches.split(",")]:
            for ctx in CONTEXTS:
                per_head, grouped, plan, plan_us = time_case(heads, kv_heads, dim, reqs, ctx)
                best_head = min(per_head, key=per_head.get)
                best_grouped = min(grouped, key=grouped.get)
                one_slice = min(t for (_, s), t in grouped.items() if s == 1)
                best = min(per_head[best_head], grouped[best_grouped])
                report(
                    f"| {heads}/{kv_heads} x {dim} | {reqs} | {ctx} | {per_head[best_head]:.1f} "
                    f"| {best_head} | {grouped[best_grouped]:.1f} "
                    f"| {best_grouped[0]}, {best_grouped[1]} | {one_slice:.1f} "
                    f"| grouped {plan.tile}, {plan.splits} | {plan_us:.1f} "
                    f"| {plan_us / best:.2f} |"
                )
                details.append(
                    f"| {heads}/{kv_heads} x {dim} | {reqs} | {ctx} | "
                    + " | ".join(f"{per_head[t]:.1f}" for t in SINGLE_PASS_TILES)
                    + " | "
                    + " | ".join(f"{grouped[(t, s)]:.1f}" for t in GROUPED_TILES for s in SPLITS)
                    + " |"
                )
                torch.cuda.empty_cache()
    report()
    report("Every time, µs: per-head tiles, then grouped (tile, slices):")
    report()
    columns = [f"per-head {t}" for t in SINGLE_PASS_TILES] + [
        f"{t}, {s}" for t in GROUPED_TILES for s in SPLITS
    ]
    report("| heads x dim | batch | context | " + " | ".join(columns) + " |")
    report("|---|---|---|" + "---|" * len(columns))
    for line in details:
        report(line)


if __name__ == "__main__":
    sys.exit(run_script(__file__, __doc__.splitlines()[0], measure, add_arguments))
