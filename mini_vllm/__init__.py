"""mini_vllm: a small, real, vLLM-shaped inference engine, built up by the course.

    from mini_vllm import LLM, SamplingParams

What is where (each with the vLLM code it mirrors). The first three parts are the reading
path: what a student reads to follow `LLM.generate`, plain torch throughout. The
performance layer makes the same engine fast and can be switched off
(`custom_ops="none"`, MINI_VLLM_CUSTOM_OPS=none); nothing on the reading path imports it.

The public API
    llm.py            `LLM`: offline generation (vllm/entrypoints/llm.py)
    sampling_params.py  `SamplingParams` (vllm/sampling_params.py)
    outputs.py        `RequestOutput` and its `CompletionOutput`s (vllm/outputs.py)
    errors.py         `UserError`: a mistake the user can fix (the CLI prints it in one line)
    entrypoints/      the OpenAI-compatible server, its side of the engine, its Prometheus metrics
                      (vllm/entrypoints/openai/, vllm/v1/engine/async_llm.py)

The engine (what `LLM` runs)
    engine/           requests, block manager, scheduler, model runner, graph dispatcher (vllm/v1/)
    config/           compilation and CUDA-graph modes, the capture-size ladder (vllm/config/)
    compilation/      CUDA-graph wrappers, the piecewise split, compile backends
                      (vllm/compilation/); its passes/ and caching/ belong to the
                      performance layer
    forward_context.py  what the current forward is, read by layers (vllm/forward_context.py)
    models/           the Llama model, the named shapes, the loader (vllm/model_executor/models/)
    layers/           norm, RoPE, linear, activation, attention layer, sampler: each a
                      `forward_native` in plain torch (vllm/model_executor/layers/)
    attention/        attention backends: contiguous and paged KV caches, the selector
                      (vllm/v1/attention/, vllm/attention/selector.py)
    weights/          GGUF and safetensors readers, the converted-weights cache
                      (vllm/model_executor/model_loader/)
    distributed/      tensor parallelism's process group and collectives, the all-reduce op
                      (vllm/distributed/parallel_state.py, communication_op.py)
    executor/         one process a tensor-parallel rank, each step sent to all
                      (vllm/v1/executor/multiproc_executor.py)
    tokenizer.py      tokenizers and incremental detokenisation (vllm/transformers_utils/)
    envs.py           every MINI_VLLM_* environment switch (vllm/envs.py)
    utils.py          small helpers shared by the engine and the tools (vllm/utils/)
    torch_utils.py    custom ops registered directly with the dispatcher
                      (vllm/utils/torch_utils.py)

The performance layer
    _custom_ops.py    the one door from the layers to the kernels, and the `custom_ops`
                      switch (vllm/_custom_ops.py, CompilationConfig.custom_ops)
    kernels/          Triton kernels and their launcher and tuning, the fused ops, the CPU's
                      split products (csrc/, vllm/attention/ops/)
    compat.py         every private torch and Triton name, the versions they were checked
                      on, which fast paths are on and why (vllm/utils/torch_utils.py)

The teaching models (one idea alone; the engine never imports them)
    teaching/         the CUDA-graph simulator, the launch-overhead timeline, Phase 00's loop
    cudagraph.py      the simulator under the name the course imports: `mini_vllm.cudagraph`

The tools
    bench/            benchmarks and the capture-ladder chooser (vllm/benchmarks/)
    cli/              `python -m mini_vllm generate | serve | simulate | bench | doctor`
                      (vllm/entrypoints/cli/)

The package root stays light: `LLM` (which imports torch) is loaded on first use.
"""

__version__ = "0.1.0"
__all__ = [
    "LLM",
    "CompletionOutput",
    "Logprob",
    "RequestOutput",
    "SamplingParams",
    "__version__",
]


def __getattr__(name: str):
    if name == "LLM":
        from mini_vllm.llm import LLM

        return LLM
    if name == "SamplingParams":
        from mini_vllm.sampling_params import SamplingParams

        return SamplingParams
    if name in ("CompletionOutput", "Logprob", "RequestOutput"):
        from mini_vllm import outputs

        return getattr(outputs, name)
    raise AttributeError(f"module 'mini_vllm' has no attribute {name!r}")
