"""The on-disk cache of converted weights and tokenizers, written atomically.

vLLM counterpart: vllm/model_executor/model_loader/weight_utils.py (`get_lock`, the
file lock vLLM takes around downloads so that several workers do not fetch the same
model at once) and vllm/envs.py (`VLLM_CACHE_ROOT`).

Dequantizing the GGUF and building its tokenizer takes seconds; reading float32
safetensors back takes a fraction of one. So the first load converts SmolLM2 into a
directory under `$MINI_VLLM_CACHE` (default `~/.cache/mini_vllm`) and later loads
read that directory (the conversion itself: mini_vllm/models/loader.py). This module
knows nothing of models: it names, builds and publishes directories.

Two test processes (pytest-xdist workers) may ask at the same moment. Each entry is
built in a temporary directory next to its final place and then renamed into place:
a rename is atomic, so a reader sees either no entry or a complete one, never half a
file, and a process that dies mid-conversion leaves only a temporary directory that
nobody reads. A file lock (where the OS has one) makes the second process wait for
the first instead of converting again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from mini_vllm import envs

__all__ = ["CACHE_FORMAT", "cache_root", "cached_entry", "publish_atomically"]

# Bump when the converted layout changes, so old entries are not read by new code.
CACHE_FORMAT = 3  # 3: every CPU matrix column-major


def cache_root() -> Path:
    """The cache directory: `$MINI_VLLM_CACHE`, or ~/.cache/mini_vllm."""
    return envs.MINI_VLLM_CACHE


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # no flock (Windows): the atomic rename alone keeps entries whole
        yield
        return
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ANCHOR: publish_atomically
def publish_atomically(final: Path, build: Callable[[Path], None]) -> Path:
    """Return `final`, first building it with `build(tmp_dir)` if it does not exist yet."""
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(final.parent / f".{final.name}.lock"):
        if final.is_dir():  # another process finished while we waited
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        try:
            build(tmp)
            try:
                os.rename(tmp, final)
            except OSError:
                if not final.is_dir():
                    raise
                # Lost a race with a process that holds no lock: its entry is as good.
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


# ANCHOR_END: publish_atomically


def cached_entry(name: str, fingerprint: str, build: Callable[[Path], None]) -> Path:
    """The cache directory `name-<key>`, built by `build(tmp_dir)` on first use.

    The key hashes `fingerprint` (whatever identifies the source: a file's name, size and
    modification time) with `CACHE_FORMAT`, so a changed source or a new layout gets a
    new entry instead of a stale one.
    """
    key = hashlib.sha1(f"{fingerprint}|{CACHE_FORMAT}".encode()).hexdigest()[:12]
    return publish_atomically(cache_root() / f"{name}-{key}", build)
