"""Small helpers shared by the engine, the teaching models and the tools.

vLLM counterpart: vllm/utils/ (its grab-bag of helpers; vLLM's CPU worker sets the
thread count once per process in vllm/v1/worker/cpu_worker.py).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

from mini_vllm.errors import UserError

__all__ = ["OneCallerAtATime", "cpu_threads_context", "synchronize"]


class OneCallerAtATime:
    """Refuses a second call while one is inside: an object that is not thread-safe says
    so at once, instead of two threads corrupting its state between them.

        guard = OneCallerAtATime("LLM.generate", advice="use one LLM per thread")
        with guard:
            ...
    """

    def __init__(self, name: str, advice: str) -> None:
        self._lock = threading.Lock()
        self._name, self._advice = name, advice

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            raise UserError(
                f"{self._name} is already running (in another thread, or in a callback "
                f"of the running call); it serves one caller at a time: {self._advice}"
            )

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()


def synchronize(device: torch.device | str) -> None:
    """Wait until `device` has finished the work queued on it (nothing to wait for on a CPU).

    GPU work is asynchronous: a clock read right after a launch stops before the kernels
    have run, so every timing of GPU work reads the clock after this.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def cpu_threads_context(device: torch.device | str, threads: int | str | None) -> Iterator[None]:
    """Run the block with `threads` intra-op CPU threads, then restore the count.

    `threads`: a number; or "auto" or None to leave PyTorch's setting (every core: the
    CPU linear layers split their small products over the cores, see
    mini_vllm/layers/linear.py). Nothing changes for work on another device.
    """
    if (
        torch.device(device).type != "cpu"
        or threads in ("auto", None)
        or threads == torch.get_num_threads()
    ):
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
