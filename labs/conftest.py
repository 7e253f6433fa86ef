"""What every lab's tests share: mini_vllm runs its reading path.

A lab is about the code a student writes, plain torch, which is the reference's
`forward_native` (and the engine around it). So every lab test runs with mini_vllm's own
kernels off (`custom_ops="none"`, mini_vllm/_custom_ops.py): with `--impl=ref` the tests
exercise the reference's plain code, as they would exercise the student's, and the model
or engine a test builds around the student's code is the same plain code.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def reading_path_only():
    from mini_vllm import _custom_ops as ops

    with ops.custom_ops_context("none"):
        yield
