"""matmul against a float64 reference: both kernels, split K, batches, strides, empties, gradients.

Each test runs on the CPU (the Triton kernels through the interpreter, small
sizes) and on CUDA (compiled kernels, realistic sizes; marked `gpu`).
"""

import re
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from reference import DEVICES, DTYPES, TOLERANCE, assert_close, leaf64, pytorch_gelu, rel_error, strided_versions

from ops import gelu as gelu_ops  # the modules, for their design constants
from ops.matmul import op as matmul_ops
from ops.softmax import op as softmax_ops
from ops.blocks.alignment import column_multiple
from ops.blocks import held_rows as cooperative
from ops.blocks.held_rows import UNPUBLISHED, unpublished_words, words_block


def pick(device, cpu, cuda):
    return cuda if device == "cuda" else cpu


# --------------------------------------------------------------------- matmul

MATMUL_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def matmul_reference(a, b):
    return a.double() @ b.double()  # on the device: cuBLAS float64 is fast there


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", MATMUL_DTYPES)
def test_matmul_matches_float64(device, dtype):
    if device == "cuda" and dtype == torch.float64:
        with pytest.raises(TypeError, match="float64 is supported on CPU tensors only"):
            torch.ops.tk.matmul(torch.ones(2, 2, device=device, dtype=dtype), torch.ones(2, 2, device=device, dtype=dtype))
        return
    shapes = pick(device, [(1, 1, 1), (37, 70, 129), (65, 130, 17)], [(1, 1, 1), (1000, 1001, 999), (16, 4096, 4096)])
    if device == "cuda" and dtype in (torch.float16, torch.bfloat16):
        shapes += [(4096, 4096, 4096), (3000, 200, 5000)]  # each new shape costs an autotuning sweep
    for M, N, K in shapes:
        a = torch.randn(M, K, device=device, dtype=dtype)
        b = torch.randn(K, N, device=device, dtype=dtype)
        assert_close(torch.ops.tk.matmul(a, b), matmul_reference(a, b), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_matmul_of_transposed_and_strided_inputs(device, dtype):
    M, N, K = pick(device, (70, 45, 33), (1500, 1300, 1100))
    a = torch.randn(K, M, device=device, dtype=dtype).t()  # column-major
    b = torch.randn(N, 2 * K, device=device, dtype=dtype)[:, ::2].t()  # every other column, transposed
    assert not a.is_contiguous() and not b.is_contiguous()
    assert_close(torch.ops.tk.matmul(a, b), matmul_reference(a, b), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_batched_and_broadcast(device):
    B, M, N, K = pick(device, (3, 33, 20, 17), (8, 1000, 513, 768))
    dtype = torch.bfloat16
    a3 = torch.randn(B, M, K, device=device, dtype=dtype)
    b3 = torch.randn(B, K, N, device=device, dtype=dtype)
    a2, b2 = a3[0], b3[0]
    for a, b in [(a3, b3), (a3, b2), (a2, b3), (a3.transpose(1, 2).contiguous().transpose(1, 2), b3)]:
        c = torch.ops.tk.matmul(a, b)
        assert c.shape == (B, M, N)
        assert_close(c, matmul_reference(a, b), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_float32_follows_the_tf32_switch(device):
    a = torch.randn(256, 256, device=device)
    b = torch.randn(256, 256, device=device)
    exact = rel_error(torch.ops.tk.matmul(a, b), matmul_reference(a, b))
    assert exact < 1e-6  # IEEE float32 by default, like torch.matmul
    if device == "cuda":
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            tf32 = rel_error(torch.ops.tk.matmul(a, b), matmul_reference(a, b))
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
        assert 1e-5 < tf32 < 1e-2, tf32  # TF32's 10-bit mantissa shows


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_of_empty(device):
    assert torch.ops.tk.matmul(torch.randn(0, 4, device=device), torch.randn(4, 5, device=device)).shape == (0, 5)
    assert torch.ops.tk.matmul(torch.randn(3, 4, device=device), torch.randn(4, 0, device=device)).shape == (3, 0)
    zeros = torch.ops.tk.matmul(torch.randn(3, 0, device=device), torch.randn(0, 5, device=device))
    assert torch.equal(zeros, torch.zeros(3, 5, device=device))  # K == 0: a sum of nothing


def test_matmul_split_k_rule(monkeypatch):
    monkeypatch.setattr(matmul_ops, "sm_count", lambda index: 132)  # an H100
    cuda = torch.device("cuda", 0)
    assert matmul_ops._SPLIT_TILE["cuda"] == (64, 128) and matmul_ops._MIN_SPLIT_K["cuda"] == 512  # the numbers below
    assert matmul_ops._split_k(16, 4096, 4096, 1, cuda) == 4  # decoding: 32 tiles, 4 slices of 1024
    assert matmul_ops._split_k(512, 512, 8192, 1, cuda) == 4  # a weight gradient over 8192 tokens
    assert matmul_ops._split_k(1, 1, 1 << 20, 1, cuda) == 16  # at most 16 slices
    assert matmul_ops._split_k(16, 4096, 700, 1, cuda) == 1  # slices would be shorter than 512
    assert matmul_ops._split_k(1024, 1024, 1024, 1, cuda) == 1  # 128 tiles: the SMs are busy
    assert matmul_ops._split_k(16, 4096, 4096, 8, cuda) == 1  # a batch fills them too
    for M, N, K, batch in [(1, 1, 4096, 1), (64, 128, 10**6, 1), (100, 300, 5000, 3), (16, 8192, 8192, 2)]:
        split = matmul_ops._split_k(M, N, K, batch, cuda)
        tiles = -(-M // 64) * -(-N // 128) * batch
        assert split == 1 or (split * tiles <= 132 and K // split >= 512), (M, N, K, batch, split)
    assert matmul_ops._split_k(16, 64, 1000, 1, torch.device("cpu")) == 8  # the interpreter's scaled-down rule


@pytest.fixture
def slices_summed(monkeypatch):
    """The split count of every matmul whose K was split."""
    splits = []
    sum_slices = matmul_ops._sum_slices

    def spy(partial, c, split):
        splits.append(split)
        return sum_slices(partial, c, split)

    monkeypatch.setattr(matmul_ops, "_sum_slices", spy)
    return splits


@pytest.mark.parametrize("dtype", MATMUL_DTYPES)
def test_matmul_with_k_split_matches_float64(slices_summed, monkeypatch, dtype):
    """K split into slices whose float32 partial sums a second kernel adds (float64
    for float64): by the interpreter's own rule, then forced to more slices than
    K has steps, so that the last slices are empty."""
    a = torch.randn(2, 20, 1000, dtype=dtype)
    b = torch.randn(1000, 70, dtype=dtype)
    assert_close(torch.ops.tk.matmul(a[0], b), matmul_reference(a[0], b), dtype)  # 2 tiles of 64x64
    a_t = a[:, :, :200].transpose(1, 2).contiguous().transpose(1, 2)  # batched, column-major, N = 50: 2 tiles
    assert_close(torch.ops.tk.matmul(a_t, b[:200, :50]), matmul_reference(a_t, b[:200, :50]), dtype)
    assert slices_summed == [4, 3], slices_summed  # 8 "SMs" // 2 tiles = 4; then 200 // 64 = 3 slices of K
    monkeypatch.setattr(matmul_ops, "_split_k", lambda *args: 5)
    a, b = a[:, :, :100], b[:100]  # 2 steps of 64: slices 2, 3 and 4 have nothing to add
    assert_close(torch.ops.tk.matmul(a, b), matmul_reference(a, b), dtype)
    assert slices_summed[-1] == 5


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_matmul_with_k_split_on_the_gpu(slices_summed, dtype):
    """The shapes the rule splits on an H100-class GPU: decoding, a weight
    gradient, a skinny odd one.  Right answer, and the same bits on every run."""
    for M, N, K in [(16, 4096, 4096), (512, 512, 8192), (7, 1000, 3001)]:
        a = torch.randn(M, K, device="cuda", dtype=dtype)
        b = torch.randn(K, N, device="cuda", dtype=dtype)
        c = torch.ops.tk.matmul(a, b)
        assert_close(c, matmul_reference(a, b), dtype)
        assert torch.equal(c, torch.ops.tk.matmul(a, b))
    assert len(slices_summed) == 6 and min(slices_summed) > 1, slices_summed


def _four_layouts(a, b):
    """(a, b) in each combination of row-major and column-major."""
    a_t, b_t = a.t().contiguous().t(), b.t().contiguous().t()
    return [(a, b), (a_t, b), (a, b_t), (a_t, b_t)]


@pytest.fixture
def tma_launches(monkeypatch):
    """The operand layouts of every matmul that took the TMA kernel."""
    launches = []
    launch = matmul_ops._launch_tma

    def spy(a, b, c, layout_a, layout_b):
        launches.append((layout_a[0], layout_b[0]))  # (a column-major?, b column-major?)
        return launch(a, b, c, layout_a, layout_b)

    monkeypatch.setattr(matmul_ops, "_launch_tma", spy)
    return launches


def test_matmul_tma_rule(monkeypatch):
    """Which operands a TMA descriptor can describe, and which problems go to the TMA kernel."""
    x = torch.randn(64, 96, dtype=torch.bfloat16)
    assert matmul_ops._tma_layout(x) == (False, 96)
    assert matmul_ops._tma_layout(x.t()) == (True, 96)
    assert matmul_ops._tma_layout(x[:, 8:]) == (False, 96)  # 16 bytes in: still aligned
    assert matmul_ops._tma_layout(x[:, 1:]) is None  # the base address is 2 bytes off
    assert matmul_ops._tma_layout(x[:, ::2]) is None  # no unit stride
    assert matmul_ops._tma_layout(x.flatten().as_strided((64, 96), (8, 1))) is None  # overlapping rows
    assert matmul_ops._tma_layout(x.flatten()[:96].expand(64, 96)) is None  # one row, repeated (stride 0)
    assert matmul_ops._tma_layout(torch.randn(64, 100, dtype=torch.float16)) is None  # rows 200 bytes apart
    assert matmul_ops._tma_layout(torch.randn(64, 100)) == (False, 100)  # 400 bytes apart

    def layouts(a, b, split=1):
        return matmul_ops._tma_layouts(a, b, a.shape[-2], b.shape[-1], split)

    a, b = torch.randn(136, 96, dtype=torch.bfloat16), torch.randn(96, 264, dtype=torch.bfloat16)
    assert layouts(a, b) is None  # the CPU has no TMA unit
    monkeypatch.setattr(matmul_ops, "tma_available", lambda device: True)
    assert layouts(a, b) == ((False, 96), (False, 264))  # 15 tiles of 64x64 for 8 "SMs"
    assert layouts(a.t().contiguous().t(), b.t().contiguous().t()) == ((True, 136), (True, 96))
    assert layouts(a[:130].t().contiguous().t(), b) is None  # its columns would be 260 bytes apart
    assert layouts(a, b, split=2) is None  # split K takes the pointer kernel
    assert layouts(a[:100], b[:, :100]) is None  # 4 tiles: too few to fill the "SMs"
    assert layouts(a, b[:, :260]) is None  # C's rows would be 520 bytes apart
    assert layouts(a.float(), b.float()) is None  # 16-bit operands only
    assert layouts(a[None], b) is None  # batches take the pointer kernel


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matmul_tma_kernel_matches_float64(tma_launches, monkeypatch, dtype):
    """The TMA kernel under the interpreter: each layout, edges that cut tiles in
    M, N and K, and more tiles than programs (the persistent loop's second round)."""
    monkeypatch.setattr(matmul_ops, "tma_available", lambda device: True)
    for M, N, K in [(136, 600, 72), (520, 136, 8)]:
        a = torch.randn(M, K, dtype=dtype)
        b = torch.randn(K, N, dtype=dtype)
        for a_, b_ in _four_layouts(a, b):
            assert_close(torch.ops.tk.matmul(a_, b_), matmul_reference(a_, b_), dtype)
    assert tma_launches == [(False, False), (True, False), (False, True), (True, True)] * 2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matmul_tma_kernel_on_the_gpu(tma_launches, dtype):
    """Hopper and newer: each layout through the TMA kernel, at sizes that cut
    every kind of tile; a misaligned view falls back to the pointer kernel."""
    M, N, K = 2312, 2120, 1000  # multiples of 8 (16-byte strides either way), of no tile size
    a = torch.randn(M, K + 8, device="cuda", dtype=dtype)
    b = torch.randn(K, N, device="cuda", dtype=dtype)
    for a_, b_ in _four_layouts(a[:, :K], b):
        assert_close(torch.ops.tk.matmul(a_, b_), matmul_reference(a_, b_), dtype)
    assert_close(torch.ops.tk.matmul(a[:, 1 : K + 1], b), matmul_reference(a[:, 1 : K + 1], b), dtype)
    compiled = torch.compile(lambda a, b: torch.ops.tk.matmul(a, b), fullgraph=True)  # Inductor launches it
    a_t = a[:, :K].t().contiguous().t()
    assert_close(compiled(a_t, b), matmul_reference(a_t, b), dtype)
    if torch.cuda.get_device_capability()[0] >= 9:
        assert tma_launches[:4] == [(False, False), (True, False), (False, True), (True, True)], tma_launches
        assert tma_launches[4:] and set(tma_launches[4:]) == {(True, False)}  # traced (once or more) for Inductor
    else:
        assert tma_launches == []


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shapes", [((37, 20), (20, 45)), ((3, 17, 20), (3, 20, 9)), ((3, 17, 20), (20, 9)), ((17, 20), (3, 20, 9))])
def test_matmul_backward_matches_pytorch(device, shapes):
    dtype = torch.float32
    a = torch.randn(shapes[0], device=device, dtype=dtype, requires_grad=True)
    b = torch.randn(shapes[1], device=device, dtype=dtype, requires_grad=True)
    out = torch.ops.tk.matmul(a, b)
    grad = torch.randn_like(out)
    out.backward(grad)
    a64, b64 = leaf64(a), leaf64(b)
    torch.matmul(a64, b64).backward(grad.double())
    assert_close(a.grad, a64.grad, dtype)
    assert_close(b.grad, b64.grad, dtype)


def test_matmul_gradcheck():
    for sa, sb in [((7, 5), (5, 6)), ((2, 7, 5), (5, 6)), ((7, 5), (2, 5, 6))]:
        a = torch.randn(sa, dtype=torch.float64, requires_grad=True)
        b = torch.randn(sb, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(torch.ops.tk.matmul, (a, b), fast_mode=True)
