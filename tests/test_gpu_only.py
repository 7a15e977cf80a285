"""Checks that only make sense on a GPU: sizes past 2**31 elements."""

import pytest
import torch
import torch.nn.functional as F
from reference import assert_close

pytestmark = [pytest.mark.gpu, pytest.mark.big_memory]


def test_gelu_past_2_to_the_31_elements():
    """int64 offsets: with int32 ones the programs past 2**31 would write out of bounds."""
    n = (1 << 31) + 4099
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.ops.tk.gelu(x, "tanh")
    for start in [0, (1 << 31) - 2048, n - (1 << 20)]:  # before, across and after the 2**31 boundary
        window = slice(start, start + (1 << 20))
        assert_close(y[window], F.gelu(x[window].double(), approximate="tanh"), torch.bfloat16)
    del y
    dx = torch.ops.tk.gelu_backward(torch.ones_like(x), x, "none")
    tail = slice(n - 4096, n)
    x64 = x[tail].double().requires_grad_()
    F.gelu(x64).sum().backward()
    assert_close(dx[tail], x64.grad, torch.bfloat16)


def test_softmax_past_2_to_the_31_elements():
    rows, cols = 2049, 1 << 20  # 2**31 + 2**20 elements, the last rows past the boundary
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    y = torch.ops.tk.softmax(x, -1)
    for r in [0, rows - 1]:
        assert_close(y[r], torch.softmax(x[r].double(), -1), torch.bfloat16)
