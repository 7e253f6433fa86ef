"""Run the README's scenarios on your code, beside your predictions: `python explore.py`.

Run it from this folder once a step's tests pass. For every question of predictions.py it
prints what your code gives and what you predicted; where they differ, one of the two is
wrong, and the step's tests say whether it is your code. The two-rank questions start two
processes joined by gloo, as the tests do.
"""

from __future__ import annotations

import os
import sys
import tempfile

import parallel_linear as mine
import predictions
import torch
import torch.multiprocessing as torch_mp

from mini_vllm.distributed.parallel_state import (
    GroupCoordinator,
    destroy_distributed_environment,
    init_distributed_environment,
    initialize_model_parallel,
    patch_tensor_parallel_group,
)


def show(name: str, compute) -> None:
    predicted = getattr(predictions, name, None)
    try:
        value = compute()
    except NotImplementedError:
        print(f"{name:26} your code: (not written yet)   you predicted: {predicted!r}")
        return
    except Exception as exc:  # a bug of a step in progress: say so, go on with the others
        print(f"{name:26} your code raised {type(exc).__name__}: {str(exc)[:200]}")
        return
    print(f"{name:26} your code: {value!r:<20} you predicted: {predicted!r}")


def randn(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def load(layer, tensor, shard_id=None):
    layer.weight.weight_loader(layer.weight, tensor, shard_id)
    return layer


def whole(make):
    with patch_tensor_parallel_group(GroupCoordinator.single()):
        return make()


def layers_c_and_r(rank: int, out_dir: str) -> None:
    """The README's C = ColumnParallelLinear(96, 64) and R = RowParallelLinear(96, 64),
    x of 8 tokens, float32: rank `rank`'s results against the whole layers'."""
    x, w = randn(1, 8, 96), randn(2, 64, 96)
    cols, ins = slice(32 * rank, 32 * rank + 32), slice(48 * rank, 48 * rank + 48)
    c = load(mine.ColumnParallelLinear(96, 64), w)(x)
    c_whole = load(whole(lambda: mine.ColumnParallelLinear(96, 64)), w)(x)[:, cols]
    r = load(mine.RowParallelLinear(96, 64), w)(x[:, ins].contiguous())
    r_whole = load(whole(lambda: mine.RowParallelLinear(96, 64)), w)(x)
    result = {
        "COLUMN_TP2_BITWISE_EQUAL": bool(torch.equal(c, c_whole)),
        "ROW_TP2_BITWISE_EQUAL": bool(torch.equal(r, r_whole)),
        "ROW_TP2_WITHIN_1E_4": bool(torch.allclose(r, r_whole, atol=1e-4, rtol=0)),
        "largest difference of R": float((r - r_whole).abs().max()),
    }
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))


def rank_main(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    init_distributed_environment(2, rank, f"file://{init_file}", "gloo", 30)
    initialize_model_parallel(2)
    try:
        layers_c_and_r(rank, out_dir)
    finally:
        destroy_distributed_environment()


def two_rank_answers() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        start = "fork" if sys.platform == "linux" else "spawn"
        torch_mp.start_processes(
            rank_main, args=(os.path.join(tmp, "init"), tmp), nprocs=2, start_method=start
        )
        ranks = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(2)]
    return {
        k: all(r[k] for r in ranks) if isinstance(ranks[0][k], bool) else max(r[k] for r in ranks)
        for k in ranks[0]
    }


def not_yet():
    raise NotImplementedError("the ranks did not finish: steps 1 and 2 first")


def qkv_bytes() -> int:
    with patch_tensor_parallel_group(GroupCoordinator("tp:explore", 2, 1)):
        layer = mine.QKVParallelLinear(64, 16, 4, 1)
    return layer.weight.numel() * layer.weight.element_size()


def kv_head_of_rank_3() -> int:
    marked = torch.arange(2).repeat_interleave(4)[:, None].expand(8, 16).float()  # row: head
    with patch_tensor_parallel_group(GroupCoordinator("tp:explore", 4, 3)):
        layer = mine.QKVParallelLinear(16, 4, 8, 2)
    load(layer, marked, "k")
    return int(layer.weight.data[layer.q_size, 0])


def main() -> None:
    print("Before step 2: the layers C and R on two ranks")
    try:
        answers = two_rank_answers()
    except Exception as exc:  # a rank's error, shortened
        text = str(exc).strip().splitlines()
        print(f"  the ranks failed: {text[-1] if text else exc!r}")
        answers = {}
    for name in ("COLUMN_TP2_BITWISE_EQUAL", "ROW_TP2_BITWISE_EQUAL", "ROW_TP2_WITHIN_1E_4"):
        show(name, lambda n=name: answers[n] if answers else not_yet())
    if answers:
        largest = answers["largest difference of R"]
        print(f"  (R's largest difference from the whole layer: {largest:.3g})")

    print("\nBefore step 4: q, k and v")
    show("QKV_BYTES_PER_RANK", qkv_bytes)
    show("KV_HEAD_OF_RANK_3", kv_head_of_rank_3)


if __name__ == "__main__":
    main()
