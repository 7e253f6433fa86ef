"""The building blocks a decoder layer is made of (Phase 01).

vLLM counterpart: vllm/model_executor/layers/ (layernorm.py, rotary_embedding.py,
activation.py, linear.py, sampler) and vllm/attention/layer.py for `Attention`.
Each file here holds one idea, so a chapter can include it whole.
"""
