"""Compile-time passes over the graph Dynamo traced (vLLM: vllm/compilation/ passes, run by
its `PostGradPassManager`)."""
