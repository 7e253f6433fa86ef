"""Decode's matrix products, `x @ W.T` for 1 to 64 rows, as Triton kernels (CUDA only).

vLLM counterpart: none in the same form. vLLM leaves bf16 products to cuBLAS
(vllm/model_executor/layers/utils.py `default_unquantized_gemm`) and writes its own
kernels for the quantized ones (e.g. the GPTQ/AWQ GEMV kernels under csrc/quantization);
gpt-fast (generate.py) gets its batch-1 speed from Inductor and int8 weights. Here the
kernel exists because of a measurement: at batch 1 a decode step's products are
matrix-vector products, pure reads of the weight, and on the course's H100 cuBLAS's
bf16 kernels for them (`gemv2T_kernel_val`, `gemvx`) read the 1B model's matrices at a
third to a half of what the memory can deliver (benchmarks/results/eager-cuda.md).

The kernel is the textbook one: each program owns BLOCK_N rows of W, walks along K in
BLOCK_K-wide tiles (one coalesced load of a [BLOCK_N, BLOCK_K] tile of W and the
matching slice of x per step, accumulated in float32) and reduces at the end. W is
read exactly once and marked evict-first: nothing will read it again this step. The
tile shape is autotuned per matrix shape, at the first call, which the engine makes
in its warm-up runs before any CUDA graph is captured.

From two rows to MAX_ROWS (64), with MINI_VLLM_SKINNY_GEMM=1 (off by default: what it
gains at batch 8 costs minutes of cold start, tuning every shape and row bucket;
benchmarks/results/decode-graphs-cuda-skinny.md), the skinny GEMM below takes over where
it measures faster: the same program
layout, but each program multiplies its tile of W with every row of x on the tensor
cores (`tl.dot`), rows padded to 16, 32 or 64 by masks, so that W is still read once per
step. Decode at batch 8-32 is as much a read of the weights as batch 1: cuBLAS's GEMM
gets the bytes right, but it needs the norm and the activation as kernels of their own,
three a layer, and in a CUDA graph of a small model every kernel costs its few
microseconds (measured: benchmarks/results/decode-graphs-cuda-skinny.md). Beyond 64 rows
(prefill) cuBLAS. Under torch.compile the choice is made at run time inside the opaque
op `mini_vllm::linear`, because one compiled graph serves every token count.

Prologues. The rows of x are tiny next to W, so the kernel can afford to compute it from
whatever came before instead of reading it finished: RMSNorm of x (with or without the
residual add; program 0 then also writes the new residual) or SwiGLU's silu(gate) * up.
That removes the norm's and the activation's own kernels, three a Llama layer. The
compile-time fusion pass (mini_vllm/compilation/passes/fusion.py) puts these variants in
place through the ops of mini_vllm/kernels/fused_ops.py.

Programmatic dependent launch (PDL, Hopper and later). A GEMV's weights do not depend
on the kernel before it, only x does. Launched with PDL, the kernel may start while the
previous one is still finishing: it requests its first tile of W, then waits
(`gdc_wait`) until the previous kernel's writes are visible, then reads x. That hides
part of each kernel's start-up, which at batch 1 on a small model is most of its time
(benchmarks/results/decode-graphs-cuda-fusion.md). MINI_VLLM_PDL=0 turns it off; a Triton
without it turns it off too (mini_vllm/compat.py).
"""

from __future__ import annotations

import functools
import time

import torch
import torch.nn.functional as F

from mini_vllm import compat, envs
from mini_vllm.kernels.launch import direct_launcher

try:
    import triton
    import triton.language as tl
    import triton.testing
except ImportError:  # CPU machines
    triton = None

__all__ = [
    "MAX_ROWS",
    "autotune_seconds",
    "graph_call_times_us",
    "graph_time_us",
    "linear_cuda",
    "pdl_supported",
    "pointer_arguments",
    "row_bucket",
    "skinny_is_faster",
    "tile_picks",
    "triton_gemv",
    "triton_gemv_available",
    "triton_rms_norm_gemv",
    "triton_silu_and_mul_gemv",
]


# Up to this many rows a product takes the Triton kernels below (one row: the GEMV; more:
# the skinny GEMM); from there on cuBLAS. Decode batches of a serving engine live here.
MAX_ROWS = 64


def triton_gemv_available(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `x @ weight.T` can take the Triton kernels of this file.

    One row in any dtype; 2 to MAX_ROWS rows only with MINI_VLLM_SKINNY_GEMM=1 and in half
    precision, since the skinny kernel multiplies on the tensor cores and float32 there
    would be TF32, not the float32 product the engine's equality checks compare against.
    """
    if triton is None or x.dim() != 2 or weight.dim() != 2:
        return False
    rows = x.shape[0]
    # The row count first: most products of a batch of several rows stop here.
    if rows != 1 and not (
        1 < rows <= MAX_ROWS and x.dtype in (torch.bfloat16, torch.float16) and _skinny_enabled()
    ):
        return False
    return (
        x.is_cuda
        and weight.is_cuda
        and x.stride(-1) == 1
        and weight.stride(-1) == 1
        and x.dtype == weight.dtype
    )


@functools.cache
def _skinny_enabled() -> bool:
    # Off by default: its gain at batch 8 costs minutes of cold start, tuning and measuring
    # every shape and row bucket (benchmarks/results/decode-graphs-cuda-skinny.md). Read
    # once: products are hot.
    return envs.MINI_VLLM_SKINNY_GEMM


if triton is not None:

    def _configs():
        # (BLOCK_N, BLOCK_K, warps). The BLOCK_K >= 1024 tiles cover a whole row of a
        # small model's matrices (K = 576 or 1536 for SmolLM2), so that a program issues
        # all of its weight loads at once; under programmatic dependent launch (below)
        # they are issued before the wait, and the whole read overlaps the tail of the
        # kernel ahead. Timed as they run (`tile_time_ms`), the picks are almost all such
        # whole-row tiles (scripts/gpu/gemv_tiles.py prints them;
        # benchmarks/results/tile-timing-cuda.md).
        shapes = [
            (4, 256, 4),
            (8, 256, 4),
            (16, 256, 4),
            (32, 256, 8),
            (8, 512, 4),
            (16, 512, 8),
            (4, 512, 4),
            (2, 1024, 4),
            (16, 128, 4),
            (32, 128, 4),
            (64, 128, 8),
            (4, 1024, 4),
            (8, 1024, 8),
            (16, 1024, 8),
            (4, 2048, 8),
            (8, 2048, 8),
        ]
        return [triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w) for n, k, w in shapes]

    # Keep the tuning results on disk (Triton's cache) where this Triton can: tuning all
    # configurations for the first time costs seconds at engine start-up.
    _cache_tuning = {"cache_results": True} if compat.autotune_accepts("cache_results") else {}
    # How the GEMV's tiles are timed: as the engine runs them (`tile_time_ms` below), or
    # with MINI_VLLM_TILE_TIMING=triton by Triton's default, which launches each call alone
    # after flushing the L2 cache, for 125 ms a tile.
    _tune_as_in_graph = (
        {"do_bench": lambda kernel_call, quantiles: _time_tile(kernel_call, quantiles)}
        if compat.autotune_accepts("do_bench")
        else {}
    )
    # The skinny kernel's tiles: each timed alone for a few milliseconds, not Triton's
    # 25 + 100, since it is tuned for three row buckets of every matrix at start-up. Timed
    # in a graph instead, its picks made batch 8 no faster and its choice against cuBLAS
    # unsteady (benchmarks/results/decode-graphs-cuda-skinny.md), so it keeps this.
    _quick_tuning = (
        {"do_bench": functools.partial(triton.testing.do_bench, warmup=5, rep=20)}
        if compat.autotune_accepts("do_bench")
        else {}
    )

    # ANCHOR: gemv_kernel
    @triton.autotune(
        configs=_configs(),
        key=["N", "K", "PROLOGUE", "PDL"],
        **_cache_tuning,
        **_tune_as_in_graph,
    )
    @triton.jit
    def gemv_kernel(
        x_ptr,
        w_ptr,
        out_ptr,
        N,
        K,
        stride_wn,
        residual_ptr,
        norm_weight_ptr,
        residual_out_ptr,
        eps,
        PROLOGUE: tl.constexpr,
        PDL: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        pid = tl.program_id(0)
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        row_mask = rows < N
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        squares = tl.zeros((BLOCK_K,), dtype=tl.float32)  # the RMSNorm prologues' statistics
        # The first tile of W is requested before anything else: no kernel writes weights,
        # so under programmatic dependent launch (PDL) this load may start while the
        # kernel before is still finishing; x, its output, is read only after the wait.
        w = _load_w_tile(w_ptr, rows, row_mask, 0, K, stride_wn, BLOCK_K)
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()  # the next kernel may start its own prefetch
            tl.extra.cuda.gdc_wait()  # every earlier kernel has finished and its writes are visible
        for k0 in range(0, K, BLOCK_K):
            if k0 > 0:
                w = _load_w_tile(w_ptr, rows, row_mask, k0, K, stride_wn, BLOCK_K)
            cols = k0 + tl.arange(0, BLOCK_K)
            col_mask = cols < K
            if PROLOGUE == 3:
                x = _silu_and_mul_tile(x_ptr, cols, col_mask, K)
            else:
                x = tl.load(x_ptr + cols, mask=col_mask, other=0.0)
            if PROLOGUE == 1 or PROLOGUE == 2:
                x, squares = _rms_norm_tile(
                    x,
                    squares,
                    residual_ptr,
                    norm_weight_ptr,
                    residual_out_ptr,
                    cols,
                    col_mask,
                    pid == 0,
                    PROLOGUE == 2,
                )
            acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        out = tl.sum(acc, axis=1)
        if PROLOGUE == 1 or PROLOGUE == 2:
            out = out * tl.rsqrt(tl.sum(squares, axis=0) / K + eps)  # 1 / RMS, applied last
        tl.store(out_ptr + rows, out.to(out_ptr.dtype.element_ty), mask=row_mask)

    @triton.jit
    def _load_w_tile(w_ptr, rows, row_mask, k0, K, stride_wn, BLOCK_K: tl.constexpr):
        cols = k0 + tl.arange(0, BLOCK_K)
        # Read once per step and never again in it: evict-first keeps L2 for the activations.
        return tl.load(
            w_ptr + rows[:, None] * stride_wn + cols[None, :],
            mask=row_mask[:, None] & (cols < K)[None, :],
            other=0.0,
            eviction_policy="evict_first",
        )

    # ANCHOR_END: gemv_kernel

    # ANCHOR: gemv_prologues
    # The prologues do, for one row and inside the product's own loop, what a norm or the
    # activation before the product would have done in a kernel of its own. Every program
    # redoes them: the row is a few kilobytes, read from L2, against the tens of kilobytes
    # of W each program streams.
    @triton.jit
    def _rms_norm_tile(
        x,
        squares,
        residual_ptr,
        norm_weight_ptr,
        residual_out_ptr,
        cols,
        mask,
        write_residual,
        ADD_RESIDUAL: tl.constexpr,
    ):
        """One tile of (x [+ residual]) * norm weight, and its squares for the statistics.

        RMSNorm's 1/RMS is one number for the whole row, so it can multiply the finished
        dot product instead of every input: sum_k W[n,k] h[k] g[k] / RMS(h). One pass
        over the row instead of two (statistics, then product); the price is that the
        normalised row is not rounded to the activation dtype before the product, as the
        unfused ops round it (a difference in the last bits, within the tests' tolerance).
        """
        if ADD_RESIDUAL:
            r = tl.load(residual_ptr + cols, mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # rounded, as torch's add
            tl.store(
                residual_out_ptr + cols, x, mask=mask & write_residual
            )  # program 0 keeps the sum
        h = x.to(tl.float32)
        g = tl.load(norm_weight_ptr + cols, mask=mask, other=0.0)
        return h * g.to(tl.float32), squares + h * h

    @triton.jit
    def _silu_and_mul_tile(x_ptr, cols, mask, K):
        """silu(gate) * up for one tile of a row laid out
        [gate (K) | up (K)], rounded as torch rounds."""
        gate = tl.load(x_ptr + cols, mask=mask, other=0.0)
        up = tl.load(x_ptr + K + cols, mask=mask, other=0.0)
        g = gate.to(tl.float32)
        activated = (g * tl.sigmoid(g)).to(gate.dtype)
        return (activated.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)

    # ANCHOR_END: gemv_prologues

    def _skinny_configs():
        # (BLOCK_N, BLOCK_K, warps, stages). tl.dot needs at least 16 in every dimension;
        # the rows of x are padded to BLOCK_M (16, 32 or 64) by masks. Narrow BLOCK_N keeps
        # enough programs for the 132 SMs on a small model's matrices (576 rows: 36
        # programs of 16); wide BLOCK_K tiles issue a row's loads at once, as the GEMV's.
        shapes = [
            (16, 128, 4, 3),
            (16, 256, 4, 2),
            (32, 128, 4, 3),
            (32, 256, 4, 2),
            (64, 128, 4, 3),
            (64, 256, 8, 2),
            (16, 512, 4, 1),
            (32, 512, 8, 1),
        ]
        return [
            triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=st)
            for n, k, w, st in shapes
        ]

    # ANCHOR: skinny_kernel
    @triton.autotune(
        configs=_skinny_configs(),
        key=["N", "K", "BLOCK_M", "PROLOGUE", "PDL"],
        **_cache_tuning,
        **_quick_tuning,
    )
    @triton.jit
    def skinny_gemm_kernel(
        x_ptr,
        w_ptr,
        out_ptr,
        M,
        N,
        K,
        stride_xm,
        stride_wn,
        residual_ptr,
        norm_weight_ptr,
        residual_out_ptr,
        eps,
        PROLOGUE: tl.constexpr,
        PDL: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        """The GEMV for 2 to 64 rows: each program streams BLOCK_N rows of W once and
        multiplies them with every row of x (tl.dot on the tensor cores), so W is read
        once whatever the batch; the prologues as in the GEMV, a statistic per row."""
        pid = tl.program_id(0)
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        row_mask = rows < N
        tokens = tl.arange(0, BLOCK_M)
        token_mask = tokens < M
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        squares = tl.zeros((BLOCK_M,), dtype=tl.float32)
        w = _load_w_tile(w_ptr, rows, row_mask, 0, K, stride_wn, BLOCK_K)  # before the wait
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        for k0 in range(0, K, BLOCK_K):
            if k0 > 0:
                w = _load_w_tile(w_ptr, rows, row_mask, k0, K, stride_wn, BLOCK_K)
            acc, squares = _skinny_step(
                acc,
                squares,
                w,
                k0,
                x_ptr,
                tokens,
                token_mask,
                K,
                stride_xm,
                residual_ptr,
                norm_weight_ptr,
                residual_out_ptr,
                pid == 0,
                PROLOGUE,
                BLOCK_K,
            )
        if PROLOGUE == 1 or PROLOGUE == 2:
            acc = acc * tl.rsqrt(squares / K + eps)[:, None]  # 1 / RMS of each row
        out = out_ptr + tokens[:, None] * N + rows[None, :]
        out_mask = token_mask[:, None] & row_mask[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=out_mask)

    @triton.jit
    def _skinny_step(
        acc,
        squares,
        w,
        k0,
        x_ptr,
        tokens,
        token_mask,
        K,
        stride_xm,
        residual_ptr,
        norm_weight_ptr,
        residual_out_ptr,
        write_residual,
        PROLOGUE: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        """One BLOCK_K-wide tile: the rows' inputs (through the prologue), times W's tile."""
        cols = k0 + tl.arange(0, BLOCK_K)
        col_mask = cols < K
        mask = token_mask[:, None] & col_mask[None, :]
        at = tokens[:, None] * stride_xm + cols[None, :]
        if PROLOGUE == 3:
            gate = tl.load(x_ptr + at, mask=mask, other=0.0)
            up = tl.load(x_ptr + at + K, mask=mask, other=0.0)
            g = gate.to(tl.float32)
            activated = (g * tl.sigmoid(g)).to(gate.dtype)
            x = (activated.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)
        else:
            x = tl.load(x_ptr + at, mask=mask, other=0.0)
        if PROLOGUE == 1 or PROLOGUE == 2:
            if PROLOGUE == 2:
                r = tl.load(residual_ptr + at, mask=mask, other=0.0)
                x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
                tl.store(residual_out_ptr + at, x, mask=mask & write_residual)
            h = x.to(tl.float32)
            squares += tl.sum(h * h, axis=1)
            g = tl.load(norm_weight_ptr + cols, mask=col_mask, other=0.0)
            x = (h * g.to(tl.float32)[None, :]).to(w.dtype)
        return tl.dot(x, tl.trans(w), acc), squares

    # ANCHOR_END: skinny_kernel

# The prologues a product kernel can run (the kernels' PROLOGUE).
PLAIN, RMS_NORM, ADD_RMS_NORM, SILU_AND_MUL = 0, 1, 2, 3


# Programmatic dependent launch (CUDA 12, Hopper on): a kernel launched with it may start
# before the one ahead of it in the stream has finished, up to its `gdc_wait`. Kept
# switchable (MINI_VLLM_PDL=0) so that its effect can be measured; read once per device.
@functools.cache
def pdl_supported(device: torch.device) -> bool:
    return (
        envs.MINI_VLLM_PDL
        and triton is not None
        and compat.pdl_available()
        and torch.cuda.get_device_capability(device)[0] >= 9
    )


# ANCHOR: gemv_launch
# Launching through Triton's autotuner and JIT front end costs the host several times
# what cuBLAS's launch costs (scripts/gpu/host_launch_costs.py;
# benchmarks/results/eager-cuda.md). The LM head's GEMV runs outside the graph every
# step, and eager mode runs every product of the step this way, so the first launch for
# a given signature goes through the autotuner and the compiled kernel it returns is then
# launched directly (mini_vllm/kernels/launch.py). The key holds everything Triton
# specialises a kernel on: the integer arguments, the dtypes, and whether each pointer
# is 16-byte aligned (a kernel compiled for aligned rows must not get a misaligned view),
# and the device.
_compiled_launches: dict[tuple, tuple] = {}
_tiles: dict[tuple, object] = {}  # the autotuner's pick per (N, K, BLOCK_M, prologue, PDL, device)
# Seconds spent in first launches (the autotuner timing every tile, or reading its cached
# pick, and Triton compiling): what a start-up report shows as autotuning.
_first_launch_seconds = [0.0]


def autotune_seconds() -> float:
    """Seconds this process has spent in the kernels' first launches (tuning, compiling)."""
    return _first_launch_seconds[0]


def row_bucket(rows: int) -> int:
    """The skinny kernel's BLOCK_M for `rows` (2 to 64): 16, 32 or 64."""
    return max(16, 1 << (rows - 1).bit_length())


def pointer_arguments(x, weight, out, residual, norm_weight, residual_out) -> tuple:
    """The kernels' six pointer arguments; a prologue's tensor that is not passed points
    at x or out (never read or written without its prologue)."""
    return (
        x,
        weight,
        out,
        residual if residual is not None else x,
        norm_weight if norm_weight is not None else x,
        residual_out if residual_out is not None else out,
    )


def _launch(x, weight, prologue, residual=None, norm_weight=None, residual_out=None, eps=0.0):
    m, n, k = x.shape[0], weight.shape[0], weight.shape[1]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    pdl = pdl_supported(x.device)
    tensors = pointer_arguments(x, weight, out, residual, norm_weight, residual_out)
    if m == 1:
        kernel, ints, block_m = gemv_kernel, (n, k, weight.stride(0)), None
    else:
        kernel, ints = skinny_gemm_kernel, (m, n, k, x.stride(0), weight.stride(0))
        block_m = row_bucket(m)
    addresses = [t.data_ptr() for t in tensors]
    # Triton specialises an integer argument on its value being 1 and on its divisibility
    # by 16: the row count enters the key that way, so one kernel serves 17 to 31 rows.
    key = (
        ints if m == 1 else (m % 16 == 0, block_m, *ints[1:]),
        prologue,
        pdl,
        x.device,
        *[(t.dtype, a % 16 == 0, t.is_cuda) for t, a in zip(tensors, addresses)],
    )
    known = _compiled_launches.get(key)
    if known is not None:
        # Pointers as addresses, as mini_vllm/kernels/launch.py `specialise` explains.
        launcher, grid, constants = known
        launcher(grid, (*addresses[:3], *ints, *addresses[3:], eps, *constants))
        return out
    args = (*tensors[:3], *ints, *tensors[3:], eps)
    extra = {} if block_m is None else {"BLOCK_M": block_m}
    started = time.perf_counter()
    compiled = kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](
        *args,
        PROLOGUE=prologue,
        PDL=pdl,
        **extra,
        **({"launch_pdl": True} if pdl else {}),
    )
    _first_launch_seconds[0] += time.perf_counter() - started
    best = compat.autotuned_config(kernel)
    _tiles[(n, k, block_m, prologue, pdl, x.device)] = best
    launcher = direct_launcher(compiled)
    if launcher is not None:  # a CompiledKernel of a Triton that allows it: keep it
        grid = (triton.cdiv(n, best.kwargs["BLOCK_N"]), 1, 1)
        _compiled_launches[key] = (
            launcher,
            grid,
            (prologue, pdl, *extra.values(), best.kwargs["BLOCK_N"], best.kwargs["BLOCK_K"]),
        )
    return out


# ANCHOR_END: gemv_launch


# ANCHOR: skinny_choice
# The skinny GEMM does not win everywhere: with a prologue, every program redoes the norm
# for all its rows, and a long K with few output rows leaves SMs idle where cuBLAS splits
# K (scripts/gpu/skinny_gemm.py measures both per matrix). So for 2 to 64 rows the choice
# is measured, once per matrix shape, row bucket and prologue, the first time that
# product runs outside a capture (the engine's warm-up runs): each candidate replayed in
# a CUDA graph, where launch costs vanish as they do in the engine's graphs.
_skinny_choices: dict[tuple, bool] = {}


def graph_call_times_us(fn, calls: int = 10, replays: int = 3, warmups: int = 1) -> list[float]:
    """The time in µs of one call of `fn` in each of `replays` replays of a CUDA graph of
    `calls` calls back to back: no host launch is counted, and under programmatic dependent
    launch each call overlaps the one before, as kernels do in the engine's graphs. The
    warm-up calls, where a Triton kernel is compiled, run on the side stream of the capture,
    as PyTorch asks. The capture is begun and ended by hand: `torch.cuda.graph` would also
    run Python's garbage collector for each of the hundreds of tiles a cold start times,
    which the engine's own capture avoids for the same reason (CUDAGraphWrapper's
    `gc_disable`)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            fn()
        graph.capture_begin()
        try:
            for _ in range(calls):
                fn()
        finally:
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()  # the first replay uploads the graph: not timed
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return times


def graph_time_us(fn, calls: int = 10, replays: int = 3, warmups: int = 1) -> float:
    """Median of `graph_call_times_us`: the engine's choice below uses the defaults,
    scripts/gpu/skinny_gemm.py more of everything."""
    times = sorted(graph_call_times_us(fn, calls, replays, warmups))
    return times[len(times) // 2]


# ANCHOR: tile_time
def tile_time_ms(kernel_call, quantiles=(0.5,), calls: int = 20, replays: int = 10) -> list[float]:
    """The autotuner's timing of one tile (Triton's `do_bench` contract: the `quantiles` of
    the time of one call, in ms), taken as the engine runs the kernel: back to back in a
    CUDA graph, programmatic dependent launch included.

    Why not Triton's default: it times each call alone, after flushing the L2 cache. For
    these 2-4 µs kernels the tiles then measure within noise of one another, and the
    pick, kept in Triton's cache for every later start, changed from one cold start to
    the next. In a graph, where the next kernel's loads overlap the tail of the one
    before, tiles that request a whole row at once win, and the picks hold from start to
    start, and so does the step time (benchmarks/results/tile-timing-cuda.md,
    scripts/gpu/tile_timing.py).
    """
    times = sorted(graph_call_times_us(kernel_call, calls, replays))
    ms = [t / 1000 for t in times]
    return [ms[min(len(ms) - 1, int(q * len(ms)))] for q in quantiles]


# ANCHOR_END: tile_time


def _time_tile(kernel_call, quantiles) -> list[float]:
    if envs.MINI_VLLM_TILE_TIMING == "triton":
        return triton.testing.do_bench(kernel_call, quantiles=quantiles)
    return tile_time_ms(kernel_call, quantiles)


def skinny_is_faster(x, weight, prologue: int, skinny, fallback) -> bool:
    """Whether `skinny()` beats `fallback()` (the unfused ops, cuBLAS) for `x`'s row
    bucket; measured at the first such call outside a CUDA graph capture, then kept. In a
    capture before any measurement, the fallback (always correct, never slower to try)."""
    key = (*weight.shape, row_bucket(x.shape[0]), prologue, x.dtype, x.device)
    choice = _skinny_choices.get(key)
    if choice is None:
        if torch.cuda.is_current_stream_capturing():
            return False
        started, counted = time.perf_counter(), _first_launch_seconds[0]
        choice = _skinny_choices[key] = graph_time_us(skinny) < graph_time_us(fallback)
        # The first launches inside were counted already: add only the rest.
        inside = _first_launch_seconds[0] - counted
        _first_launch_seconds[0] += time.perf_counter() - started - inside
    return choice


# ANCHOR_END: skinny_choice


def tile_picks() -> dict[tuple, object]:
    """The tiles this process's product launches use, by (N, K, BLOCK_M or None for the
    GEMV, prologue, PDL, device): what the autotuner picked, or read from Triton's cache."""
    return dict(_tiles)


def triton_gemv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`F.linear(x, weight)` for x `[M, K]` (`triton_gemv_available`) and a row-major
    weight `[N, K]`."""
    return _launch(x, weight, PLAIN)


def triton_rms_norm_gemv(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
):
    """`linear(RMSNorm(x [+ residual]), weight)` for up to MAX_ROWS contiguous rows, in one
    kernel.

    Returns the product, and with a residual also the new residual `x + residual`.
    """
    if residual is None:
        return _launch(x, weight, RMS_NORM, norm_weight=norm_weight, eps=eps)
    residual_out = torch.empty_like(x)
    out = _launch(x, weight, ADD_RMS_NORM, residual, norm_weight, residual_out, eps)
    return out, residual_out


def triton_silu_and_mul_gemv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`linear(silu(gate) * up, weight)` for rows `x = [gate | up]`, in one kernel."""
    return _launch(x, weight, SILU_AND_MUL)


# ANCHOR: linear_op
def linear_cuda(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`F.linear(x, weight)`: the GEMV for one row, the skinny GEMM for up to 64 where it
    measured faster than cuBLAS, cuBLAS otherwise."""
    if triton_gemv_available(x, weight) and (
        x.shape[0] == 1
        or skinny_is_faster(
            x, weight, PLAIN, lambda: triton_gemv(x, weight), lambda: F.linear(x, weight)
        )
    ):
        return triton_gemv(x, weight)
    return F.linear(x, weight)


# ANCHOR_END: linear_op
