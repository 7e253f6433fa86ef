"""Benchmarks that the `python -m mini_vllm bench ...` sub-commands run.

vLLM counterpart: vllm/benchmarks/ (latency.py, throughput.py, serve.py), reached
through `vllm bench <latency|throughput|serve>`. Each module here holds the measuring
code, importable on its own; mini_vllm/cli/bench.py only parses arguments.
"""
