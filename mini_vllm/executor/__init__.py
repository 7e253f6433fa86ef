"""How the engine's steps reach the model's ranks (vLLM: vllm/v1/executor/)."""

from mini_vllm.executor.multiproc_executor import MultiprocExecutor

__all__ = ["MultiprocExecutor"]
