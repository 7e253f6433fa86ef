"""What a later start reuses: the compiled model saved whole, Inductor's cache directory and
the record of compile times (vLLM: vllm/compilation/caching.py, compiler_interface.py)."""
