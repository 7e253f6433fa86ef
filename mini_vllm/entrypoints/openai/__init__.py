"""The OpenAI-compatible API: `/v1/completions`, `/v1/chat/completions`, `/v1/models`.

vLLM counterpart: vllm/entrypoints/openai/ (api_server.py; the request and response shapes
in completion/protocol.py, chat_completion/protocol.py and engine/protocol.py; the
handlers in completion/serving.py and chat_completion/serving.py).
"""
