"""Every knob of the engine in one place, checked once, with what each one means.

vLLM counterpart: vllm/engine/arg_utils.py (`EngineArgs`) and the configs it builds in
vllm/config/ (`ModelConfig`, `CacheConfig`, `SchedulerConfig`, `CompilationConfig`).
`mini_vllm.LLM(...)` takes these fields as keyword arguments, as `vllm.LLM` does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mini_vllm.config.compilation import CompilationMode, CUDAGraphMode
from mini_vllm.engine.scheduler_config import SchedulerConfig
from mini_vllm.errors import UserError

__all__ = ["EngineConfig"]


@dataclass
class EngineConfig:
    # a model name (see `python -m mini_vllm generate --help`) or an HF directory
    model: str = "smollm2-135m-instruct"
    device: str = "cpu"
    dtype: str | None = None  # None: float32 on CPU, bfloat16 on CUDA
    seed: int = 0  # random weights and unseeded sampling
    # Intra-op threads on CPU while generating; "auto" and None: PyTorch's setting
    # (every core: small decode steps split their products over the cores, see
    # mini_vllm/layers/linear.py); a number: that many.
    cpu_threads: int | str | None = "auto"

    max_num_seqs: int = 16  # requests in one batch at most
    max_num_batched_tokens: int = 2048  # tokens one step may compute
    max_model_len: int | None = None  # None: the model's context length
    enable_chunked_prefill: bool = True

    block_size: int = 16  # tokens per KV block
    num_kv_blocks: int | None = None  # None: enough for max_num_seqs full-length requests
    enable_prefix_caching: bool = False

    enforce_eager: bool = False  # no CUDA graphs, no compilation
    # None: FULL_AND_PIECEWISE on CUDA (vLLM V1's default), NONE on CPU (as vLLM's CPU
    # platform). Ask for a mode on CPU to get the CPU recording graphs of Phase 05.
    cudagraph_mode: CUDAGraphMode | str | None = None
    cudagraph_capture_sizes: list[int] | None = None  # None: vLLM's default ladder
    debug_cudagraphs: bool = False  # check input addresses on every replay
    compilation_mode: CompilationMode | str | int = CompilationMode.NONE
    # VLLM_COMPILE's fusion pass (norm / SwiGLU into the next product; vLLM: PassConfig's
    # fusion switches). None: on for CUDA, where the fused kernels exist.
    enable_fusion: bool | None = None
    # Plan step N+1 while the device computes step N (vLLM: --async-scheduling); see
    # mini_vllm/engine/async_scheduler.py. Tokens are the same; steps overlap.
    async_scheduling: bool = False

    def __post_init__(self) -> None:
        if self.cudagraph_mode is None:
            on_gpu = str(self.device).startswith("cuda")
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
        if self.enforce_eager:
            self.cudagraph_mode = CUDAGraphMode.NONE
            self.compilation_mode = CompilationMode.NONE
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise UserError(f"block_size must be a power of two >= 1, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise UserError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise UserError(
                "max_model_len must be >= 2 (a prompt token "
                f"and a new one), got {self.max_model_len}"
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

    def scheduler_config(self, max_model_len: int) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=max_model_len,
            enable_chunked_prefill=self.enable_chunked_prefill,
        )
