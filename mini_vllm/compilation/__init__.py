"""CUDA graphs and torch.compile on the engine's real path (Phase 05).

vLLM counterpart: vllm/compilation/. `backends.build_graph_forward` is the entry point
the model runner calls: it wraps the model in `CUDAGraphWrapper`s (cuda_graph.py; the
graph type and its memory come from graph_backend.py, the CPU look-alike from
cpu_graph.py), splits it at attention for piecewise graphs (split.py, attention_op.py)
and compiles it (decorators.py, piecewise_backend.py). These are the seams a reader
follows.

Two subfolders hold what makes it faster, not what makes it work:
    passes/   the fusion passes run on the traced graph (vllm/compilation/fusion.py, ...)
    caching/  the compiled model saved and loaded at start-up, Inductor's cache directory
              and the compile-time record (vllm/compilation/caching.py,
              compiler_interface.py)
"""
