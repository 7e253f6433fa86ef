"""Run the README's prediction scenarios on your code, beside your predictions.

Run it from this folder: `python explore.py`. For each step that asks for predictions
(1, 3 and 4) it builds the README's scenario on your layers in `layers.py` and prints
what your code gives next to what you predicted in predictions.py. A few answers are
about torch's number formats rather than your code; those lines say so. Where your code
and your prediction differ, one of the two is wrong: the step's tests say whether it is
your code.
"""

from __future__ import annotations

import math

import layers as mine
import predictions
import torch


def attempt(what, compute):
    """`compute()`, or None after saying why it could not run."""
    try:
        return compute()
    except NotImplementedError:
        print(f"  {what}: not written yet")
    except Exception as exc:  # a bug of a step in progress: say so, go on
        print(f"  {what} raised {type(exc).__name__}: {exc}")
    return None


def step1() -> dict[str, object]:
    """A float16 row of 64 entries, all 300, eps 1e-6; then bfloat16 256 + residual 1."""
    found: dict[str, object] = {}
    x = torch.full((1, 64), 300.0, dtype=torch.float16)
    out = attempt("RMSNorm", lambda: mine.RMSNorm(64, eps=1e-6).to(torch.float16)(x))
    if out is None:
        return found
    found["S1_OUT_FLOAT32_STATISTICS"] = out[0, 0].item()
    print(f"  your RMSNorm: {out[0, :4].tolist()} ... in {out.dtype}")
    squares = x.pow(2)
    print(f"  300^2 in float16: {squares[0, 0].item()} (float16's largest number is 65504)")
    float16_statistics = x * torch.rsqrt(squares.mean(-1, keepdim=True) + 1e-6)
    found["S1_OUT_FLOAT16_STATISTICS"] = float16_statistics[0, 0].item()
    print(f"  float16 statistics (torch, not your code): {found['S1_OUT_FLOAT16_STATISTICS']}")
    norm = mine.RMSNorm(64, eps=1e-6).to(torch.bfloat16)
    x = torch.full((1, 64), 256.0, dtype=torch.bfloat16)
    residual = torch.full((1, 64), 1.0, dtype=torch.bfloat16)
    pair = attempt("RMSNorm with a residual", lambda: norm(x, residual))
    if pair is not None:
        out, new_residual = pair
        found["S1_NEW_RESIDUAL"] = new_residual[0, 0].item()
        print(
            f"  bfloat16 256 + 1: new residual {new_residual[0, 0].item()} in "
            f"{new_residual.dtype}, normalised {out[0, 0].item()} in {out.dtype}"
        )
    return found


def step3() -> dict[str, object]:
    """bfloat16 positions and products (torch), then the relative-position score."""
    found: dict[str, object] = {}
    rope = attempt("RotaryEmbedding", lambda: mine.RotaryEmbedding(2, 64, 10000.0))
    if rope is None:
        return found
    q = k = torch.tensor([[1.0, 0.0]])

    def score(m, n):
        q_rot, _ = rope(torch.tensor([m]), q, k)
        _, k_rot = rope(torch.tensor([n]), q, k)
        return float((q_rot * k_rot).sum())

    scores = attempt("RoPE", lambda: (score(9, 4), score(30, 25)))
    if scores is None:
        return found
    found["S3_SCORE_UNCHANGED"] = math.isclose(scores[1], scores[0], rel_tol=1e-5)
    print(f"  your RoPE: score(9, 4) = {scores[0]:.6f}, score(30, 25) = {scores[1]:.6f}")
    found["S3_BF16_POSITION"] = torch.tensor(1001.0).to(torch.bfloat16).item()
    print(f"  1001 as a bfloat16 (torch, not your code): {found['S3_BF16_POSITION']}")
    product = torch.ones(2).bfloat16() * torch.ones(2)
    found["S3_PRODUCT_DTYPE"] = str(product.dtype).split(".")[-1]
    print(f"  bfloat16 times float32 (torch, not your code): {found['S3_PRODUCT_DTYPE']}")
    long_rope = mine.RotaryEmbedding(2, 2048, 10000.0)
    head = torch.tensor([[1.0, 0.0]]).bfloat16()
    rotated = attempt("RoPE in bfloat16", lambda: long_rope(torch.tensor([1001]), head, head)[0])
    if rotated is not None:
        print(
            f"  your RoPE turns a bfloat16 head [1, 0] at position 1001 to "
            f"{[round(v, 3) for v in rotated[0].float().tolist()]} in {rotated.dtype}; "
            f"[cos 1001, sin 1001] = [{math.cos(1001):.3f}, {math.sin(1001):.3f}]"
        )
    return found


def step4() -> dict[str, object]:
    """SmolLM2-135M's attention shape; then a chunk of 2 tokens on top of 4 cached."""
    found: dict[str, object] = {}
    heads, kv_heads, dim = 9, 3, 64
    values = torch.arange(float(kv_heads)).view(1, kv_heads, 1).expand(1, kv_heads, dim)
    out = attempt(
        "attention, one token",
        lambda: mine.ContiguousAttentionBackend().forward(
            torch.zeros(1, heads, dim),
            torch.zeros(1, kv_heads, dim),
            values.contiguous(),
            torch.zeros(2, 1, 1, kv_heads, dim),
            mine.ContiguousAttentionMetadata.prefill(1, 1),
        ),
    )
    if out is None:
        return found
    read = [round(v) for v in out[0, :, 0].tolist()]
    found["S4_KV_HEAD_OF_QUERY_HEAD_5"] = read[5]
    print(f"  the KV head each of the 9 query heads read: {read}")
    caches = mine.allocate_contiguous_kv_caches(30, 1, 1, kv_heads, dim, torch.bfloat16)
    found["S4_KV_BYTES_PER_TOKEN"] = sum(c.nbytes for c in caches)
    print(f"  a one-token cache for 30 layers, bfloat16: {found['S4_KV_BYTES_PER_TOKEN']} bytes")
    backend, cache = mine.ContiguousAttentionBackend(), torch.zeros(2, 1, 6, 1, 8)
    eye = torch.eye(8)[:6].view(6, 1, 8)  # the value of position p is channel p

    def chunk():
        zeros = torch.zeros(4, 1, 8)
        backend.forward(
            zeros, zeros, eye[:4], cache, mine.ContiguousAttentionMetadata.prefill(1, 4)
        )
        zeros = torch.zeros(2, 1, 8)
        return backend.forward(
            zeros, zeros, eye[4:], cache, mine.ContiguousAttentionMetadata(1, 4, 2)
        )

    out = attempt("attention, a chunk on top of a cache", chunk)
    if out is not None:
        found["S4_KEYS_SEEN"] = int((out[0, 0] > 0).sum())
        weights = [round(w, 3) for w in out[0, 0, :6].tolist()]
        print(f"  weights of the chunk's first token over positions 0..5: {weights}")
    return found


def main() -> None:
    found: dict[str, object] = {}
    for name, scenario in (("step 1", step1), ("step 3", step3), ("step 4", step4)):
        print(f"\n{name}:")
        found.update(attempt(name, scenario) or {})
    print("\nyour predictions beside your code:")
    for answer in (
        "S1_OUT_FLOAT16_STATISTICS",
        "S1_OUT_FLOAT32_STATISTICS",
        "S1_NEW_RESIDUAL",
        "S3_BF16_POSITION",
        "S3_PRODUCT_DTYPE",
        "S3_SCORE_UNCHANGED",
        "S4_KV_HEAD_OF_QUERY_HEAD_5",
        "S4_KV_BYTES_PER_TOKEN",
        "S4_KEYS_SEEN",
    ):
        yours = repr(found[answer]) if answer in found else "(not run)"
        print(
            f"  {answer:27} your code: {yours:10} you predicted: {getattr(predictions, answer)!r}"
        )


if __name__ == "__main__":
    main()
