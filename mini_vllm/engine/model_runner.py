"""The model runner: one scheduler step in, one sampled token per sampling row out.

vLLM counterpart: vllm/v1/worker/gpu_model_runner.py (`GPUModelRunner`: persistent
input buffers, `_prepare_inputs`, `execute_model`, `capture_model`) with the KV
cache allocation of `initialize_kv_cache`. nano-vllm: nanovllm/engine/model_runner.py.

The runner owns the KV cache and a set of *persistent* device buffers (`input_ids`,
`positions`, `slot_mapping`, `seq_lens`, `block_tables`) sized for the largest batch.
Each step copies the step's inputs into the front of those buffers and runs the model
on views of them. Eagerly, fresh tensors would do as well; the point of persistent
buffers is Phase 05: a captured CUDA graph reads fixed addresses, so the inputs must
always live at the same place.

With async scheduling (`EngineConfig.async_scheduling`) `execute_model` returns before
the step's tokens reach the host (`SampledTokens`, vLLM's AsyncGPUModelRunnerOutput),
and the next step reads the tokens it was planned on from the device
(`_fill_placeholders`).
"""

from __future__ import annotations

import gc
import logging
import math
import time
import weakref
from collections.abc import Callable
from collections.abc import Sequence as SequenceT
from dataclasses import dataclass

import numpy as np
import torch

from mini_vllm import _custom_ops as ops
from mini_vllm import compat
from mini_vllm.attention.paged import PagedAttentionMetadata, allocate_paged_kv_caches
from mini_vllm.attention.selector import get_attn_backend
from mini_vllm.compilation.backends import GraphForward, build_graph_forward
from mini_vllm.compilation.caching.compile_cache import CompileReport, compile_and_record
from mini_vllm.compilation.graph_backend import graph_backend_for
from mini_vllm.compilation.monitor import set_cudagraph_capturing_enabled
from mini_vllm.config.capture_sizes import (
    default_capture_sizes,
    normalize_capture_sizes,
)
from mini_vllm.config.compilation import (
    CompilationMode,
    CUDAGraphMode,
    resolve_cudagraph_mode,
)
from mini_vllm.distributed.parallel_state import get_tensor_model_parallel_rank, get_tp_group
from mini_vllm.engine.cudagraph_dispatcher import CudagraphDispatcher
from mini_vllm.engine.engine_config import EngineConfig
from mini_vllm.engine.input_batch import StepArrays, WrittenStep, gather_step, write_step
from mini_vllm.engine.model_inputs import ModelInputs
from mini_vllm.engine.scheduler_output import SchedulerOutput
from mini_vllm.engine.stats import StepRecord
from mini_vllm.forward_context import BatchDescriptor, set_forward_context
from mini_vllm.layers.attention import (
    attention_layers,
    bind_kv_caches,
    static_forward_context,
)
from mini_vllm.layers.custom_op import set_custom_ops
from mini_vllm.layers.logits_processors import PenaltyCounts, SamplingBatch
from mini_vllm.layers.sampler import Sampler, make_generator
from mini_vllm.torch_utils import async_tensor_h2d

__all__ = ["CaptureReport", "ModelRunner", "SampledTokens"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CaptureReport:
    num_graphs: int  # graphs captured, pieces counted one by one
    sizes: list[int]  # capture sizes, as tried (largest first)
    seconds: float
    graph_memory_bytes: int | None  # device memory in the graphs' pool; None on CPU
    warmup_seconds: float = 0.0  # of `seconds`: the eager warm-up run before each capture


class SampledTokens:
    """One step's sampled ids on their way to the host (vLLM: AsyncGPUModelRunnerOutput)."""

    def __init__(self, host: torch.Tensor | None, event, rows: list[int], num_rows: int) -> None:
        self._host, self._event, self._rows, self._num_rows = host, event, rows, num_rows
        # Run once the step's copies have landed (the log-probabilities' bookkeeping).
        self.when_landed: Callable[[], None] | None = None

    def ready(self) -> bool:
        """Whether `get` would return at once (the step's tokens are on the host)."""
        return self._event is None or self._event.query()

    def get(self) -> list[int | None]:
        """The token of each row (None: no sample), waiting for this step only."""
        sampled: list[int | None] = [None] * self._num_rows
        if self._host is not None:
            if self._event is not None:
                self._event.synchronize()
            for row, token in zip(self._rows, self._host.tolist()):
                sampled[row] = token
        if self.when_landed is not None:
            self.when_landed()
        return sampled


def _logprob_summary(
    logprobs: torch.Tensor, tokens: torch.Tensor, top: int, non_blocking: bool
) -> list[torch.Tensor]:
    """Of each row of `logprobs` `[rows, vocab]`: the log-probability of its token in
    `tokens` `[rows]`, that token's rank (1: the most likely) and the `top` most likely
    (values, ids), on their way to the host (`non_blocking`: without waiting for them)."""
    chosen = logprobs.gather(1, tokens.unsqueeze(1))
    ranks = (logprobs > chosen).sum(dim=1) + 1
    values, ids = logprobs.topk(max(top, 1), dim=1)
    return [t.to("cpu", non_blocking=non_blocking) for t in (chosen.squeeze(1), ranks, values, ids)]


def _both(first: Callable[[], None] | None, second: Callable[[], None] | None):
    """One callback running both (either may be None); None when both are."""
    if first is None or second is None:
        return first or second

    def both() -> None:
        first()
        second()

    return both


def _unbind_kv_caches(model: torch.nn.Module, kv_caches: list[torch.Tensor]) -> None:
    """Unbind `kv_caches` from `model`'s layers, unless another engine has bound its own since."""
    layers = attention_layers(model)
    if all(layer.kv_cache is cache for layer, cache in zip(layers, kv_caches)):
        bind_kv_caches(model, None, None)


class ModelRunner:
    def __init__(
        self, model: torch.nn.Module, config: EngineConfig, max_model_len: int, num_kv_blocks: int
    ) -> None:
        self.model = model
        self.config = config
        self.tp_rank = get_tensor_model_parallel_rank()
        # Under a launcher every rank runs the whole engine, so every rank samples, from the
        # same gathered logits with the same generators (mini_vllm/executor/external_launcher.py).
        self.every_rank_samples = False
        weight = next(model.parameters())
        self.device, self.dtype = weight.device, weight.dtype
        mc = model.config
        self.block_size = config.block_size
        self.max_model_len = max_model_len
        self.max_num_tokens = config.max_num_batched_tokens
        self.max_blocks_per_seq = math.ceil(max_model_len / config.block_size)
        # Each layer runs mini_vllm's own kernels or its plain torch code, as the engine's
        # `custom_ops` setting says (mini_vllm/_custom_ops.py); so does attention, below.
        set_custom_ops(model, config.custom_ops)
        compat.log_fast_paths(ops.kernels_status(config.custom_ops))

        # ANCHOR: kv_cache
        self.num_kv_blocks = num_kv_blocks
        self.kv_caches = allocate_paged_kv_caches(
            mc.num_hidden_layers,
            num_kv_blocks,
            config.block_size,
            attention_layers(model)[0].num_kv_heads,  # this rank's: all of them with one rank
            mc.head_dim,
            self.dtype,
            self.device,
        )
        self.attn_backend = get_attn_backend(self.device, config.custom_ops)
        bind_kv_caches(model, self.attn_backend, self.kv_caches)
        # A model may outlive its engine (benchmarks build one engine after another on
        # one model): when this runner goes, its cache must not stay bound to the layers.
        weakref.finalize(self, _unbind_kv_caches, model, self.kv_caches)
        # Where the compiled attention op finds each layer, set in every forward context.
        self.static_forward_context = static_forward_context(model)
        # ANCHOR_END: kv_cache

        # ANCHOR: persistent_buffers
        # Sized for the largest batch a step can hold. Row buffers get one row per
        # token: a uniform-decode batch padded to a graph size has that many rows.
        # All six live in one integer tensor, so that a step's inputs travel to the
        # GPU from one pinned staging copy of it (one copy, no syncs).
        n, width = self.max_num_tokens, self.max_blocks_per_seq
        self._tables_start = 5 * n + 1  # ids, positions, slots, seq_lens, query_start_loc
        self._ints = torch.zeros(
            self._tables_start + n * width, dtype=torch.long, device=self.device
        )
        self.input_ids, self.positions, self.slot_mapping, self.seq_lens = (
            self._ints[: 4 * n].view(4, n).unbind(0)
        )
        self.query_start_loc = self._ints[4 * n : 5 * n + 1]
        self.block_tables = self._ints[self._tables_start :].view(n, width)
        self.slot_mapping.fill_(-1)
        on_gpu = self.device.type == "cuda"
        self._staging = (
            torch.zeros_like(self._ints, device="cpu", pin_memory=on_gpu) if on_gpu else self._ints
        )
        self._staging[2 * n : 3 * n].fill_(-1)  # slots past a step's tokens stay "write nowhere"
        self._view_staging()
        self._copy_done = torch.cuda.Event() if on_gpu else None
        # ANCHOR_END: persistent_buffers

        # ANCHOR: graph_setup
        # Phase 05: which graphs exist. Attention can always be split here (the model
        # is traced with torch.fx and cut at its Attention layers, or compiled and cut
        # at the attention op), so the downgrade only depends on the backend's support.
        self.compilation_mode = config.compilation_mode
        # ANCHOR: graph_mode_setup
        # Attention is a split point eagerly (torch.fx) and at VLLM_COMPILE (Dynamo);
        # the plain compile levels trace the model whole, so they cannot do piecewise.
        split = self.compilation_mode in (CompilationMode.NONE, CompilationMode.VLLM_COMPILE)
        self.cudagraph_mode = resolve_cudagraph_mode(
            config.cudagraph_mode, self.attn_backend.cudagraph_support, attention_is_split=split
        )
        if self.cudagraph_mode is CUDAGraphMode.NONE:
            self.capture_sizes: list[int] = []
        elif config.cudagraph_capture_sizes is not None:
            self.capture_sizes = normalize_capture_sizes(
                config.cudagraph_capture_sizes, self.max_num_tokens
            )
        else:
            self.capture_sizes = default_capture_sizes(config.max_num_seqs, self.max_num_tokens)
        self.dispatcher = CudagraphDispatcher(
            self.cudagraph_mode, self.capture_sizes, config.max_num_seqs
        )
        # ANCHOR_END: graph_mode_setup
        self.graph_backend = graph_backend_for(self.device)
        self.graph_pool = (
            self.graph_backend.new_pool() if self.cudagraph_mode is not CUDAGraphMode.NONE else None
        )
        self.graphs: GraphForward = build_graph_forward(
            model.model,
            self.cudagraph_mode,
            self.graph_backend,
            pool=self.graph_pool,
            debug=config.debug_cudagraphs,
            compilation_mode=self.compilation_mode,
            fusion=config.fusion_enabled(),
        )
        self.capture_report: CaptureReport | None = None
        self.compile_report: CompileReport | None = None
        # ANCHOR_END: graph_setup

        self.sampler = Sampler()
        self._penalties: PenaltyCounts | None = None  # made when a request first needs it
        eos = mc.eos_token_id
        self._eos_token_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        self._generators: dict[object, torch.Generator | None] = {}
        # Async scheduling: the last step's sampled ids stay on the device, and the
        # row each request sampled in, so the next step can read its input from there.
        self._prev_sampled: torch.Tensor | None = None
        self._prev_sample_ids: list = []
        # Two pinned landing buffers for sampled ids: one step's copy may still be in
        # flight while the next is issued.
        self._sampled_host = [
            torch.zeros(config.max_num_seqs, dtype=torch.long, pin_memory=on_gpu) for _ in range(2)
        ]
        self._sampled_events = [torch.cuda.Event() for _ in range(2)] if on_gpu else [None, None]
        self._sampled_host_index = 0
        self.last_step: StepRecord | None = None
        # Benchmarks set this to time the forward alone (two device syncs a step).
        self.time_forward = False

    def _view_staging(self) -> None:
        """Name the parts of the staging buffer as numpy arrays (what write_step fills)."""
        n, width = self.max_num_tokens, self.max_blocks_per_seq
        host = self._staging_np = self._staging.numpy()
        self._host_buffers = {  # the same memory, by name (mini_vllm/engine/input_batch.py)
            "input_ids": host[:n],
            "positions": host[n : 2 * n],
            "slot_mapping": host[2 * n : 3 * n],
            "seq_lens": host[3 * n : 4 * n],
            "query_start_loc": host[4 * n : 5 * n + 1],
            "block_tables": host[self._tables_start :].reshape(n, width),
        }

    # -- per-step work ---------------------------------------------------------------

    def dispatch(
        self, num_tokens: int, uniform_decode: bool
    ) -> tuple[CUDAGraphMode, BatchDescriptor]:
        """Which graph this batch runs on, and the padded key (eager batches stay unpadded)."""
        if self.capture_report is None:  # nothing captured (eager engine, or before capture)
            return CUDAGraphMode.NONE, BatchDescriptor(num_tokens, uniform=uniform_decode)
        return self.dispatcher.dispatch(num_tokens, uniform_decode)

    # ANCHOR: copy_inputs
    def _copy_in(self, inputs: ModelInputs, table_width: int) -> PagedAttentionMetadata:
        """Write the step's inputs into the front of the persistent buffers."""
        n, reqs, cap = inputs.num_tokens, inputs.num_reqs, self.max_num_tokens
        if self._copy_done is not None:
            self._copy_done.synchronize()  # the previous step's copy has left the staging buffer
        host = self._staging_np
        host[0:n] = inputs.input_ids
        host[cap : cap + n] = inputs.positions
        host[2 * cap : 2 * cap + n] = inputs.slot_mapping
        host[3 * cap : 3 * cap + reqs] = inputs.seq_lens
        host[4 * cap] = 0
        np.cumsum(inputs.query_lens, out=host[4 * cap + 1 : 4 * cap + 1 + reqs])
        tables = host[self._tables_start :].reshape(cap, self.max_blocks_per_seq)
        for row, table in enumerate(inputs.block_tables):
            tables[row, : len(table)] = table
        metadata = self._ship(
            n, reqs, table_width, inputs.query_lens, inputs.seq_lens, inputs.uniform_decode
        )
        if inputs.placeholder_tokens:  # after the copy, which would overwrite them
            self._fill_placeholders(inputs.placeholder_tokens, inputs.placeholder_seq_ids)
        return metadata

    # ANCHOR_END: copy_inputs

    # ANCHOR: ship_inputs
    def _ship(
        self, num_tokens, num_reqs, table_width, query_lens, seq_lens, uniform_decode
    ) -> PagedAttentionMetadata:
        """Send the staged inputs to the device (one copy) and describe them for attention."""
        if self._staging is not self._ints:  # GPU: ship them, asynchronously, in one copy
            # From the first id to the last table row used: the unused tails of the five
            # row arrays travel too (40 bytes a token of capacity, 80 KiB at 2048 tokens,
            # a few microseconds of the copy engine), which costs less than a copy per
            # array (each torch copy is microseconds of host time).
            end = self._tables_start + num_reqs * self.max_blocks_per_seq
            self._ints[:end].copy_(self._staging[:end], non_blocking=True)
            if self._copy_done is not None:
                self._copy_done.record()
        return PagedAttentionMetadata(
            slot_mapping=self.slot_mapping[:num_tokens],
            block_tables=self.block_tables[:num_reqs, :table_width],
            seq_lens=self.seq_lens[:num_reqs],
            query_lens=query_lens,
            seq_lens_host=seq_lens,
            uniform_decode=uniform_decode,
            query_start_loc=self.query_start_loc[: num_reqs + 1],
        )

    # ANCHOR_END: ship_inputs

    # ANCHOR: write_inputs
    def _write_inputs(
        self,
        output: SchedulerOutput,
        step: StepArrays,
        num_padded_tokens: int,
        runtime_mode: CUDAGraphMode,
    ) -> tuple[WrittenStep, PagedAttentionMetadata]:
        """The step's inputs into the persistent buffers, built as whole arrays
        (mini_vllm/engine/input_batch.py; `_copy_in` does the same from `ModelInputs`)."""
        if self._copy_done is not None:
            self._copy_done.synchronize()  # the previous step's copy has left the staging buffer
        written = write_step(step, num_padded_tokens, self._host_buffers, self.block_size)
        width = self._table_width(int(written.seq_lens.max(initial=1)), runtime_mode)
        metadata = self._ship(
            written.num_tokens,
            written.num_reqs,
            width,
            written.query_lens,
            written.seq_lens,
            step.uniform_decode,
        )
        if written.placeholder_tokens.size:
            # After the copy of the staged inputs, whose input ids hold 0 in these places:
            # on a GPU that copy would overwrite what the fill wrote (on the CPU the
            # staging buffer is the input buffer and there is no copy).
            rows = output.scheduled
            seq_ids = [rows[row].seq_id for row in written.placeholder_rows.tolist()]
            self._fill_placeholders(written.placeholder_tokens.tolist(), seq_ids)
        return written, metadata

    # ANCHOR_END: write_inputs

    # ANCHOR: fill_placeholders
    def _fill_placeholders(self, targets: list[int], seq_ids: list) -> None:
        """Async scheduling: tokens the previous step sampled, copied device to device.

        The host does not know them yet; the scheduler marked their places (`targets`,
        token indices, each of request `seq_ids[i]`) and the previous step's samples are
        still on the device, one row per request.
        """
        if self._prev_sampled is None:
            raise RuntimeError(
                "a step feeds a token in flight, but no step before it sampled on this runner"
            )
        count = len(targets)
        if seq_ids == self._prev_sample_ids[:count] and targets == list(range(count)):
            # Pure decode, the same requests in the same order: one contiguous copy.
            self.input_ids[:count].copy_(self._prev_sampled[:count])
            return
        row_of = {seq_id: row for row, seq_id in enumerate(self._prev_sample_ids)}
        sources = [row_of[seq_id] for seq_id in seq_ids]
        index = async_tensor_h2d([targets, sources], torch.long, self.device)
        self.input_ids.index_copy_(0, index[0], self._prev_sampled.index_select(0, index[1]))

    # ANCHOR_END: fill_placeholders

    def _forward_context(
        self,
        mode: CUDAGraphMode,
        descriptor: BatchDescriptor | None,
        metadata: PagedAttentionMetadata,
        skip_attention: bool = False,
    ):
        return set_forward_context(
            mode,
            descriptor,
            metadata,
            no_compile_layers=self.static_forward_context,
            skip_attention=skip_attention,
        )

    def _table_width(self, longest: int, runtime_mode: CUDAGraphMode) -> int:
        """Block-table columns attention reads: enough for the longest row (`longest` tokens)."""
        if runtime_mode is CUDAGraphMode.FULL:
            return self.max_blocks_per_seq  # a captured graph reads the whole table, always
        return max(1, math.ceil(longest / self.block_size))

    # ANCHOR: execute_model
    @torch.inference_mode()
    def execute_model(
        self, output: SchedulerOutput, non_blocking: bool = False
    ) -> list[int | None] | SampledTokens:
        """Run one step; return the sampled token of each row (None: the row samples nothing).

        `non_blocking` (async scheduling): return at once with a `SampledTokens` handle
        whose `.get()` waits for this step's tokens; the GPU still runs the step.
        """
        start = time.perf_counter()
        # ANCHOR: execute_forward
        step = gather_step(output)
        runtime_mode, descriptor = self.dispatch(step.num_tokens, step.uniform_decode)
        inputs, metadata = self._write_inputs(output, step, descriptor.num_tokens, runtime_mode)
        n = inputs.num_tokens
        forward_start = self._timestamp() if self.time_forward else 0.0
        with self._forward_context(runtime_mode, descriptor, metadata):
            hidden_states = self.graphs.forward(self.input_ids[:n], self.positions[:n])
        # ANCHOR_END: execute_forward
        forward_seconds = self._timestamp() - forward_start if self.time_forward else 0.0
        sampled: list[int | None] = [None] * output.num_reqs
        keep_prompt_logprobs = None
        if any(r.is_prefill and r.seq.sampling_params.prompt_logprobs is not None
               for r in output.scheduled):  # fmt: skip
            keep_prompt_logprobs = self._keep_prompt_logprobs(
                hidden_states, output, inputs.query_lens, non_blocking
            )
        sampling_rows = inputs.sampling_rows.tolist()
        if sampling_rows:
            # Only the rows that sample go through the LM head, after the graph (if any).
            # In a decode step they are the first rows in order: a slice, no index copy.
            k = len(sampling_rows)
            if inputs.logits_indices[-1] == k - 1:  # k increasing indices ending at k - 1
                selected = hidden_states[:k]
            else:
                rows = async_tensor_h2d(inputs.logits_indices, torch.long, self.device)
                selected = hidden_states.index_select(0, rows)
            logits = self.model.compute_logits(selected)  # every rank joins its gather
            if self.tp_rank > 0 and not self.every_rank_samples:
                # Only rank 0 samples: the others' random draws could never disagree with
                # its own, and their tokens are not needed (vLLM reads rank 0's output).
                self.last_step = self._record(
                    step, n, runtime_mode, time.perf_counter() - start, forward_seconds
                )
                return sampled
            scheduled = output.scheduled
            seqs = [scheduled[row].seq for row in sampling_rows]
            params = [seq.sampling_params for seq in seqs]
            generators = None
            if any(p.seed is not None for p in params):  # only seeded requests have their own
                generators = [
                    self._generator(scheduled[row], logits.shape[-1]) for row in sampling_rows
                ]
            processors = penalised_slots = None
            if any(p.uses_processors for p in params):  # the options beyond top-k / top-p
                histories = [(seq.prompt_token_ids, seq.output_token_ids) for seq in seqs]
                counts = None
                penalised = [i for i, p in enumerate(params) if p.uses_history]
                if penalised:  # their token counts are kept on the device from step to step
                    if self._penalties is None:
                        self._penalties = PenaltyCounts(logits.shape[-1], self.device)
                    counts, penalised_slots = self._penalties.gather(
                        [seqs[i] for i in penalised], penalised, len(params)
                    )
                    penalised_rows = async_tensor_h2d(penalised, torch.long, self.device)
                processors = SamplingBatch.build(
                    params, histories, self._eos_token_ids, logits.shape[-1], self.device, counts
                )
            wanted = [p.logprobs for p in params]
            raw_logprobs = None
            if any(k is not None for k in wanted):  # of the raw logits, as vLLM's default
                raw_logprobs = torch.log_softmax(logits.float(), dim=-1)
            sampled_ids = self.sampler(logits, params, generators, processors)
            if penalised_slots is not None:
                self._penalties.record(penalised_slots, sampled_ids.index_select(0, penalised_rows))
            keep_logprobs = None
            if raw_logprobs is not None:
                keep_logprobs = self._keep_logprobs(
                    raw_logprobs, sampled_ids, wanted, scheduled, sampling_rows, non_blocking
                )
            if non_blocking:
                # The next step may be planned on these before they reach the host.
                self._prev_sampled = sampled_ids
                self._prev_sample_ids = [seq.seq_id for seq in seqs]
                handle = self._copy_out(sampled_ids, sampling_rows, output.num_reqs)
                handle.when_landed = _both(keep_logprobs, keep_prompt_logprobs)
            else:
                for row, token in zip(sampling_rows, sampled_ids.tolist()):
                    sampled[row] = token
        elif non_blocking:
            handle = SampledTokens(None, None, [], output.num_reqs)
            if keep_prompt_logprobs is not None:  # a chunk short of the prompt's end
                self.graph_backend.synchronize()
                keep_prompt_logprobs()
        self.last_step = self._record(
            step, inputs.num_tokens, runtime_mode, time.perf_counter() - start, forward_seconds
        )
        return handle if non_blocking else sampled

    # ANCHOR_END: execute_model

    def _keep_logprobs(
        self, raw_logprobs, sampled_ids, wanted, scheduled, sampling_rows, non_blocking=False
    ) -> Callable[[], None] | None:
        """Each asking row's token log-probability, rank and top alternatives, kept on its
        request (`Sequence.token_logprobs`) by the token's place among the request's
        outputs: a recompute after a step was taken back overwrites its own.

        `non_blocking` (async scheduling): the values start their way to the host and the
        returned function, called once the step's copies have landed (`SampledTokens.get`),
        keeps them; nothing here waits for the GPU."""
        top = max(k for k in wanted if k is not None)
        # Queued before the sampled ids' own copy, whose event then covers these too.
        landing = [sampled_ids.to("cpu", non_blocking=non_blocking)]
        landing += _logprob_summary(raw_logprobs, sampled_ids, top, non_blocking)
        places = []  # (sampling row, alternatives wanted, request, place among its outputs)
        for i, (k, row) in enumerate(zip(wanted, sampling_rows)):
            if k is not None:
                seq = scheduled[row].seq
                places.append((i, k, seq, scheduled[row].context_len - seq.num_prompt_tokens))

        def keep() -> None:
            host = [t.tolist() for t in landing]
            for i, k, seq, place in places:
                alternatives = list(zip(host[4][i][:k], host[3][i][:k]))
                seq.token_logprobs[place] = (host[0][i], host[1][i], host[2][i], alternatives)

        if non_blocking:
            return keep
        keep()
        return None

    def _keep_prompt_logprobs(
        self, hidden_states, output, query_lens, non_blocking=False
    ) -> Callable[[], None] | None:
        """For each prefill row whose request asks for prompt_logprobs: the log-probability
        the model gives each prompt token after the first, from the hidden state of the
        token before it (computed this step), its rank and the most likely alternatives,
        kept on the request by prompt position (`Sequence.prompt_logprobs`). Only these rows'
        positions go through the LM head. `non_blocking`: as `_keep_logprobs`."""
        starts = np.cumsum(query_lens) - query_lens
        flat, targets, owners = [], [], []  # batch index, the token it predicts, (seq, k, pos)
        for row, scheduled in enumerate(output.scheduled):
            seq = scheduled.seq
            k = seq.sampling_params.prompt_logprobs
            if k is None or not scheduled.is_prefill:
                continue
            first = scheduled.num_computed_tokens
            last = min(first + scheduled.num_new_tokens, seq.num_prompt_tokens - 1)
            for position in range(first, last):  # predicts the prompt token at position + 1
                flat.append(int(starts[row]) + position - first)
                targets.append(seq.prompt_token_ids[position + 1])
                owners.append((seq, k, position + 1))
        if not flat:
            return None
        index = async_tensor_h2d(flat, torch.long, self.device)
        logits = self.model.compute_logits(hidden_states.index_select(0, index))
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        wanted = async_tensor_h2d(targets, torch.long, self.device)
        top = max(k for _, k, _ in owners)
        landing = _logprob_summary(logprobs, wanted, top, non_blocking)

        def keep() -> None:
            host = [t.tolist() for t in landing]
            for i, (seq, k, position) in enumerate(owners):
                alternatives = list(zip(host[3][i][:k], host[2][i][:k]))
                token = seq.prompt_token_ids[position]
                seq.prompt_logprobs[position] = (token, host[0][i], host[1][i], alternatives)

        if non_blocking:
            return keep
        keep()
        return None

    # ANCHOR: copy_out
    def _copy_out(self, sampled_ids: torch.Tensor, rows: list[int], num_rows: int) -> SampledTokens:
        """Start the copy of the sampled ids to the host; an event marks its end."""
        host = self._sampled_host[self._sampled_host_index][: len(rows)]
        event = self._sampled_events[self._sampled_host_index]
        self._sampled_host_index ^= 1  # the other buffer (and its event) may still be waited on
        host.copy_(sampled_ids, non_blocking=True)
        if event is not None:
            event.record()
        return SampledTokens(host, event, rows, num_rows)

    # ANCHOR_END: copy_out

    # -- Phase 05: capture ------------------------------------------------------------

    # ANCHOR: dummy_inputs
    def _dummy_inputs(self, descriptor: BatchDescriptor) -> ModelInputs:
        """A batch with the descriptor's shape whose rows write nothing to the KV cache."""
        n = descriptor.num_tokens
        rows = n if descriptor.uniform else 1  # a mixed key: one request of n tokens
        return ModelInputs(
            input_ids=[0] * n,
            positions=[0] * n,
            slot_mapping=[-1] * n,
            query_lens=[1] * n if descriptor.uniform else [n],
            seq_lens=[1] * rows if descriptor.uniform else [n],
            block_tables=[[] for _ in range(rows)],
            logits_indices=[],
            sampling_rows=[],
            uniform_decode=descriptor.uniform,
            num_real_tokens=n,
        )

    # ANCHOR_END: dummy_inputs

    # ANCHOR: compile_model
    @torch.inference_mode()
    def compile_model(self) -> CompileReport | None:
        """Trace and compile the model once, before capture, with a dummy batch.

        The dummy batch has at least two tokens: Dynamo specialises sizes 0 and 1, and
        the token dimension must stay symbolic so one compiled graph serves every size.
        """
        if self.compilation_mode is CompilationMode.NONE:
            return None
        n = max(2, min(16, self.max_num_tokens))
        inputs = self._dummy_inputs(BatchDescriptor(n))

        def run_once() -> None:
            metadata = self._copy_in(
                inputs, self._table_width(max(inputs.seq_lens), CUDAGraphMode.NONE)
            )
            with self._forward_context(CUDAGraphMode.NONE, None, metadata):
                self.graphs.forward(self.input_ids[:n], self.positions[:n])
            self.graph_backend.synchronize()

        self.compile_report = compile_and_record(
            self.model.config,
            self.compilation_mode,
            self.device,
            self.graphs.compile_stats,
            run_once,
            fusion=self.graphs.fusion,
            compiler=self.graphs.compiler,
            dtype=self.dtype,
        )
        return self.compile_report

    # ANCHOR_END: compile_model

    # ANCHOR: capture_model
    @torch.inference_mode()
    def capture_model(self, progress: bool = True) -> CaptureReport | None:
        """Capture every graph the dispatcher may ask for, largest first; then close the window."""
        keys = self.dispatcher.all_keys()  # mixed sizes largest first, then uniform FULL sizes
        # Tensor parallelism (Phase 07): a graph holds its all-reduces, so a rank that
        # captured other keys would one day replay collectives the others never launch.
        get_tp_group().check_same("the graphs to capture", [(m.name, k) for m, k in keys])
        if not keys:
            return None
        from tqdm.auto import tqdm

        start = time.perf_counter()
        warmup_seconds = 0.0
        # ANCHOR: capture_loop
        gc.collect()
        gc.freeze()  # capture creates many objects; don't let the collector walk them all
        set_cudagraph_capturing_enabled(True)
        try:
            for mode, descriptor in tqdm(
                keys,
                desc=f"capturing {self.cudagraph_mode.name} graphs",
                unit="graph",
                disable=not progress,
            ):
                inputs = self._dummy_inputs(descriptor)
                n = inputs.num_tokens
                width = self._table_width(max(inputs.seq_lens), mode)
                metadata = self._copy_in(inputs, width)
                # A PIECEWISE graph leaves attention out, so what attention computes in
                # these two runs is never recorded: it does no work here (vLLM's
                # `_dummy_run` builds attention metadata only for FULL keys).
                skip_attention = mode is CUDAGraphMode.PIECEWISE
                warmup_start = time.perf_counter()
                with (
                    self.graph_backend.warmup_context(),
                    self._forward_context(CUDAGraphMode.NONE, descriptor, metadata, skip_attention),
                ):
                    self.graphs.forward(self.input_ids[:n], self.positions[:n])
                # The capture begins with a synchronisation anyway: waiting here only
                # moves the warm-up's GPU time into the warm-up's share.
                self.graph_backend.synchronize()
                warmup_seconds += time.perf_counter() - warmup_start
                with self._forward_context(mode, descriptor, metadata, skip_attention):
                    self.graphs.forward(self.input_ids[:n], self.positions[:n])
            self.graph_backend.synchronize()
        finally:
            set_cudagraph_capturing_enabled(False)
            gc.unfreeze()
        # ANCHOR_END: capture_loop
        memory = self.graph_backend.pool_memory(self.graph_pool)
        self.capture_report = CaptureReport(
            num_graphs=self.graphs.num_captured_graphs,
            sizes=sorted({k.num_tokens for _, k in keys}, reverse=True),
            seconds=time.perf_counter() - start,
            graph_memory_bytes=memory,
            warmup_seconds=warmup_seconds,
        )
        logger.info(
            "captured %d graphs for %d sizes in %.2f s (warm-up runs %.2f s)%s",
            self.capture_report.num_graphs,
            len(self.capture_report.sizes),
            self.capture_report.seconds,
            warmup_seconds,
            "" if memory is None else f", graph memory {memory / 2**20:.1f} MiB",
        )
        return self.capture_report

    # ANCHOR_END: capture_model

    def _generator(self, row, vocab_size: int) -> torch.Generator | None:
        """The request's own generator (seeded requests), made at its first sample.

        A seeded request draws once per token it samples, so after `k` tokens its
        generator has made `k` draws. Made anew for a request that already has tokens
        (its step was taken back, see reset_request_state), it replays those `k` draws
        first, and the request goes on with the tokens it would have had.
        """
        seq = row.seq
        if seq.seq_id not in self._generators:
            generator = make_generator(seq.sampling_params, self.device)
            if generator is not None and not seq.sampling_params.greedy:
                scratch = torch.empty(vocab_size, dtype=torch.float32, device=self.device)
                for _ in range(row.context_len - seq.num_prompt_tokens):
                    scratch.exponential_(generator=generator)  # as the sampler draws
            self._generators[seq.seq_id] = generator
        return self._generators[seq.seq_id]

    def release_graphs(self, wait: bool = True) -> None:
        """Drop the captured graphs (before the process group goes), and wait for the device
        unless told not to: after the ranks parted, a kernel may wait on a peer for ever."""
        self.graphs.release_graphs()
        if wait:
            self.graph_backend.synchronize()

    def free_requests(self, seq_ids: SequenceT[object]) -> None:
        """Forget per-request state (sampling generators) of finished requests."""
        for seq_id in seq_ids:
            self._generators.pop(seq_id, None)
        if self._penalties is not None:
            self._penalties.free(seq_ids)

    def reset_request_state(self) -> None:
        """Forget every request's state: after a step was taken back, each unfinished
        request is recomputed from its tokens and its generator rebuilt (`_generator`)."""
        self._generators.clear()
        if self._penalties is not None:
            self._penalties.reset()
        self._prev_sampled = None
        self._prev_sample_ids = []

    def _timestamp(self) -> float:
        self.graph_backend.synchronize()
        return time.perf_counter()

    @staticmethod
    def _record(
        step: StepArrays,
        num_padded_tokens: int,
        mode: CUDAGraphMode,
        seconds: float,
        forward_seconds: float,
    ) -> StepRecord:
        prefill = int(step.query_lens[step.is_prefill].sum())
        return StepRecord(
            num_reqs=step.num_reqs,
            num_tokens=step.num_tokens,
            num_padded_tokens=num_padded_tokens,
            num_prefill_tokens=prefill,
            num_decode_tokens=step.num_tokens - prefill,
            uniform_decode=step.uniform_decode,
            runtime_mode=mode.name,
            seconds=seconds,
            forward_seconds=forward_seconds,
        )
