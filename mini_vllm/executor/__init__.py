"""How the engine's steps reach the model's ranks (vLLM: vllm/v1/executor/, whose
`Executor.get_class` picks one by `distributed_executor_backend`).

- `multiproc_executor.py` ("mp"): this process is rank 0 and starts the others, one
  process a rank on this machine; one scheduler (rank 0's) drives them all.
- `external_launcher.py` ("external_launcher"): a launcher (torchrun) started every rank;
  each runs the whole engine on the same requests (SPMD), on one machine or several.
"""

from __future__ import annotations

from mini_vllm.executor.external_launcher import ExternalLauncherExecutor
from mini_vllm.executor.multiproc_executor import MultiprocExecutor

__all__ = ["Executor", "ExternalLauncherExecutor", "MultiprocExecutor", "make_executor"]

Executor = MultiprocExecutor | ExternalLauncherExecutor


def make_executor(config) -> Executor | None:
    """The executor `config` asks for; None for one rank (the engine runs the model itself)."""
    if config.tensor_parallel_size == 1:
        return None
    if config.distributed_executor_backend == "external_launcher":
        return ExternalLauncherExecutor(config)
    return MultiprocExecutor(config)
