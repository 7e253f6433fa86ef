"""The engine core: requests, the paged-KV block manager and the scheduler (Phases 02–03).

vLLM counterpart: vllm/v1/core/ (the scheduler and the KV cache manager) and
vllm/v1/request.py. Import from the modules themselves
(`mini_vllm.engine.sequence`, `.block_manager`, `.scheduler`); this package root
imports nothing, so importing one piece never drags in the others.
"""
