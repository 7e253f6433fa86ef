"""Lab 03, part 2 — the CudagraphDispatcher (your code).

Mirrors mini_vllm/engine/cudagraph_dispatcher.py, which mirrors
vllm/v1/cudagraph_dispatcher.py. Uses the reference CUDAGraphMode and
BatchDescriptor, so this part does not depend on part 1.
Run: pytest labs/phase-05/lab-03-cudagraph-mode -k dispatch
"""

from __future__ import annotations

from mini_vllm.config.compilation import CUDAGraphMode
from mini_vllm.forward_context import BatchDescriptor

__all__ = ["BatchDescriptor", "CUDAGraphMode", "CudagraphDispatcher"]


class CudagraphDispatcher:
    def __init__(
        self,
        mode: CUDAGraphMode | str,
        capture_sizes: list[int],
        max_num_seqs: int,
        uniform_decode_query_len: int = 1,
    ) -> None:
        """Build the set of keys that may ever be captured, per runtime mode.

        - mixed batches: if mode.mixed_mode() is not NONE, one relaxed key
          BatchDescriptor(size) per capture size, under mode.mixed_mode();
        - uniform decode: if mode.decode_mode() is FULL and mode.separate_routine(),
          BatchDescriptor(size, size // q, uniform=True) under FULL for every capture
          size with q <= size <= max_num_seqs * q (q = uniform_decode_query_len).
        Store them in self.keys = {CUDAGraphMode.PIECEWISE: set(), CUDAGraphMode.FULL: set()}.
        """
        self.mode = CUDAGraphMode.from_name(mode)
        self.capture_sizes = sorted(set(capture_sizes))
        self.max_num_seqs = max_num_seqs
        self.uniform_decode_query_len = uniform_decode_query_len
        self.keys: dict[CUDAGraphMode, set[BatchDescriptor]] = {
            CUDAGraphMode.PIECEWISE: set(),
            CUDAGraphMode.FULL: set(),
        }
        raise NotImplementedError("TODO: fill self.keys")

    @property
    def max_capture_size(self) -> int:
        return self.capture_sizes[-1] if self.capture_sizes else 0

    def dispatch(
        self, num_tokens: int, uniform_decode: bool, disable_full: bool = False
    ) -> tuple[CUDAGraphMode, BatchDescriptor]:
        """Pick (runtime mode, key) for a batch of `num_tokens` tokens.

        - no keys, mode NONE, or num_tokens above the largest capture size:
          (NONE, the unpadded descriptor);
        - otherwise pad to the next capture size and try, in order: the exact key
          under FULL, the relaxed key under FULL, the relaxed key under PIECEWISE
          (disable_full skips both FULL tries); if none matches, (NONE, unpadded).
        The exact key of a uniform-decode batch is
        BatchDescriptor(padded, padded // q, uniform=True); of a mixed batch,
        BatchDescriptor(padded). The unpadded one carries num_tokens (and
        num_tokens // q requests when uniform).
        """
        raise NotImplementedError("TODO: pad, then look the keys up in order")
