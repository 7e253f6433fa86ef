"""CUDA graphs and torch.compile on the engine's real path (Phase 05).

vLLM counterpart: vllm/compilation/. `backends.build_graph_forward` is the entry point
the model runner calls: it wraps the model in `CUDAGraphWrapper`s (cuda_graph.py; the
graph type and its memory come from graph_backend.py, the CPU look-alike from
cpu_graph.py), splits it at attention for piecewise graphs (split.py, attention_op.py)
and compiles it (decorators.py, piecewise_backend.py, fusion.py, compile_cache.py).
"""
