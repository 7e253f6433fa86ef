#!/usr/bin/env python3
"""Paged decode attention's tiles: cached tokens an iteration and warps a program, per batch.

    python3 scripts/gpu/decode_attention_tiles.py [--out DIR] [--batches 1,4,8,16,32,64]

For SmolLM2's heads (9 query, 3 KV, dim 64), Llama-3.2-1B's (32/8, 64) and Llama-3.1-8B's
(32/8, 128) at contexts 192 and 512: the µs of one call of `triton_paged_decode`, one pass
and flash-decoding slices, for each tile of `SINGLE_PASS_TILE` and `SPLIT_TILE` (the
module constants of mini_vllm/attention/triton_decode.py, set in turn), and for the
slices each count of slices. Each call reads its own copy of the KV cache, 16 copies in
turn inside one CUDA graph, so that the reads come from memory as in the engine, where
a layer's weights have pushed the previous step's cache out of L2.
"""

from __future__ import annotations

import sys

from gpukit import decode_attention_inputs, run_script

HEADS = [(9, 3, 64), (32, 8, 64), (32, 8, 128)]
CONTEXTS = (192, 512)
COPIES = 16
SINGLE_PASS_TILES = [(32, 1), (32, 2), (64, 1), (64, 2), (64, 4), (128, 2), (128, 4)]
SPLIT_TILES = [(16, 1), (16, 2), (32, 1), (32, 2), (32, 4), (64, 2), (64, 4)]
SPLITS = (2, 4, 8, 16)


def add_arguments(parser) -> None:
    parser.add_argument(
        "--batches", default="1,4,8,16,32,64", help="batch sizes (default: %(default)s)"
    )


def time_case(heads: int, kv_heads: int, dim: int, reqs: int, ctx: int):
    """µs a call for every one-pass tile, and every (slices tile, count of slices)."""
    import triton.testing

    from mini_vllm.attention import triton_decode

    caches, tables, lens, slots, q, k, v, out = decode_attention_inputs(
        reqs, heads, kv_heads, dim, ctx, copies=COPIES
    )
    defaults = triton_decode.SINGLE_PASS_TILE, triton_decode.SPLIT_TILE

    def time_us(splits, single=defaults[0], split=defaults[1]):
        triton_decode.SINGLE_PASS_TILE, triton_decode.SPLIT_TILE = single, split

        def calls():
            for cache in caches:
                triton_decode.triton_paged_decode(
                    q, k, v, cache, tables, lens, slots, None, out, splits
                )

        try:
            return triton.testing.do_bench_cudagraph(calls) * 1000 / COPIES
        finally:
            triton_decode.SINGLE_PASS_TILE, triton_decode.SPLIT_TILE = defaults

    single = {tile: time_us(1, single=tile) for tile in SINGLE_PASS_TILES}
    split = {(tile, s): time_us(s, split=tile) for tile in SPLIT_TILES for s in SPLITS}
    return (
        single,
        split,
        triton_decode.decode_num_splits(reqs, kv_heads, tables.shape[1] * caches[0].shape[2]),
    )


def measure(args, report) -> None:
    import torch

    from mini_vllm.attention import triton_decode

    default_single, default_split = triton_decode.SINGLE_PASS_TILE, triton_decode.SPLIT_TILE
    report(
        f"us a call; tiles (tokens, warps); defaults: one pass {default_single}, "
        f"slices {default_split}; `picked` is decode_num_splits's count of slices"
    )
    report()
    report(
        "| heads x dim | batch | context | one pass: default | best | its tile "
        "| slices: default tile, picked count | best | its tile, count | picked |"
    )
    report("|---|---|---|---|---|---|---|---|---|---|")
    for heads, kv_heads, dim in HEADS:
        for reqs in [int(b) for b in args.batches.split(",")]:
            for ctx in CONTEXTS:
                single, split, picked = time_case(heads, kv_heads, dim, reqs, ctx)
                best_single = min(single, key=single.get)
                best_split = min(split, key=split.get)
                default_split_time = f"{split[(default_split, picked)]:.1f}" if picked > 1 else "-"
                report(
                    f"| {heads}/{kv_heads} x {dim} | {reqs} | {ctx} "
                    f"| {single[default_single]:.1f} | {single[best_single]:.1f} "
                    f"| {best_single} | {default_split_time} | {split[best_split]:.1f} "
                    f"| {best_split[0]}, {best_split[1]} | {picked} |"
                )
                torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(run_script(__file__, __doc__.splitlines()[0], measure, add_arguments))
