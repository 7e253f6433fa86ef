"""The `mini_vllm::linear` op on CPU: it is F.linear there, and its fake gives compilers the shape.

(The Triton GEMV behind its one-row case is CUDA-only: tests/gpu/test_triton_gemv.py, GPU-REQ.)
"""

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import mini_vllm.kernels  # noqa: F401  (registers the op)


def test_linear_op_is_f_linear_where_there_is_no_gemv():
    w = torch.randn(7, 5)
    for rows in (1, 3):
        x = torch.randn(rows, 5)
        torch.testing.assert_close(torch.ops.mini_vllm.linear(x, w), F.linear(x, w), rtol=0, atol=0)


def test_linear_op_fake_gives_the_output_shape():
    with FakeTensorMode():
        out = torch.ops.mini_vllm.linear(torch.empty(4, 576), torch.empty(960, 576))
    assert tuple(out.shape) == (4, 960)


def test_linear_op_compiles_whole_on_cpu():
    w = torch.randn(6, 8)

    def f(x):
        return torch.ops.mini_vllm.linear(x, w).relu()

    explanation = torch._dynamo.explain(f)(torch.randn(2, 8))
    assert explanation.graph_break_count == 0
