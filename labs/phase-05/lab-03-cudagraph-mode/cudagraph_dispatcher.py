"""Lab 03, steps 3 and 4 — the CudagraphDispatcher (your code).

Mirrors vLLM's `CudagraphDispatcher` (vllm/v1/cudagraph_dispatcher.py). It uses the
reference `CUDAGraphMode`, `BatchDescriptor` and `padded_size` (lab 05's rung lookup), so
these steps do not depend on your steps 1 and 2.

A `BatchDescriptor(num_tokens, num_reqs=None, uniform=False)` is a hashable key. Its
"relaxed" form, `key.relax_for_mixed_batch_cudagraphs()`, keeps only the token count:
`BatchDescriptor(8, 8, uniform=True)` relaxes to `BatchDescriptor(8)`.

Run: pytest labs/phase-05/lab-03-cudagraph-mode -m step3   (then -m step4)
"""

from __future__ import annotations

from mini_vllm.config.capture_sizes import padded_size
from mini_vllm.config.compilation import CUDAGraphMode
from mini_vllm.errors import UserError
from mini_vllm.forward_context import BatchDescriptor

__all__ = ["BatchDescriptor", "CUDAGraphMode", "CudagraphDispatcher", "padded_size"]


class CudagraphDispatcher:
    def __init__(
        self,
        mode: CUDAGraphMode | str,
        capture_sizes: list[int],
        max_num_seqs: int,
        uniform_decode_query_len: int = 1,
    ) -> None:
        """Step 3: build `self.keys`, the only graphs that may ever be captured or replayed.

        After construction `self.keys` maps CUDAGraphMode.PIECEWISE and CUDAGraphMode.FULL
        to sets of BatchDescriptor, and holds exactly:
        - for mixed batches, when mode.mixed_mode() is not NONE: the relaxed key
          BatchDescriptor(size) of every capture size, under mode.mixed_mode();
        - for uniform decode, when mode is a pair whose decode mode is FULL: the key
          BatchDescriptor(size, size // q, uniform=True) under FULL for every capture size
          that a uniform batch can have, q <= size <= max_num_seqs * q, where
          q = uniform_decode_query_len (each request computes q tokens);
        - nothing else (mode NONE: both sets empty).

        Example: FULL_AND_PIECEWISE, capture sizes [1, 2, 4, 8, 16], max_num_seqs 4, q 1:
        keys[PIECEWISE] = {BD(1), BD(2), BD(4), BD(8), BD(16)};
        keys[FULL] = {BD(1, 1, True), BD(2, 2, True), BD(4, 4, True)}.
        """
        self.mode = CUDAGraphMode.from_name(mode)
        if any(s < 1 for s in capture_sizes):
            raise UserError(f"capture sizes must be positive, got {capture_sizes}")
        self.capture_sizes = sorted(set(capture_sizes))
        self.max_num_seqs = max_num_seqs
        self.uniform_decode_query_len = uniform_decode_query_len
        self.keys: dict[CUDAGraphMode, set[BatchDescriptor]] = {
            CUDAGraphMode.PIECEWISE: set(),
            CUDAGraphMode.FULL: set(),
        }
        raise NotImplementedError("TODO: step 3, fill self.keys")

    @property
    def max_capture_size(self) -> int:
        return self.capture_sizes[-1] if self.capture_sizes else 0

    def dispatch(
        self, num_tokens: int, uniform_decode: bool, disable_full: bool = False
    ) -> tuple[CUDAGraphMode, BatchDescriptor]:
        """Step 4: the (runtime mode, key) a batch of `num_tokens` tokens runs under.

        The runtime mode is NONE, PIECEWISE or FULL, never a pair. The batch's own
        descriptor is BatchDescriptor(num_tokens, num_tokens // q, uniform=True) for a
        uniform-decode batch and BatchDescriptor(num_tokens) for a mixed one. Its rung is
        the smallest capture size >= num_tokens; its padded descriptor is its own with the
        rung in place of num_tokens (and rung // q requests when uniform); its relaxed key
        is BatchDescriptor(rung).
        - A graph is used only if its key is in self.keys under that mode, and a graph runs
          whenever one can: NONE only when no key serves the batch (mode NONE, no keys, a
          batch above the largest capture size, or no key found).
        - FULL is preferred to PIECEWISE, and under FULL the padded key to the relaxed one.
        - disable_full=True: never FULL (this batch's attention cannot run in a full graph).
        - Under NONE the key is one of the two descriptors, the batch's own or its padded
          one: which one is step 4's decision (README).

        Example with FULL_AND_PIECEWISE on [1, 2, 4, 8, 16, 24, 32, 40], max_num_seqs 64:
        dispatch(33, True) -> (FULL, BD(40, 40, True)).
        """
        raise NotImplementedError("TODO: step 4")
