"""Route each batch to a graph: FULL, PIECEWISE or none, and the padded key to use.

vLLM counterpart: vllm/v1/cudagraph_dispatcher.py (`CudagraphDispatcher`). The keys
built at start-up are the only graphs that may ever be captured or replayed; at run
time `dispatch` pads the batch to a rung and looks its key up in a fixed order.

This class follows an earlier vLLM design: a mixed mode's keys hold the token count
only (the relaxed key, `BatchDescriptor.relax_for_mixed_batch_cudagraphs`) under FULL
as under PIECEWISE, so `dispatch` tries the exact FULL key, the relaxed FULL key and the
relaxed PIECEWISE key, in that order, and a `disable_full` flag keeps a batch off FULL
graphs. vLLM at the pinned commit 9aaf83e differs:

- A mixed mode's FULL keys keep their request count, min(rung, max_num_seqs), because
  some attention backends build a full graph's metadata from it; only PIECEWISE keys are
  relaxed, with `dataclasses.replace` (the mixed-mode block of `initialize_cudagraph_keys`):
  https://github.com/vllm-project/vllm/blob/9aaf83ef502fc37bc647f6e474314d48ba36cd1c/vllm/v1/cudagraph_dispatcher.py#L193-L207
- `dispatch` builds one padded descriptor and tries it among the FULL keys, then its
  relaxed form among the PIECEWISE keys: there is no relaxed FULL lookup. A caller
  passes sets of `valid_modes` / `invalid_modes` (cascade attention: `{FULL}`) instead
  of a flag:
  https://github.com/vllm-project/vllm/blob/9aaf83ef502fc37bc647f6e474314d48ba36cd1c/vllm/v1/cudagraph_dispatcher.py#L239-L328
- A key also carries `has_lora` and `num_active_loras` (graphs per number of active LoRA
  adapters); the decode query length is 1 + num_speculative_tokens; and the rung comes
  from a table precomputed for every token count (`_compute_bs_to_padded_graph_size`)
  rather than from a bisection of the ladder:
  https://github.com/vllm-project/vllm/blob/9aaf83ef502fc37bc647f6e474314d48ba36cd1c/vllm/v1/cudagraph_dispatcher.py#L76-L113

For the modes mini_vllm supports, both designs send the same batches to the same
runtime mode; under FULL alone a mixed batch's key differs (relaxed here, with its
request count there).
"""

from __future__ import annotations

from mini_vllm.config.capture_sizes import padded_size
from mini_vllm.config.compilation import CUDAGraphMode
from mini_vllm.errors import UserError
from mini_vllm.forward_context import BatchDescriptor

__all__ = ["CudagraphDispatcher"]


class CudagraphDispatcher:
    # ANCHOR: init_keys
    def __init__(
        self,
        mode: CUDAGraphMode | str,
        capture_sizes: list[int],
        max_num_seqs: int,
        uniform_decode_query_len: int = 1,
    ) -> None:
        self.mode = CUDAGraphMode.from_name(mode)
        if any(s < 1 for s in capture_sizes):
            raise UserError(f"capture sizes must be positive, got {capture_sizes}")
        self.capture_sizes = sorted(set(capture_sizes))
        self.max_num_seqs = max_num_seqs
        self.uniform_decode_query_len = q = uniform_decode_query_len
        self.keys: dict[CUDAGraphMode, set[BatchDescriptor]] = {
            CUDAGraphMode.PIECEWISE: set(),
            CUDAGraphMode.FULL: set(),
        }
        # ANCHOR: key_rules
        if self.mode is CUDAGraphMode.NONE:
            return
        # Mixed batches: one relaxed key (tokens only) per rung, under the mixed mode.
        if self.mode.mixed_mode() is not CUDAGraphMode.NONE:
            for size in self.capture_sizes:
                self.keys[self.mode.mixed_mode()].add(BatchDescriptor(size))
        # Uniform decode gets its own FULL graphs when decode and mixed are routed apart.
        if self.mode.decode_mode() is CUDAGraphMode.FULL and self.mode.separate_routine():
            for size in self.capture_sizes:
                if q <= size <= max_num_seqs * q:
                    self.keys[CUDAGraphMode.FULL].add(
                        BatchDescriptor(size, size // q, uniform=True)
                    )
        # ANCHOR_END: key_rules

    # ANCHOR_END: init_keys

    @property
    def max_capture_size(self) -> int:
        return self.capture_sizes[-1] if self.capture_sizes else 0

    def all_keys(self) -> list[tuple[CUDAGraphMode, BatchDescriptor]]:
        """Every (runtime mode, key) that may be captured, largest first per mode."""
        return [
            (mode, key)
            for mode in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL)
            for key in sorted(self.keys[mode], key=lambda k: -k.num_tokens)
        ]

    # ANCHOR: dispatch
    def dispatch(
        self, num_tokens: int, uniform_decode: bool, disable_full: bool = False
    ) -> tuple[CUDAGraphMode, BatchDescriptor]:
        q = self.uniform_decode_query_len
        unpadded = BatchDescriptor(
            num_tokens, num_tokens // q if uniform_decode else None, uniform=uniform_decode
        )
        has_keys = any(self.keys.values())
        if not has_keys or self.mode is CUDAGraphMode.NONE or num_tokens > self.max_capture_size:
            return CUDAGraphMode.NONE, unpadded
        rung = padded_size(num_tokens, self.capture_sizes)
        exact = BatchDescriptor(rung, rung // q if uniform_decode else None, uniform=uniform_decode)
        relaxed = exact.relax_for_mixed_batch_cudagraphs()
        if not disable_full:
            if exact in self.keys[CUDAGraphMode.FULL]:
                return CUDAGraphMode.FULL, exact
            if relaxed in self.keys[CUDAGraphMode.FULL]:
                return CUDAGraphMode.FULL, relaxed
        if relaxed in self.keys[CUDAGraphMode.PIECEWISE]:
            return CUDAGraphMode.PIECEWISE, relaxed
        return CUDAGraphMode.NONE, unpadded

    # ANCHOR_END: dispatch
