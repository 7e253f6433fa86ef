"""Time variants of the paged decode kernel in isolation (do_bench medians, microseconds)."""
import torch
import triton
import triton.language as tl

from mini_vllm.attention import triton_decode as td
from mini_vllm.attention.paged import allocate_paged_kv_caches


@triton.jit
def grouped_kernel(q_ptr, key_cache_ptr, value_cache_ptr, out_ptr, tables_ptr, seq_lens_ptr,
                   stride_q_tok, stride_q_head, stride_o_tok, stride_o_head, stride_table, scale,
                   NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                   HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    request = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq_len = tl.maximum(tl.load(seq_lens_ptr + request), 1)
    g = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + g
    hmask = g < GROUP
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + request * stride_q_tok + heads[:, None] * stride_q_head + dims[None, :], mask=hmask[:, None], other=0.0)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    s_sum = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    row = NUM_KV_HEADS * HEAD_DIM
    for start in range(0, seq_len, BLOCK_N):
        tokens = start + tl.arange(0, BLOCK_N)
        visible = tokens < seq_len
        blocks = tl.load(tables_ptr + request * stride_table + tokens // BLOCK_SIZE, mask=visible, other=0)
        offsets = (blocks * BLOCK_SIZE + tokens % BLOCK_SIZE)[:, None] * row + kv_head * HEAD_DIM + dims[None, :]
        keys = tl.load(key_cache_ptr + offsets, mask=visible[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(keys)).to(tl.float32) * scale if GROUP_PAD >= 16 else tl.sum(q[:, None, :].to(tl.float32) * keys[None, :, :].to(tl.float32), axis=2) * scale
        scores = tl.where(visible[None, :], scores, float("-inf"))
        new_m = tl.maximum(m, tl.max(scores, axis=1))
        p = tl.exp(scores - new_m[:, None])
        c = tl.exp(m - new_m)
        values = tl.load(value_cache_ptr + offsets, mask=visible[:, None], other=0.0).to(tl.float32)
        acc = acc * c[:, None] + tl.sum(p[:, :, None] * values[None, :, :], axis=1)
        s_sum = s_sum * c + tl.sum(p, axis=1)
        m = new_m
    tl.store(out_ptr + request * stride_o_tok + heads[:, None] * stride_o_head + dims[None, :],
             (acc / s_sum[:, None]).to(out_ptr.dtype.element_ty), mask=hmask[:, None])


def main():
    for heads, kv_heads, reqs, ctx in [(9, 3, 1, 128), (9, 3, 8, 128), (32, 8, 1, 128), (9, 3, 1, 1024)]:
        dim, bs = 64, 16
        nblk = reqs * (ctx // bs + 2) + 4
        cache = allocate_paged_kv_caches(1, nblk, bs, kv_heads, dim, torch.bfloat16, "cuda")[0].normal_()
        tables = torch.arange(reqs * (ctx // bs + 1), device="cuda").view(reqs, -1)
        lens = torch.full((reqs,), ctx, device="cuda")
        slots = torch.full((reqs,), -1, device="cuda")
        q = torch.randn(reqs, heads, dim, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(reqs, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        out = torch.empty_like(q)
        res = []
        for block_n in (16, 32, 64, 128):
            for warps in (1, 2, 4):
                def run():
                    td._paged_decode_kernel[(reqs, heads)](
                        q, k, v, cache[0], cache[1], out, tables, lens, slots, nblk * bs - 1,
                        q.stride(0), q.stride(1), k.stride(0), v.stride(0), out.stride(0), out.stride(1), tables.stride(0),
                        dim ** -0.5, NUM_KV_HEADS=kv_heads, GROUP=heads // kv_heads, HEAD_DIM=dim, BLOCK_SIZE=bs,
                        BLOCK_N=block_n, num_warps=warps)
                res.append((triton.testing.do_bench(run, return_mode="median") * 1000, f"per-head N={block_n} w={warps}"))
                group = heads // kv_heads
                def run_g():
                    grouped_kernel[(reqs, kv_heads)](
                        q, cache[0], cache[1], out, tables, lens, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
                        tables.stride(0), dim ** -0.5, NUM_KV_HEADS=kv_heads, GROUP=group,
                        GROUP_PAD=max(triton.next_power_of_2(group), 1), HEAD_DIM=dim, BLOCK_SIZE=bs, BLOCK_N=block_n,
                        num_warps=warps)
                res.append((triton.testing.do_bench(run_g, return_mode="median") * 1000, f"grouped  N={block_n} w={warps}"))
        res.sort()
        print(f"heads {heads}/{kv_heads} reqs {reqs} ctx {ctx}: " + "; ".join(f"{t:.1f}us {n}" for t, n in res[:5]),
              f"| current (N=64,w=4): {[t for t, n in res if n == 'per-head N=64 w=4'][0]:.1f}us")
    # what one graph node costs at all: an empty-ish kernel
    x = torch.zeros(1, device="cuda")
    print("tiny add kernel:", triton.testing.do_bench(lambda: x.add_(1), return_mode="median") * 1000, "us")


main()
