"""Every knob of the engine in one place, checked once, with what each one means.

vLLM counterpart: vllm/engine/arg_utils.py (`EngineArgs`) and the configs it builds in
vllm/config/ (`ModelConfig`, `CacheConfig`, `SchedulerConfig`, `CompilationConfig`).
`mini_vllm.LLM(...)` takes these fields as keyword arguments, as `vllm.LLM` does.

Every field is checked here, before a model is loaded or a byte of cache allocated,
and a message names the field and what to give instead. What needs the model's shape
(the KV cache's size against max_model_len and free memory) is checked next, still
before any allocation, by mini_vllm/engine/kv_cache_plan.py.

`max_num_seqs` and `max_num_batched_tokens` left unset are resolved here, by device and
entry point (`default_batch_limits`): on a GPU vLLM's defaults, which depend on the GPU's
memory and on whether the engine serves `LLM(...)` or the OpenAI server; on CPU 16 and
2048, a laptop's share.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch

from mini_vllm import _custom_ops as ops
from mini_vllm.config.capture_sizes import normalize_capture_sizes
from mini_vllm.config.compilation import CompilationMode, CUDAGraphMode
from mini_vllm.engine.scheduler_config import SchedulerConfig
from mini_vllm.errors import UserError
from mini_vllm.models.loader import resolve_device, resolve_dtype

__all__ = ["USAGE_CONTEXTS", "EngineConfig", "default_batch_limits", "gpu_memory_and_name"]

# Which entry point an engine serves, as vLLM's UsageContext (vllm/usage/usage_lib.py):
# `LLM(...)` (offline, whole batches: throughput) or the OpenAI server (`serve`: a smaller
# step budget, so that a long prompt delays the other streams' next tokens less).
USAGE_CONTEXTS = ("llm_class", "openai_api_server")

# (max_num_seqs, max_num_batched_tokens) by usage context, as vLLM's
# `EngineArgs.get_batch_defaults` (see `default_batch_limits`).
LARGE_GPU_BATCH_LIMITS = {"llm_class": (1024, 16384), "openai_api_server": (1024, 8192)}
GPU_BATCH_LIMITS = {"llm_class": (256, 8192), "openai_api_server": (256, 2048)}
CPU_BATCH_LIMITS = (16, 2048)
LARGE_GPU_BYTES = 70 * 2**30
# vLLM's largest block size choice; a larger block only wastes its unused tail.
MAX_BLOCK_SIZE = 256
# The GPUs of one machine, at most, for the executor that starts the ranks itself; under a
# launcher (torchrun, several machines) the ranks of a few machines.
MAX_TENSOR_PARALLEL_SIZE = 8
MAX_LAUNCHED_TENSOR_PARALLEL_SIZE = 64


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def gpu_memory_and_name(device: str) -> tuple[int, str]:
    """The GPU's total memory in bytes and its name: what vLLM's batch defaults depend on."""
    properties = torch.cuda.get_device_properties(torch.device(device))
    return properties.total_memory, properties.name


def default_batch_limits(device: str, usage_context: str) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) for an engine that leaves them unset.

    On a GPU, vLLM's table: `EngineArgs.get_batch_defaults` in vllm/engine/arg_utils.py
    (https://github.com/vllm-project/vllm/blob/9aaf83ef502fc37bc647f6e474314d48ba36cd1c/vllm/engine/arg_utils.py#L2258-L2340).
    With at least 70 GiB and not an A100 (vLLM measured a lower throughput on A100s with
    the large budget, its PR #17885): 1024 requests, 16384 tokens a step for `LLM(...)`
    and 8192 for the server; any other GPU: 256 requests, 8192 and 2048 tokens.
    On CPU, 16 and 2048 whatever the entry point: a laptop-sized engine (vLLM's CPU
    platform takes 256 requests and 4096 tokens, sized for servers).
    """
    if not device.startswith("cuda"):
        return CPU_BATCH_LIMITS
    total_bytes, name = gpu_memory_and_name(device)
    large = total_bytes >= LARGE_GPU_BYTES and "a100" not in name.lower()
    return (LARGE_GPU_BATCH_LIMITS if large else GPU_BATCH_LIMITS)[usage_context]


@dataclass
class EngineConfig:
    # a model name (see `python -m mini_vllm generate --help`) or an HF directory
    model: str = "smollm2-135m-instruct"
    device: str = "cpu"
    dtype: str | None = None  # None: float32 on CPU, bfloat16 on CUDA
    seed: int = 0  # random weights and unseeded sampling
    # Intra-op threads on CPU while generating; "auto" and None: PyTorch's setting
    # (every core: small decode steps split their products over the cores, see
    # mini_vllm/kernels/cpu.py); a number: that many.
    cpu_threads: int | str | None = "auto"

    # Requests in one batch at most, and tokens one step may compute. None: the device's
    # defaults for the entry point (`default_batch_limits`); ints once the config is built.
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None  # None: the model's context length
    enable_chunked_prefill: bool = True
    # "llm_class" (`LLM(...)`) or "openai_api_server" (what `serve` asks for): which of
    # vLLM's defaults an unset max_num_seqs / max_num_batched_tokens gets on a GPU.
    usage_context: str = "llm_class"

    block_size: int = 16  # tokens per KV block
    # The KV cache's size: give at most one of the two. Neither: on CUDA what
    # gpu_memory_utilization leaves, on CPU at most 1 GiB, and never more than max_num_seqs
    # full-length requests can use (mini_vllm/engine/kv_cache_plan.py).
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    # The fraction of the GPU's memory this engine may take: weights, activations, CUDA
    # graphs and the KV cache, which gets what is left (vLLM's name and default). CUDA only.
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = False

    enforce_eager: bool = False  # no CUDA graphs, no compilation
    # None: FULL_AND_PIECEWISE on CUDA (vLLM V1's default), NONE on CPU (as vLLM's CPU
    # platform). Ask for a mode on CPU to get the CPU recording graphs of Phase 05.
    cudagraph_mode: CUDAGraphMode | str | None = None
    cudagraph_capture_sizes: list[int] | None = None  # None: vLLM's default ladder
    debug_cudagraphs: bool = False  # check input addresses on every replay
    compilation_mode: CompilationMode | str | int = CompilationMode.NONE
    # Which layers run mini_vllm's own kernels (vLLM: CompilationConfig.custom_ops): "all",
    # "none", then "+name" / "-name" (mini_vllm/_custom_ops.py); a string or a list. None:
    # the setting around (the environment's MINI_VLLM_CUSTOM_OPS, else "all"). Held as the
    # set of ops it turns on.
    custom_ops: str | list[str] | frozenset[str] | None = None
    # VLLM_COMPILE's fusion pass (norm / SwiGLU into the next product; vLLM: PassConfig's
    # fusion switches). None: on for CUDA, where the fused kernels exist and `linear` runs
    # them.
    enable_fusion: bool | None = None
    # Plan step N+1 while the device computes step N (vLLM: --async-scheduling); see
    # mini_vllm/engine/async_scheduler.py. Tokens are the same; steps overlap.
    async_scheduling: bool = False
    # Ranks the model is split over, one process each on this machine (vLLM's name):
    # mini_vllm/executor/multiproc_executor.py. 1: the single-process engine.
    tensor_parallel_size: int = 1
    # Who starts the ranks (vLLM's name): "mp" (the default), this process starts one a
    # rank on this machine (mini_vllm/executor/multiproc_executor.py); "external_launcher",
    # a launcher such as torchrun started every rank, each of which runs the whole engine
    # (mini_vllm/executor/external_launcher.py).
    distributed_executor_backend: str = "mp"

    def __post_init__(self) -> None:
        self._check_fields()
        self._check_tensor_parallel_size()
        self._resolve_batch_limits()
        if self.cudagraph_capture_sizes is not None:
            normalize_capture_sizes(self.cudagraph_capture_sizes, self.max_num_batched_tokens)
        if self.custom_ops is None:
            self.custom_ops = ops.current_custom_ops()
        elif not isinstance(self.custom_ops, frozenset):
            self.custom_ops = ops.parse_custom_ops(self.custom_ops)
        if self.cudagraph_mode is None:
            on_gpu = self.device.startswith("cuda")
            self.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE if on_gpu else CUDAGraphMode.NONE
        self.cudagraph_mode = CUDAGraphMode.from_name(self.cudagraph_mode)
        self.compilation_mode = CompilationMode.from_name(self.compilation_mode)
        if self.enable_fusion and (
            self.enforce_eager or self.compilation_mode is not CompilationMode.VLLM_COMPILE
        ):
            raise UserError(
                "enable_fusion=True needs compilation_mode='vllm_compile' (the fusion passes run "
                "in its compile backend) and no enforce_eager; leave enable_fusion unset otherwise"
            )
        if self.enable_fusion and "linear" not in self.custom_ops:
            raise UserError(
                "enable_fusion=True folds norms and activations into mini_vllm's product "
                "kernels, which custom_ops turns off here; add '+linear' to custom_ops, or "
                "leave enable_fusion unset"
            )
        if self.enforce_eager:
            self.cudagraph_mode = CUDAGraphMode.NONE
            self.compilation_mode = CompilationMode.NONE
        # The scheduler's own checks, now rather than once the model is loaded (the
        # one that needs max_model_len runs again when it is known).
        self.scheduler_config(self.max_model_len or 1)

    # ANCHOR: check_fields
    def _check_fields(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise UserError(f"model must be a model name or a directory, got {self.model!r}")
        if not isinstance(self.device, str) or not (
            self.device in ("cpu", "cuda")
            or (self.device.startswith("cuda:") and self.device[5:].isdigit())
        ):
            raise UserError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        resolve_dtype(self.dtype, resolve_device(self.device))  # a known dtype, a device present
        if not _is_int(self.seed):
            raise UserError(f"seed must be an integer, got {self.seed!r}")
        if self.cpu_threads not in ("auto", None) and not (
            _is_int(self.cpu_threads) and self.cpu_threads >= 1
        ):
            raise UserError(
                f"cpu_threads must be 'auto', None or an integer >= 1, got {self.cpu_threads!r}"
            )
        at_least = {"max_num_seqs": 1, "max_num_batched_tokens": 1, "block_size": 1}
        at_least |= {"max_model_len": 2, "num_kv_blocks": 1, "kv_cache_memory_bytes": 1}
        for name, minimum in at_least.items():
            value = getattr(self, name)
            optional = name != "block_size"
            if (value is None and optional) or (_is_int(value) and value >= minimum):
                continue
            hint = " (a prompt token and a new one)" if name == "max_model_len" else ""
            raise UserError(
                f"{name} must be an integer >= {minimum}{hint}"
                f"{' or None' if optional else ''}, got {value!r}"
            )
        if self.block_size & (self.block_size - 1) or self.block_size > MAX_BLOCK_SIZE:
            raise UserError(
                f"block_size must be a power of two of at most {MAX_BLOCK_SIZE} tokens, got "
                f"{self.block_size}"
            )
        cores = os.cpu_count() or 1
        if _is_int(self.cpu_threads) and self.cpu_threads > cores:
            raise UserError(
                f"cpu_threads={self.cpu_threads} is more than this machine's {cores} logical "
                f"CPUs; give at most {cores}, or 'auto'"
            )
        if self.num_kv_blocks is not None and self.kv_cache_memory_bytes is not None:
            raise UserError(
                "give the KV cache's size once: num_kv_blocks or kv_cache_memory_bytes, not both"
            )
        utilization = self.gpu_memory_utilization
        if not (
            isinstance(utilization, (int, float))
            and not isinstance(utilization, bool)
            and 0 < utilization <= 1
        ):
            raise UserError(
                "gpu_memory_utilization must be a number in (0, 1], the fraction of the GPU's "
                f"memory this engine may use (default 0.9), got {utilization!r}"
            )
        if self.usage_context not in USAGE_CONTEXTS:
            raise UserError(
                f"usage_context must be one of {', '.join(USAGE_CONTEXTS)}, "
                f"got {self.usage_context!r}"
            )
        for name in (
            "enable_chunked_prefill",
            "enable_prefix_caching",
            "enforce_eager",
            "debug_cudagraphs",
            "async_scheduling",
        ):
            if not isinstance(getattr(self, name), bool):
                raise UserError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.enable_fusion not in (None, True, False):
            raise UserError(
                f"enable_fusion must be None, True or False, got {self.enable_fusion!r}"
            )
        if isinstance(self.cudagraph_capture_sizes, (str, bytes)):
            raise UserError(
                "cudagraph_capture_sizes must be a list of integers, "
                f"got {self.cudagraph_capture_sizes!r}"
            )

    # ANCHOR_END: check_fields

    # ANCHOR: check_tensor_parallel
    def _check_tensor_parallel_size(self) -> None:
        tp = self.tensor_parallel_size
        backends = ("mp", "external_launcher")
        if self.distributed_executor_backend not in backends:
            raise UserError(
                f"distributed_executor_backend must be one of {', '.join(backends)}, got "
                f"{self.distributed_executor_backend!r}"
            )
        launched = self.distributed_executor_backend == "external_launcher"
        most = MAX_LAUNCHED_TENSOR_PARALLEL_SIZE if launched else MAX_TENSOR_PARALLEL_SIZE
        if not _is_int(tp) or not 1 <= tp <= most:
            where = "the ranks a launcher started" if launched else "the ranks of one machine"
            raise UserError(
                f"tensor_parallel_size must be an integer from 1 to {most} ({where}), got {tp!r}"
            )
        if tp == 1:
            return
        if launched:
            from mini_vllm.executor.external_launcher import launcher_env

            # Launched as it should be, before anything is allocated.
            _, _, local_world = launcher_env(tp)
            if self.device != "cpu" and local_world > torch.cuda.device_count():
                raise UserError(
                    f"the launcher started {local_world} ranks on this machine, which has "
                    f"{torch.cuda.device_count()} GPUs: one GPU a rank (--nproc-per-node)"
                )
        elif self.device == "cpu":
            cores = os.cpu_count() or 1
            if tp > cores:
                raise UserError(
                    f"tensor_parallel_size={tp} on the CPU needs a core a rank, but this "
                    f"machine has {cores}; give at most {cores}"
                )
        if self.device != "cpu":
            gpus = torch.cuda.device_count()
            if self.device != "cuda":
                raise UserError(
                    f"tensor_parallel_size={tp} puts rank r on cuda:r; give device='cuda', "
                    f"not {self.device!r}"
                )
            if tp > gpus and self.distributed_executor_backend == "mp":
                raise UserError(
                    f"tensor_parallel_size={tp} needs {tp} GPUs, this machine has {gpus}"
                )
        if self.async_scheduling:
            raise UserError(
                "async_scheduling with tensor_parallel_size > 1 is not supported yet; "
                "drop one of the two"
            )

    def check_tensor_parallel(self, model_config) -> None:
        """Whether the model splits over `tensor_parallel_size` ranks (before any allocation)."""
        tp = self.tensor_parallel_size
        heads, kv_heads = model_config.num_attention_heads, model_config.num_key_value_heads
        problems = []
        if heads % tp:
            problems.append(f"its {heads} attention heads")
        if kv_heads % tp and tp % kv_heads:  # split, or each KV head on tp / kv_heads ranks
            problems.append(f"its {kv_heads} KV heads (nor is {tp} a multiple of them)")
        if model_config.intermediate_size % tp:
            problems.append(f"its MLP width {model_config.intermediate_size}")
        if problems:
            divisors = [n for n in range(1, MAX_TENSOR_PARALLEL_SIZE + 1) if heads % n == 0]
            raise UserError(
                f"tensor_parallel_size={tp} does not divide {' and '.join(problems)} of "
                f"{self.model!r}; the head count divides by {divisors}"
            )

    # ANCHOR_END: check_tensor_parallel

    def _resolve_batch_limits(self) -> None:
        """Give an unset max_num_seqs / max_num_batched_tokens the device's default.

        On a GPU, then vLLM's adjustments of a defaulted value
        (`EngineArgs._set_default_max_num_seqs_and_batched_tokens_args`, same file as
        `default_batch_limits`), where they need max_model_len only when it is given:
        without chunked prefill the step budget grows to max_model_len (a whole prompt must
        fit in one step); it shrinks to max_num_seqs * max_model_len, all a step could ever
        hold; and max_num_seqs shrinks to the step budget (a decode step needs a token per
        request). On CPU the defaults are taken as they are.
        """
        if self.max_num_seqs is not None and self.max_num_batched_tokens is not None:
            return
        default_seqs, default_tokens = default_batch_limits(self.device, self.usage_context)
        on_gpu = self.device.startswith("cuda")
        if self.max_num_batched_tokens is None:
            tokens = default_tokens
            if on_gpu and self.max_model_len is not None:
                if not self.enable_chunked_prefill:
                    tokens = max(tokens, self.max_model_len)
                tokens = min(tokens, (self.max_num_seqs or default_seqs) * self.max_model_len)
            self.max_num_batched_tokens = tokens
        if self.max_num_seqs is None:
            self.max_num_seqs = (
                min(default_seqs, self.max_num_batched_tokens) if on_gpu else default_seqs
            )

    @classmethod
    def from_kwargs(cls, **kwargs: object) -> EngineConfig:
        """Build from keyword arguments, refusing unknown ones with the list of known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise UserError(
                f"unknown engine option(s) {unknown}; known: {', '.join(sorted(known))}"
            )
        return cls(**kwargs)

    def fusion_enabled(self) -> bool:
        """Whether VLLM_COMPILE runs the fusion passes: as asked, else on CUDA where the
        product kernels they fuse into are on."""
        if self.enable_fusion is not None:
            return self.enable_fusion
        return self.device.startswith("cuda") and ops.enabled("linear", self.custom_ops)

    def scheduler_config(self, max_model_len: int) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=max_model_len,
            enable_chunked_prefill=self.enable_chunked_prefill,
        )
