"""Where compiled code is kept between runs, and how long compiling took, cold and warm.

vLLM counterpart: vllm/compilation/compiler_interface.py and backends.py (vLLM keeps
Inductor's artifacts under `~/.cache/vllm/torch_compile_cache/<hash>/`, with the hash
covering the config and the model code) and its "compile took N s" start-up log.

Two caches make the second start faster:
- Inductor's own: compiled kernels and FX graphs, keyed by graph structure and
  inputs. mini_vllm points `TORCHINDUCTOR_CACHE_DIR` at `$MINI_VLLM_CACHE/inductor`
  (unless you set it) and turns on the FX-graph and AOT-autograd caches.
- mini_vllm's own record, `$MINI_VLLM_CACHE/compile/<key>.json`: the compile times
  of earlier starts of the same model shape, dtype, compilation mode, device, PyTorch
  and compiler code, so start-up can print this start's time next to the previous one.
A third makes it faster still: with VLLM_COMPILE, the whole compiled model is kept as
`<key>.compiled` beside the record, and a start that finds it loads it instead of
tracing (mini_vllm/compilation/caching/aot_cache.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from mini_vllm import compat, envs
from mini_vllm.compilation.caching.aot_cache import compiler_sources_digest
from mini_vllm.config.compilation import CompilationMode
from mini_vllm.distributed.parallel_state import get_tensor_model_parallel_world_size

__all__ = ["CompileReport", "compile_and_record", "inductor_cache_dir"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompileReport:
    mode: str
    seconds: float  # this start: tracing + compiling + the first run
    previous_seconds: float | None  # the previous start with the same key, if any
    dynamo_graphs: int
    compiled_pieces: int
    cache_dir: str
    fused_pairs: int = 0
    artifact: str | None = None  # the saved compiled model (VLLM_COMPILE with AOT compile)
    loaded: bool = False  # this start loaded it instead of tracing and compiling

    def line(self) -> str:
        before = (
            f"; previous start {self.previous_seconds:.1f} s"
            if self.previous_seconds is not None
            else " (first start: cold cache)"
        )
        fused = f", {self.fused_pairs} op pair(s) fused" if self.fused_pairs else ""
        if self.loaded:
            return (
                f"loaded the model compiled at {self.mode} in {self.seconds:.1f} s, "
                f"{self.compiled_pieces} piece(s){fused}, no Dynamo trace{before}; "
                f"from {self.artifact}"
            )
        saved = f"; saved to {self.artifact}" if self.artifact else ""
        return (
            f"compiled at {self.mode} in {self.seconds:.1f} s, {self.compiled_pieces} "
            f"piece(s){fused}, {self.dynamo_graphs} Dynamo graph(s){before}; cache "
            f"{self.cache_dir}{saved}"
        )


def inductor_cache_dir() -> str:
    """Point Inductor's caches at the mini_vllm cache directory (once; a user's setting wins)."""
    # Importing Inductor writes its default into the environment, so "unset" means
    # absent or equal to that default; anything else is the user's choice and wins.
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or current == compat.inductor_default_cache_dir():
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(envs.MINI_VLLM_CACHE / "inductor")
    compat.enable_inductor_caches()
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def _record_path(
    model_config, mode: CompilationMode, device: torch.device, fusion: bool, dtype: torch.dtype
) -> Path:
    key_source = json.dumps(
        {
            "model": {k: v for k, v in vars(model_config).items() if k != "name"},
            "mode": mode.name,
            "device": device.type,
            "dtype": str(dtype),
            "torch": torch.__version__,
            "fusion": fusion,
            # A rank's shard has other shapes and all-reduces in it: never the whole model's.
            "tensor_parallel_size": get_tensor_model_parallel_world_size(),
            # The compiler's own code (fusion passes, Inductor settings) is not traced, so
            # the saved compiled model cannot check it: it is part of the key.
            "compiler": compiler_sources_digest(),
        },
        sort_keys=True,
        default=str,
    )
    key = hashlib.sha256(key_source.encode()).hexdigest()[:16]
    return envs.MINI_VLLM_CACHE / "compile" / f"{key}.json"


# ANCHOR: compile_and_record
def compile_and_record(
    model_config,
    mode: CompilationMode,
    device: torch.device,
    stats,
    run_once: Callable[[], None],
    fusion: bool = False,
    compiler=None,
    dtype: torch.dtype = torch.float32,
) -> CompileReport:
    """Run the first (compiling) forward, time it, and compare with the previous start.

    With a `compiler` (the model's TorchCompileWrapper) the whole compiled model is kept
    next to the record, and loaded from there when it exists (aot_cache.py).
    """
    cache_dir = inductor_cache_dir()
    record = _record_path(model_config, mode, device, fusion, dtype)
    history = json.loads(record.read_text()) if record.exists() else []
    if compiler is not None and mode is CompilationMode.VLLM_COMPILE:
        compiler.artifact_path = record.with_suffix(".compiled")
    start = time.perf_counter()
    run_once()
    seconds = time.perf_counter() - start
    loaded = compiler is not None and compiler.loaded_from_disk
    on_disk = loaded or (compiler is not None and compiler.saved_to_disk)
    report = CompileReport(
        mode=mode.name,
        seconds=seconds,
        previous_seconds=history[-1]["seconds"] if history else None,
        dynamo_graphs=stats.dynamo_graphs,
        compiled_pieces=stats.compiled_pieces,
        cache_dir=cache_dir,
        fused_pairs=stats.fused_pairs,
        artifact=str(compiler.artifact_path) if on_disk else None,
        loaded=loaded,
    )
    record.parent.mkdir(parents=True, exist_ok=True)
    tmp = record.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps((history + [asdict(report)])[-10:], indent=1))
    os.replace(tmp, record)
    logger.info(report.line())
    print(report.line(), flush=True)
    return report


# ANCHOR_END: compile_and_record
