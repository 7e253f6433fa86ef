"""The engine's modes and ladder: how much is compiled, which graphs are captured, at which sizes.

vLLM counterpart: vllm/config/ (compilation.py for `CUDAGraphMode` and `CompilationMode`,
vllm.py for the default capture sizes). Import from the modules themselves:
`mini_vllm.config.compilation`, `mini_vllm.config.capture_sizes`. The engine's other
knobs are in mini_vllm/engine/engine_config.py (`EngineConfig`, vLLM's `EngineArgs`).
"""
