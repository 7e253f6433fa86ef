"""What the GPU measuring scripts share: a CUDA check, an output folder, and a report.

Every script in scripts/gpu/ runs by hand from the repository root on a machine with an
NVIDIA GPU, prints what it measures, and keeps a copy in its output folder:

    python3 scripts/gpu/host_launch_costs.py                  # -> out/gpu/host_launch_costs.txt
    python3 scripts/gpu/host_launch_costs.py --out /tmp/runs  # -> /tmp/runs/host_launch_costs.txt

Without CUDA a script says so and exits with status 2 instead of failing half-way.

Also here, what only the sweeps need of the product kernels (mini_vllm/kernels/gemv.py),
built on the package's public names: the skinny kernel launched with a tile given
(`skinny_gemm_with_tile`) and the tiles the autotuner picked (`autotuned_tile`,
`gemv_tile_picks`). Everything that needs torch, Triton or mini_vllm imports it inside the
function that uses it, so that a script's `--help` runs on a machine without them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere: mini_vllm comes from the checkout
    sys.path.insert(0, str(ROOT))

DEFAULT_OUT = ROOT / "out" / "gpu"


class Report:
    """Lines printed as they come and written to `<out>/<script name>.txt`."""

    def __init__(self, file: TextIO) -> None:
        self.file = file

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


def run_script(
    script: str,
    description: str,
    measure: Callable[[argparse.Namespace, Report], None],
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    argv: Sequence[str] | None = None,
) -> int:
    """Parse `--out` (and the script's own options), check for CUDA, and run `measure`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="folder for the report (default: out/gpu/ in the checkout)",
    )
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(
            f"{Path(script).name} measures a GPU and needs an NVIDIA GPU with CUDA; "
            f"torch {torch.__version__} sees none here",
            file=sys.stderr,
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{Path(script).stem}.txt"
    with open(path, "w", encoding="utf-8") as file:
        report = Report(file)
        report(
            f"# {Path(script).name} on {torch.cuda.get_device_name()}, torch {torch.__version__}"
        )
        measure(args, report)
    print(f"wrote {path}")
    return 0


def old_package_argument(parser: argparse.ArgumentParser) -> None:
    """The positional OLD of the scripts that compare the checkout with another copy."""
    parser.add_argument(
        "old", type=Path, nargs="?", help="folder holding the other mini_vllm package"
    )


def versions_to_compare(old: Path | None, script: str) -> dict[str, Path]:
    """`{"new": the checkout, "old": OLD}`, each a folder holding a mini_vllm package; exits
    with what to do when OLD is missing or holds no package."""
    if old is None:
        raise SystemExit(f"name the folder holding the other mini_vllm package: {script} OLD")
    old = old.resolve()
    if not (old / "mini_vllm" / "__init__.py").is_file():
        raise SystemExit(f"{old} holds no mini_vllm package (expected {old}/mini_vllm/)")
    return {"new": ROOT, "old": old}


def product_time_us(fn: Callable[[], object]) -> float:
    """Median time in µs of one call of `fn` inside a CUDA graph of 20 calls (10 replays,
    3 warm-up calls): the engine's timer (mini_vllm/kernels/gemv.py `graph_time_us`),
    with more of everything than the engine's quick choice uses."""
    from mini_vllm.kernels.gemv import graph_time_us

    return graph_time_us(fn, calls=20, replays=10, warmups=3)


def skinny_gemm_with_tile(
    x,
    weight,
    out,
    prologue: int,
    tile: tuple[int, int, int, int],
    residual=None,
    norm_weight=None,
    residual_out=None,
    eps: float = 0.0,
) -> None:
    """The skinny kernel for 2 to 64 rows of `x` into `out`, with `prologue` and the tile
    `(BLOCK_N, BLOCK_K, warps, stages)` given instead of the autotuner's pick: what
    scripts/gpu/skinny_tiles.py sweeps. The arguments are those the package's products
    launch the kernel with (mini_vllm/kernels/gemv.py), a prologue's tensors included."""
    import triton

    from mini_vllm.kernels import gemv

    m, n, k = x.shape[0], weight.shape[0], weight.shape[1]
    if not 2 <= m <= gemv.MAX_ROWS:
        raise ValueError(
            f"the skinny kernel takes 2 to {gemv.MAX_ROWS} rows; got {m} (one row is the "
            f"GEMV's: triton_gemv)"
        )
    block_n, block_k, warps, stages = tile
    pdl = gemv.pdl_supported(x.device)
    tensors = gemv.pointer_arguments(x, weight, out, residual, norm_weight, residual_out)
    # `.fn`: the kernel under its autotuner, so that the tile given here is the one run.
    gemv.skinny_gemm_kernel.fn[(triton.cdiv(n, block_n),)](
        *tensors[:3], m, n, k, x.stride(0), weight.stride(0), *tensors[3:], eps,
        PROLOGUE=prologue, PDL=pdl, BLOCK_M=gemv.row_bucket(m), BLOCK_N=block_n,
        BLOCK_K=block_k, num_warps=warps, num_stages=stages,
        **({"launch_pdl": True} if pdl else {}),
    )  # fmt: skip


def autotuned_tile(x, weight) -> dict[str, int]:
    """The tile the autotuner picked for the plain product `x @ weight.T` (tuning it now if
    this shape is new): `{"BLOCK_N": ..., "BLOCK_K": ..., "num_warps": ...}`."""
    from mini_vllm.kernels import gemv

    gemv.triton_gemv(x, weight)
    block_m = None if x.shape[0] == 1 else gemv.row_bucket(x.shape[0])
    key = (*weight.shape, block_m, gemv.PLAIN, gemv.pdl_supported(x.device), x.device)
    config = gemv.tile_picks()[key]
    return {**config.kwargs, "num_warps": config.num_warps}


def gemv_tile_picks() -> dict[tuple[int, int, int], dict[str, int]]:
    """The tiles this process's GEMV launches use, by (N, K, prologue): what the autotuner
    picked, or read from Triton's cache, for each matrix the GEMV has run on."""
    from mini_vllm.kernels import gemv

    picks = {
        (n, k, prologue): {**config.kwargs, "num_warps": config.num_warps}
        for (n, k, block_m, prologue, _pdl, _device), config in gemv.tile_picks().items()
        if block_m is None  # the skinny kernel's row buckets are not the GEMV's
    }
    return dict(sorted(picks.items()))


def host_us(fn: Callable[[], object], calls: int = 200, warmups: int = 1) -> float:
    """Median host time of one call of `fn`, in µs: `warmups` untimed calls and a sync,
    then `calls` calls timed back to back with no sync inside the loop, so the GPU work
    queues up behind and only what the host pays is counted."""
    import statistics
    import time

    import torch

    for _ in range(warmups):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def engine_options(parser: argparse.ArgumentParser, mode: str) -> None:
    """--model (a model shape) and --mode (an engine mode of mini_vllm.bench.harness.MODES)."""
    from mini_vllm.bench.harness import MODES

    parser.add_argument(
        "--model", default="smollm2-135m", help="a model shape (default: %(default)s)"
    )
    parser.add_argument(
        "--mode", default=mode, choices=sorted(MODES), help="engine mode (default: %(default)s)"
    )


def decoding_engine(args: argparse.Namespace, new_tokens: int, warm_steps: int, batch: int = 1):
    """An engine of `args.mode` on `args.model` whose next steps decode `batch` requests
    (context 128), after `warm_steps` untimed decode steps."""
    from mini_vllm.bench.harness import decode_engine, start_decoding
    from mini_vllm.models.loader import load_model

    # bfloat16, as `bench decode` runs a model on a GPU ("auto"); the loader's own default
    # is float32, which doubles every product's weight reads.
    model, _, _ = load_model(args.model, device="cuda", dtype="auto", progress=False)
    engine = decode_engine(model, args.mode, [batch], context_len=128, new_tokens=new_tokens)
    start_decoding(engine, batch=batch, context_len=128, new_tokens=new_tokens)
    for _ in range(warm_steps):
        engine.step()
    return engine


def decode_attention_inputs(
    reqs: int, heads: int, kv_heads: int, dim: int, ctx: int, copies: int = 1
) -> tuple:
    """Arguments of `triton_paged_decode` for `reqs` requests of `ctx` cached tokens each
    (bf16, random; blocks of 16 tokens, the slots -1 as for padded rows): `copies` KV
    caches of one layer, then the block tables, the lengths, the slots, q, k, v and an
    output."""
    import torch

    from mini_vllm.attention.paged import allocate_paged_kv_caches

    block = 16
    width = ctx // block + 1
    caches = [
        allocate_paged_kv_caches(1, reqs * width + 1, block, kv_heads, dim, torch.bfloat16, "cuda")[
            0
        ].normal_()
        for _ in range(copies)
    ]
    tables = torch.arange(reqs * width, device="cuda").view(reqs, width)
    lens = torch.full((reqs,), ctx, device="cuda")
    slots = torch.full((reqs,), -1, device="cuda")
    q = torch.randn(reqs, heads, dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(reqs, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    # Timers such as triton.testing.do_bench_cudagraph run on a stream of their own, which
    # does not wait for this one: without the wait they could read a block table that is
    # not yet written (memory freed by an earlier case, holding anything).
    torch.cuda.synchronize()
    return caches, tables, lens, slots, q, k, v, torch.empty_like(q)


def host_profile(engine, steps: int, orders: Sequence[tuple[str, int]]) -> list[str]:
    """cProfile of `steps` engine steps: one table per (sort order, rows)."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        engine.step()
    profiler.disable()
    tables = []
    for order, rows in orders:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(rows)
        tables.append(text.getvalue())
    return tables
