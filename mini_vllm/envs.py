"""Every environment switch mini_vllm reads, in one place, each read when it is used.

vLLM counterpart: vllm/envs.py (one table of `VLLM_*` variables with their parsers, read
through the module's `__getattr__`, so that a value set after import is still seen).
Read them as attributes: `from mini_vllm import envs; envs.MINI_VLLM_PDL`.

    MINI_VLLM_CACHE      where converted weights and compiled artifacts are kept
                         (default: ~/.cache/mini_vllm)
    MINI_VLLM_CUSTOM_OPS "all" (default): every layer that has kernels of mini_vllm's own
                         runs them; "none": plain torch everywhere; then "+name" / "-name"
                         for one op (mini_vllm/_custom_ops.py). The engine option
                         `custom_ops` wins over it
    MINI_VLLM_PDL        "1" (default): the Triton kernels use programmatic dependent launch
                         where the GPU has it (Hopper on); "0": never
    MINI_VLLM_SKINNY_GEMM "0" (default): products of 2 to 64 rows go to cuBLAS; "1": to
                         the Triton skinny GEMM where it measures faster
                         (mini_vllm/kernels/gemv.py; why it is off:
                         benchmarks/results/decode-graphs-cuda-skinny.md)
    MINI_VLLM_TILE_TIMING "graph" (default): the Triton GEMV's autotuner times each tile
                         back to back in a CUDA graph, as the engine runs it; "triton":
                         Triton's own timing, each call alone (mini_vllm/kernels/gemv.py
                         `tile_time_ms`). Picks are kept in Triton's cache, whichever timing
                         made them: compare the two on fresh TRITON_CACHE_DIRs
    MINI_VLLM_COMPILE_CACHE "1" (default): a VLLM_COMPILE engine saves its compiled model
                         and a later start loads it instead of tracing again
                         (compilation/caching/aot_cache.py); "0": trace and compile at
                         every start (vLLM: VLLM_DISABLE_COMPILE_CACHE=1)
    MINI_VLLM_DEBUG      "1" (anything but "0"): the command line shows a user error's traceback too
    MINI_VLLM_ENABLE_MULTIPROCESSING "1" (default): `serve` runs the engine core in a process
                         of its own (mini_vllm/engine/core_client.py); "0": in a thread
                         of the server's process (vLLM: VLLM_ENABLE_V1_MULTIPROCESSING)
    MINI_VLLM_TP_TIMEOUT_S seconds a tensor-parallel collective waits for the other ranks
                         before it fails (default 60): a rank that died or skipped a step
                         is then an error, not a hang (mini_vllm/executor/multiproc_executor.py)

Outside the package: the labs read MINI_VLLM_IMPL and MINI_VLLM_STARTER_DIR
(labs/labkit.py), the set-up script MINI_VLLM_VENV and MINI_VLLM_TORCH_SPEC
(scripts/bootstrap.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mini_vllm.errors import UserError

if TYPE_CHECKING:
    MINI_VLLM_CACHE: Path = Path.home() / ".cache" / "mini_vllm"
    MINI_VLLM_CUSTOM_OPS: str = "all"
    MINI_VLLM_PDL: bool = True
    MINI_VLLM_SKINNY_GEMM: bool = False
    MINI_VLLM_TILE_TIMING: str = "graph"
    MINI_VLLM_COMPILE_CACHE: bool = True
    MINI_VLLM_DEBUG: bool = False
    MINI_VLLM_TP_TIMEOUT_S: float = 60.0
    MINI_VLLM_ENABLE_MULTIPROCESSING: bool = True


def _choice(name: str, default: str, allowed: tuple[str, ...]) -> Callable[[], str]:
    def read() -> str:
        value = os.environ.get(name, default).strip().lower() or default
        if value not in allowed:
            raise UserError(
                f"{name}={value!r} is not understood; set it to one of: {', '.join(allowed)}"
            )
        return value

    return read


def _positive_seconds(name: str, default: float) -> Callable[[], float]:
    def read() -> float:
        text = os.environ.get(name, "").strip()
        try:
            value = float(text) if text else default
        except ValueError:
            value = -1.0
        if not value > 0:
            raise UserError(f"{name}={text!r} is not understood; set it to a number of seconds > 0")
        return value

    return read


def _cache_root() -> Path:
    root = os.environ.get("MINI_VLLM_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "mini_vllm"


_on_off = ("0", "1")

environment_variables: dict[str, Callable[[], Any]] = {
    "MINI_VLLM_CACHE": _cache_root,
    # Checked by mini_vllm/_custom_ops.py, which knows the op names.
    "MINI_VLLM_CUSTOM_OPS": lambda: os.environ.get("MINI_VLLM_CUSTOM_OPS", "all"),
    "MINI_VLLM_PDL": lambda: _choice("MINI_VLLM_PDL", "1", _on_off)() == "1",
    "MINI_VLLM_SKINNY_GEMM": lambda: _choice("MINI_VLLM_SKINNY_GEMM", "0", _on_off)() == "1",
    "MINI_VLLM_TILE_TIMING": _choice("MINI_VLLM_TILE_TIMING", "graph", ("graph", "triton")),
    "MINI_VLLM_COMPILE_CACHE": lambda: _choice("MINI_VLLM_COMPILE_CACHE", "1", _on_off)() == "1",
    # Read while reporting another error, so it never raises one of its own: anything but 0 is on.
    "MINI_VLLM_DEBUG": lambda: os.environ.get("MINI_VLLM_DEBUG", "0").strip() not in ("", "0"),
    "MINI_VLLM_TP_TIMEOUT_S": _positive_seconds("MINI_VLLM_TP_TIMEOUT_S", 60.0),
    "MINI_VLLM_ENABLE_MULTIPROCESSING": lambda: (
        _choice("MINI_VLLM_ENABLE_MULTIPROCESSING", "1", _on_off)() == "1"
    ),
}


def __getattr__(name: str) -> Any:
    if name in environment_variables:
        return environment_variables[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return list(environment_variables)
