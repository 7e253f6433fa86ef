"""The engine: requests in, steps of the model, tokens out (Phases 02-05).

vLLM counterpart: vllm/v1/ (core/sched/ for the scheduler, core/kv_cache_manager.py for
the block manager, request.py, worker/gpu_model_runner.py, cudagraph_dispatcher.py,
engine/ for the loop: core.py, core_client.py). Import from the modules themselves
(`mini_vllm.engine.sequence`, `.block_manager`, `.scheduler`, ...); this package root
imports nothing, so importing one piece never drags in the others.
"""
