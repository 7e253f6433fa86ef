"""Pytest options shared by the package tests (tests/) and the labs (labs/).

--impl=student|ref   which implementation a lab's tests import: the lab's starter file
                     (default, so a student sees their own code tested) or mini_vllm.
--require-gpu        GPU-REQ tests fail instead of skipping when CUDA is absent.

MINI_VLLM_TORCH_THREADS=N sets torch's thread count for the run (the labs' meta-test runs
each lab on 1 and on 4 threads: OMP_NUM_THREADS alone is capped at the number of cores).
"""

from __future__ import annotations

import os

import pytest

GPU_SKIP_REASON = "GPU-REQ: needs an NVIDIA GPU with CUDA (torch.cuda.is_available() is False here)"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mini_vllm")
    group.addoption(
        "--impl",
        choices=("student", "ref"),
        default=None,
        help="lab tests import the lab's starter (student, the default) or mini_vllm (ref)",
    )
    group.addoption(
        "--require-gpu",
        action="store_true",
        default=False,
        help="fail GPU-REQ tests instead of skipping them when CUDA is unavailable",
    )


def pytest_configure(config: pytest.Config) -> None:
    impl = config.getoption("--impl")
    if impl is not None:
        # labkit reads the choice from the environment, so that it also reaches
        # subprocesses (pytest-xdist workers, the meta-test's runs).
        os.environ["MINI_VLLM_IMPL"] = impl
    _share_cpu_threads_among_workers()
    if os.environ.get("MINI_VLLM_TORCH_THREADS"):
        import torch

        torch.set_num_threads(int(os.environ["MINI_VLLM_TORCH_THREADS"]))


def _share_cpu_threads_among_workers() -> None:
    """Under pytest-xdist, give each worker its share of the cores, not all of them.

    Every process would otherwise run torch's default (all cores) at once, and OpenMP
    threads that outnumber the cores wait on each other: the suite slows down severalfold.
    OMP_NUM_THREADS also reaches the subprocesses that tests start.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers <= 1:
        return
    threads = max(1, (os.cpu_count() or 1) // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)


_cuda_available: bool | None = None


def cuda_available() -> bool:
    global _cuda_available
    if _cuda_available is None:
        import torch

        _cuda_available = bool(torch.cuda.is_available())
    return _cuda_available


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is None or cuda_available():
        return
    if item.config.getoption("--require-gpu"):
        pytest.fail(
            "GPU-REQ test and --require-gpu was given, but CUDA is not available", pytrace=False
        )
    pytest.skip(GPU_SKIP_REASON)
