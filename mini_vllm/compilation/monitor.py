"""The capture window: graphs may be captured only while the engine is starting up.

vLLM counterpart: vllm/compilation/monitor.py (`set_cudagraph_capturing_enabled`,
`validate_cudagraph_capturing_enabled`). After `capture_model` the window closes;
a key that reaches a wrapper later must not trigger a capture in the middle of
serving (it would stall every running request and take memory nobody planned for),
so it is an error instead — the dispatcher only sends keys that were captured.
"""

from __future__ import annotations

__all__ = [
    "cudagraph_capturing_enabled",
    "set_cudagraph_capturing_enabled",
    "validate_cudagraph_capturing_enabled",
]

_capturing_enabled = True


def set_cudagraph_capturing_enabled(enabled: bool) -> None:
    global _capturing_enabled
    _capturing_enabled = enabled


def cudagraph_capturing_enabled() -> bool:
    return _capturing_enabled


def validate_cudagraph_capturing_enabled(what: str = "a CUDA graph") -> None:
    if not _capturing_enabled:
        raise RuntimeError(
            f"refusing to capture {what}: the capture window closed when the engine finished "
            "start-up. Only keys captured by capture_model() may be replayed; a batch with no "
            "graph must be dispatched to CUDAGraphMode.NONE (eager) instead"
        )
