"""Serving entry points: the OpenAI-compatible HTTP server and the engine loop behind it.

vLLM counterpart: vllm/entrypoints/ (`vllm serve`: vllm/entrypoints/openai/api_server.py)
and vllm/v1/engine/async_llm.py (`AsyncLLM`, the engine as the server sees it).

- `async_llm.py`: the server's side of the engine: each HTTP handler gets an async generator
  of its tokens; the engine core (mini_vllm/engine/core.py), in a process of its own or a
  thread, owns the `LLMEngine` and steps it.
- `metrics.py`: the Prometheus metrics (`/metrics`), named `mini_vllm:*` like vLLM's `vllm:*`.
- `openai/`: the request and response shapes, the completion and chat handlers, the app.
"""
