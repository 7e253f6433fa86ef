"""Model definitions (Phase 01): the Llama family, its named shapes and the loader.

vLLM counterpart: vllm/model_executor/models/ (one file per architecture) and
vllm/model_executor/model_loader/. Import from the submodules:
`mini_vllm.models.config`, `mini_vllm.models.llama`, `mini_vllm.models.loader`.
"""
