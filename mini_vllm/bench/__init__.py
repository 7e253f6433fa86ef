"""Measuring tools: the benchmarks of `python -m mini_vllm bench ...` and the ladder chooser.

vLLM counterpart: vllm/benchmarks/ (latency.py, throughput.py, serve.py), reached
through `vllm bench <latency|throughput|serve>`. Each module holds its measuring code,
importable on its own; mini_vllm/cli/bench.py only parses arguments. `harness.py` builds
the engine every decode benchmark (and the scripts in scripts/gpu/) times;
`ladder.py` chooses a capture ladder from a recorded batch-size trace (Phase 06);
`reliability.py` serves a load and injects faults into steps.
"""
