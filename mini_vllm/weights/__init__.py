"""Where weights come from: a GGUF file, a Hugging Face directory, and the on-disk cache.

vLLM counterpart: vllm/model_executor/model_loader/ (weight_utils.py, gguf_loader.py,
default_loader.py). `mini_vllm.models.loader.load_model` is the one entry point; these
modules only read, convert and cache tensors.
"""
