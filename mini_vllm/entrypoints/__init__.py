"""Serving entry points: the OpenAI-compatible HTTP server and the engine loop behind it.

vLLM counterpart: vllm/entrypoints/ (`vllm serve`: vllm/entrypoints/openai/api_server.py)
and vllm/v1/engine/async_llm.py (`AsyncLLM`, the engine as the server sees it).

- `async_llm.py`: one thread owns the `LLMEngine` and steps it; requests arrive on a queue,
  tokens go back to each HTTP handler through its own asyncio queue.
- `metrics.py`: the Prometheus metrics (`/metrics`), named `mini_vllm:*` like vLLM's `vllm:*`.
- `openai/`: the request and response shapes, the completion and chat handlers, the app.
"""
