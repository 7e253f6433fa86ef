"""Attention backends: the code that owns the KV cache layout and computes attention.

vLLM counterpart: vllm/attention/backends/ and vllm/v1/attention/backends/. The model's
`Attention` layer (mini_vllm/layers/attention.py) stays the same while the backend
changes: the contiguous cache of Phase 00 here, the paged cache from Phase 02 on.
"""
