"""matmul against a float64 reference: both kernels, split K, batches, strides, empties, gradients; its plans.

Each test runs on the CPU (the Triton kernels through the interpreter, small
sizes) and on CUDA (compiled kernels, realistic sizes; marked `gpu`).  The
plan tests plan for an H100 on any machine, from meta tensors (shapes and
strides, no data).
"""

from dataclasses import replace

import pytest
import torch
import triton
import triton.language as tl
from reference import DEVICES, assert_close, leaf64, rel_error

from ops.matmul import launch as matmul_launch
from ops.matmul import plan as matmul_plan
from ops.matmul.kernels import (
    CONFIGS,
    TMA_CONFIGS,
    _grouped_tile,
    copy_rows_kernel,
    matmul_kernel,
    matmul_kernel_autotuned,
    matmul_tma_kernel,
    matmul_tma_kernel_autotuned,
    matmul_kernel_accumulating,
    matmul_tma_kernel_accumulating,
    split_k_sum_kernel,
)
from ops.matmul.op import backward, forward, product_into
from ops.matmul.plan import (
    POINTER,
    TMA,
    TUNING,
    Layout,
    Tile,
    Tuning,
    choose_plan,
    describe,
    pointer_plan,
    split_k,
    tma_layout,
)
from ops.matmul.spec import ROW_MAJOR, with_config
from ops.runtime import H100, INTERPRETER, ByKind, DeviceFacts, launcher, tma_available
from ops.spec import SPECS


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


def on(facts, a, b):
    """The Meta of a @ b as a call on a device with `facts` sees it (a and b: meta tensors)."""
    return replace(describe(a, b), facts=facts, tma_descriptors=facts.hopper)


def meta_tensors(M, N, K, batch=None, dtype=torch.bfloat16):
    """a (M x K, or batch x M x K) and b (K x N) on the meta device: shapes and strides, no memory."""
    a = torch.empty((M, K) if batch is None else (batch, M, K), device="meta", dtype=dtype)
    return a, torch.empty(K, N, device="meta", dtype=dtype)


def test_the_pointer_plan_tells_the_kernel_what_sizes_and_strides_are_multiples_of():
    """Multiples: the largest power of two up to 16 dividing each, 1 for a unit stride (plan.py)."""
    a, b = meta_tensors(1000, 1000, 1000)
    multiples = pointer_plan(on(H100, a, b), split=1).multiples
    assert (multiples.m, multiples.n, multiples.k) == (8, 8, 8)
    assert multiples.a == (16, 8, 1) and multiples.b == (16, 8, 1) and multiples.c == (16, 8, 1)  # 2-D: batch stride 0
    assert multiples.c_slice == 16  # no workspace
    a, b = meta_tensors(130, 66, 100, batch=3)
    multiples = pointer_plan(on(H100, a, b.t().contiguous().t()), split=2).multiples  # b column-major
    assert (multiples.m, multiples.n, multiples.k) == (2, 2, 4)
    assert multiples.a == (8, 4, 1) and multiples.b == (16, 1, 4)  # a's batch stride 130 * 100; b 2-D, its rows 1 apart
    assert multiples.c == (4, 2, 1) and multiples.c_slice == 4  # C's batch stride 130 * 66, a slice 3 of them apart
    assert multiples.constexprs()["BR_MULTIPLE"] == 1 and multiples.constexprs()["BC_MULTIPLE"] == 4


def test_matmul_split_k_rule():
    def split_on_h100(M, N, K, batch=None):
        return split_k(on(H100, *meta_tensors(M, N, K, batch)))

    assert TUNING.split_tile == (64, 128) and TUNING.min_split_k == 512 and H100.sm_count == 132  # the numbers below
    assert split_on_h100(16, 4096, 4096) == 4  # decoding: 32 tiles, 4 slices of 1024
    assert split_on_h100(512, 512, 8192) == 4  # a weight gradient over 8192 tokens
    assert split_on_h100(1, 1, 1 << 20) == 16  # at most 16 slices
    assert split_on_h100(16, 4096, 700) == 1  # slices would be shorter than 512
    assert split_on_h100(1024, 1024, 1024) == 1  # 128 tiles: the SMs are busy
    assert split_on_h100(16, 4096, 4096, batch=8) == 1  # a batch fills them too
    for M, N, K, batch in [(1, 1, 4096, None), (64, 128, 10**6, None), (100, 300, 5000, 3), (16, 8192, 8192, 2)]:
        split = split_on_h100(M, N, K, batch)
        tiles = -(-M // 64) * -(-N // 128) * (batch or 1)
        assert split == 1 or (split * tiles <= 132 and K // split >= 512), (M, N, K, batch, split)
    assert split_k(describe(*meta_tensors(16, 64, 1000))) == 8  # the interpreter's scaled-down rule


def test_matmul_plans_for_an_h100():
    """The plan table of docs/ops/matmul.md: which problems take which design on an H100."""

    def plan(M, N, K, batch=None, dtype=torch.bfloat16, facts=H100, **operand_a):
        meta = on(facts, *meta_tensors(M, N, K, batch, dtype))
        return choose_plan(replace(meta, a=replace(meta.a, **operand_a)))

    decoding = plan(16, 4096, 4096)
    assert (decoding.design, decoding.split, decoding.tile) == (POINTER, 4, None)  # split K, the autotuner's tile
    assert (decoding.accumulator, decoding.sum_block, decoding.sum_warps) == (torch.float32, 256, 8)
    assert (plan(1024, 1024, 1024).design, plan(1024, 1024, 1024).split) == (POINTER, 1)  # 64 TMA tiles: too few
    large = plan(2048, 2048, 2048)  # 256 tiles of 128 x 128 for 132 SMs
    assert (large.design, large.programs) == (TMA, 132)
    assert (large.a_layout, large.b_layout) == (Layout(False, 2048), Layout(False, 2048))
    assert (large.tile, large.upcast_operands) == (None, False)  # the autotuner's configs
    assert plan(2048, 2048, 2048, dtype=torch.float16).design == TMA
    assert not large.c_pointers  # C's rows 4096 bytes apart: stored by the TMA unit
    assert large.c_row_stride == 2048  # contiguous
    # GPT-2's LM head, b = W.t(): both operands describable; C's rows of 50257 (100514 bytes, 2-byte aligned) are
    # padded to 50264 (Tuning.pad_c_rows), so the TMA unit stores them too.
    tokens, weight = (torch.empty(n, 768, device="meta", dtype=torch.bfloat16) for n in (8191, 50257))
    head = choose_plan(on(H100, tokens, weight.t()))
    assert (head.design, head.c_pointers, head.c_row_stride, head.b_layout) == (TMA, False, 50264, Layout(True, 768))
    assert not (head.copy_a or head.copy_b)
    unpadded = choose_plan(on(H100, tokens, weight.t()), Tuning(pad_c_rows=ByKind(cuda=False, cpu=False)))
    assert (unpadded.c_pointers, unpadded.c_row_stride) == (True, 50257)  # contiguous: through pointers
    given = choose_plan(replace(on(H100, tokens, weight.t()), c_new=False))  # a caller's `out` keeps its layout
    assert (given.c_pointers, given.c_row_stride) == (True, 50257)
    assert plan(1000, 4001, 768).c_row_stride == 4008  # the pointer kernel's new C is padded too
    assert plan(1000, 4001, 768, dtype=torch.float32).c_row_stride == 4004  # 16 bytes: 4 float32 elements
    assert plan(16, 4001, 4096).split > 1 and plan(16, 4001, 4096).c_row_stride == 4001  # the slice sum: contiguous
    assert plan(64, 4001, 768, facts=INTERPRETER).c_row_stride == 4001  # off on the interpreter
    # The same head with b (K, N) contiguous: b's rows are 2-byte aligned too, so no descriptor reads it as it
    # is; 8191 rows of C pay for a copy of b with its rows padded to 50264 columns (Tuning.operand_copy_min).
    copied = choose_plan(on(H100, *meta_tensors(8191, 50257, 768)))
    assert (copied.design, copied.copy_a, copied.copy_b, copied.b_layout) == (TMA, False, True, Layout(False, 50264))
    assert choose_plan(on(H100, *meta_tensors(4095, 50257, 1024))).copy_b  # 4095 tokens pay for it too
    assert choose_plan(on(H100, *meta_tensors(1024, 50257, 768))).copy_b
    assert choose_plan(on(H100, *meta_tensors(1023, 50257, 768))).design == POINTER  # M too small to pay for it
    assert choose_plan(on(H100, *meta_tensors(8191, 50257, 768)), Tuning(operand_copy_min=1 << 30)).design == POINTER
    # B's rows an odd multiple of 16 bytes apart (N = 5000: 10000 bytes) are read from a copy 128 bytes apart
    # (Tuning.b_row_bytes) where M pays for it; a's rows so apart (K = 3000: 6000 bytes) are read as they are.
    odd = choose_plan(on(H100, *meta_tensors(4000, 5000, 3000)))
    assert (odd.design, odd.realign_b, odd.b_layout, odd.a_layout) == (TMA, True, Layout(False, 5056), Layout(False, 3000))
    assert odd.realign_tile == (1, 2048, 8)  # the elementwise rule's block, as rows of a block of columns
    x, w = (torch.empty(n, 3000, device="meta", dtype=torch.bfloat16) for n in (4000, 5000))
    linear = choose_plan(on(H100, x, w.t()))
    assert (linear.realign_b, linear.b_layout) == (True, Layout(True, 3008))  # W (5000, 3000): columns of 6000 bytes
    assert not choose_plan(on(H100, *meta_tensors(2048, 5000, 3000))).realign_b  # M too small to pay for the copy
    assert not choose_plan(on(H100, *meta_tensors(4096, 5120, 3000))).realign_b  # 10240 bytes: left as they are
    assert plan(4096, 4096, 4096, dtype=torch.float32).design == POINTER  # 16-bit operands only
    assert plan(4096, 4096, 4096, batch=4).design == POINTER  # batches take the pointer kernel
    outside = plan(4096, 4096, 4096, address_aligned=False)  # storage from outside PyTorch: a is copied
    assert (outside.design, outside.copy_a, outside.a_layout) == (TMA, True, Layout(False, 4096))
    assert plan(2048, 2048, 2048, address_aligned=False).copy_a  # N = 2048 pays for the copy too
    assert plan(4096, 1000, 4096, address_aligned=False).design == POINTER  # N = 1000: the copy would not pay
    assert plan(4096, 1000, 4096, storage_offset=1).design == POINTER  # a view 2 bytes in, N too small to copy
    assert plan(2048, 2048, 2048, storage_offset=1).copy_a  # the same view, copied where N pays for it
    a100 = DeviceFacts("cuda", sm_count=108, capability=(8, 0))
    assert plan(4096, 4096, 4096, facts=a100).design == POINTER  # no TMA unit before Hopper
    float32 = on(H100, *meta_tensors(256, 256, 256, dtype=torch.float32))
    assert choose_plan(replace(float32, tf32_allowed=True)).allow_tf32  # the switch, read by describe
    assert not choose_plan(replace(float32, tf32_allowed=False)).allow_tf32


@pytest.fixture
def launches(monkeypatch):
    """(kernel, constexpr arguments) of every launch matmul makes, in order."""
    seen, launcher = [], matmul_launch.launcher

    class Recording:
        def __init__(self, kernel, launch):
            self.kernel, self.launch = kernel, launch

        def __getitem__(self, grid):
            def launch(*args, **constexprs):
                seen.append((self.kernel, constexprs))
                return self.launch[grid](*args, **constexprs)

            return launch

    monkeypatch.setattr(matmul_launch, "launcher", lambda kernel, like: Recording(kernel, launcher(kernel, like)))
    return seen


def slices_summed(launches):
    """The split count of every matmul whose K was split."""
    return [constexprs["SPLIT_K"] for kernel, constexprs in launches if kernel is split_k_sum_kernel]


def tma_launches(launches):
    """The operand layouts of every matmul that took the TMA kernel: (a column-major?, b column-major?)."""
    tma_kernels = (matmul_tma_kernel, matmul_tma_kernel_autotuned)
    return [(flags["A_COLUMN_MAJOR"], flags["B_COLUMN_MAJOR"]) for kernel, flags in launches if kernel in tma_kernels]


@pytest.mark.parametrize("dtype", MATMUL_DTYPES)
def test_matmul_with_k_split_matches_float64(launches, dtype):
    """K split into slices whose float32 partial sums a second kernel adds (float64
    for float64): by the interpreter's own rule, then forced to more slices than
    K has steps, so that the last slices are empty."""
    a = torch.randn(2, 20, 1000, dtype=dtype)
    b = torch.randn(1000, 70, dtype=dtype)
    assert_close(torch.ops.tk.matmul(a[0], b), matmul_reference(a[0], b), dtype)  # 2 tiles of 64x64
    a_t = a[:, :, :200].transpose(1, 2).contiguous().transpose(1, 2)  # batched, column-major, N = 50: 2 tiles
    assert_close(torch.ops.tk.matmul(a_t, b[:200, :50]), matmul_reference(a_t, b[:200, :50]), dtype)
    assert slices_summed(launches) == [4, 3], launches  # 8 "SMs" // 2 tiles = 4; then 200 // 64 = 3 slices of K
    a, b = a[:, :, :100], b[:100]  # 2 steps of 64: slices 2, 3 and 4 have nothing to add
    assert_close(matmul_launch.run(pointer_plan(describe(a, b), split=5), a, b), matmul_reference(a, b), dtype)
    assert slices_summed(launches)[-1] == 5


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_matmul_with_k_split_on_the_gpu(launches, dtype):
    """The shapes the rule splits on an H100-class GPU: decoding, a weight
    gradient, a skinny odd one.  Right answer, and the same bits on every run."""
    for M, N, K in [(16, 4096, 4096), (512, 512, 8192), (7, 1000, 3001)]:
        a = torch.randn(M, K, device="cuda", dtype=dtype)
        b = torch.randn(K, N, device="cuda", dtype=dtype)
        c = torch.ops.tk.matmul(a, b)
        assert_close(c, matmul_reference(a, b), dtype)
        assert torch.equal(c, torch.ops.tk.matmul(a, b))
    splits = slices_summed(launches)
    assert len(splits) == 6 and min(splits) > 1, splits


def _four_layouts(a, b):
    """(a, b) in each combination of row-major and column-major."""
    a_t, b_t = a.t().contiguous().t(), b.t().contiguous().t()
    return [(a, b), (a_t, b), (a, b_t), (a_t, b_t)]


# Operands read as they are described: no realigned copy of b (Tuning.b_row_bytes).
AS_DESCRIBED = Tuning(interpreter_realign_min=1 << 62, realign_min=1 << 62)


def with_tma(a, b):
    """The Meta of a @ b on the interpreter, as if it had TMA descriptors: its scaled-down TMA rule applies."""
    return replace(describe(a, b), tma_descriptors=True)


def test_matmul_tma_rule():
    """Which operands a TMA descriptor can describe, and which problems go to the TMA kernel."""

    def layout(t):
        return tma_layout(describe(t, t).a, t.element_size())

    x = torch.randn(64, 96, dtype=torch.bfloat16)
    assert layout(x) == Layout(False, 96)
    assert layout(x.t()) == Layout(True, 96)
    assert layout(x[:, 8:]) == Layout(False, 96)  # 16 bytes in: still aligned
    assert layout(x[:, 1:]) is None  # the base address is 2 bytes off
    assert layout(x[:, ::2]) is None  # no unit stride
    assert layout(x.flatten().as_strided((64, 96), (8, 1))) is None  # overlapping rows
    assert layout(x.flatten()[:96].expand(64, 96)) is None  # one row, repeated (stride 0)
    assert layout(torch.randn(64, 100, dtype=torch.float16)) is None  # rows 200 bytes apart
    assert layout(torch.randn(64, 100)) == Layout(False, 100)  # 400 bytes apart

    def layouts(meta):  # as described: no realigned copy of b (Tuning.b_row_bytes; its own test below)
        plan = choose_plan(meta, AS_DESCRIBED)
        return (plan.a_layout, plan.b_layout) if plan.design == TMA else None

    a, b = torch.randn(136, 96, dtype=torch.bfloat16), torch.randn(96, 264, dtype=torch.bfloat16)
    assert layouts(describe(a, b)) is None  # the CPU has no TMA unit
    assert layouts(with_tma(a, b)) == (Layout(False, 96), Layout(False, 264))  # 15 tiles of 64x64 for 8 "SMs"
    assert layouts(with_tma(a.t().contiguous().t(), b.t().contiguous().t())) == (Layout(True, 136), Layout(True, 96))
    no_copies = Tuning(interpreter_operand_copy_min=1 << 30)
    odd = a[:130].t().contiguous().t()  # its columns would be 260 bytes apart: no descriptor reads it as it is
    assert choose_plan(with_tma(odd, b), no_copies).design != TMA
    copied = choose_plan(with_tma(odd, b))  # N = 264 pays for a copy in the interpreter's scaled-down rule
    assert (copied.a_layout, copied.copy_a, copied.copy_b) == (Layout(False, 96), True, False)
    assert layouts(with_tma(a[:100], b[:, :100])) is None  # 4 tiles: too few to fill the "SMs"
    assert layouts(with_tma(a, b[:, :260])) == (Layout(False, 96), Layout(False, 264))  # b's rows still 528 bytes apart
    assert choose_plan(with_tma(a, b[:, :260])).c_pointers  # C's 520: stored through pointers
    assert not choose_plan(with_tma(a, b)).c_pointers
    assert choose_plan(with_tma(a, b), Tuning(c_store_alignment=128)).c_pointers  # 528-byte rows: not 128-aligned
    assert not choose_plan(with_tma(a, b[:, :256]), Tuning(c_store_alignment=128)).c_pointers  # 512-byte rows
    assert layouts(with_tma(a.float(), b.float())) is None  # 16-bit operands only
    assert layouts(with_tma(a[None], b)) is None  # batches take the pointer kernel
    # Split K takes the pointer kernel: with TMA tiles counted at 16 x 16, 256 x 256 would take the TMA
    # kernel on an H100, unless its K is split (8 tiles of 64 x 128: 16 slices).
    meta = on(H100, *meta_tensors(256, 256, 1 << 16))
    assert choose_plan(meta, Tuning(tma_min_tile=16, max_split=1)).design == TMA
    split = choose_plan(meta, Tuning(tma_min_tile=16))
    assert (split.design, split.split) == (POINTER, 16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matmul_tma_kernel_matches_float64(launches, dtype):
    """The TMA kernel under the interpreter: each layout, edges that cut tiles in
    M, N and K, and more tiles than programs (the persistent loop's second round)."""
    for M, N, K in [(136, 600, 72), (520, 136, 8)]:
        a = torch.randn(M, K, dtype=dtype)
        b = torch.randn(K, N, dtype=dtype)
        for a_, b_ in _four_layouts(a, b):
            plan = choose_plan(with_tma(a_, b_))
            assert plan.design == TMA and plan.programs == 8, plan
            assert_close(matmul_launch.run(plan, a_, b_), matmul_reference(a_, b_), dtype)
    assert tma_launches(launches) == [(False, False), (True, False), (False, True), (True, True)] * 2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matmul_tma_kernel_stores_c_through_pointers_where_its_rows_are_misaligned(launches, dtype):
    """An LM head's shape, scaled down: b = W.t() with N odd (C's rows 2-byte aligned), M and N cutting tiles,
    more tiles than programs; and b a view of a wider matrix, N a multiple of 4 (rows 8-byte aligned)."""
    for M, N, K, wide in [(203, 517, 72, 517), (136, 260, 96, 264)]:
        a = torch.randn(M, K, dtype=dtype)
        b = torch.randn(wide, K, dtype=dtype).t()[:, :N] if wide == N else torch.randn(K, wide, dtype=dtype)[:, :N]
        plan = choose_plan(with_tma(a, b))
        assert plan.design == TMA and plan.c_pointers, plan
        c = matmul_launch.run(plan, a, b)
        assert c.is_contiguous()
        assert_close(c, matmul_reference(a, b), dtype)
    assert [flags["C_POINTERS"] for kernel, flags in launches if "C_POINTERS" in flags] == [True, True]


# Tuning.pad_c_rows as the GPU's, on the interpreter.
PADDED_C = Tuning(pad_c_rows=ByKind(cuda=True, cpu=True))


def _assert_padded(c, shape, row_stride):
    """c has `shape`, rows `row_stride` apart, and is no view of a wider tensor: its storage ends at its last
    element (what torch.empty_strided allocates)."""
    assert tuple(c.shape) == shape and c.stride()[-2:] == (row_stride, 1) and not c._is_view()
    last = sum((n - 1) * stride for n, stride in zip(c.shape, c.stride()))
    assert c.untyped_storage().nbytes() == (last + 1) * c.element_size()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_a_new_c_with_rows_off_16_byte_runs_is_padded(launches, dtype):
    """Tuning.pad_c_rows: a new C whose rows are not whole 16-byte runs gets rows padded to 16 bytes, written by
    the TMA kernel through its descriptor (an LM head scaled down: b = W.t(), N odd) and by the pointer kernel
    (2-D, batched, and with K split, where C stays contiguous), each against float64."""
    per_run = 16 // torch.empty((), dtype=dtype).element_size()
    padded_n = -(-517 // per_run) * per_run
    a, weight = torch.randn(203, 72, dtype=dtype), torch.randn(517, 72, dtype=dtype)
    if dtype != torch.float32:  # the TMA kernel takes 16-bit operands
        plan = choose_plan(with_tma(a, weight.t()), PADDED_C)
        assert plan.design == TMA and not plan.c_pointers and plan.c_row_stride == padded_n, plan
        c = matmul_launch.run(plan, a, weight.t())
        _assert_padded(c, (203, 517), padded_n)
        assert_close(c, matmul_reference(a, weight.t()), dtype)
        assert [flags["C_POINTERS"] for kernel, flags in launches if "C_POINTERS" in flags] == [False]
    for a_ in (a, torch.randn(3, 203, 72, dtype=dtype)):  # the pointer kernel, 2-D and batched
        c = forward(a_, weight.t(), tuning=PADDED_C)
        _assert_padded(c, (*a_.shape[:-1], 517), padded_n)
        assert_close(c, matmul_reference(a_, weight.t()), dtype)
    padded_plan = choose_plan(describe(a, weight.t()), PADDED_C)  # made for a new C: refuses a contiguous out
    with pytest.raises(ValueError, match="cannot write a given out"):
        matmul_launch.run(padded_plan, a, weight.t(), out=torch.empty(203, 517, dtype=dtype))
    deep, narrow = torch.randn(5, 1000, dtype=dtype), torch.randn(1000, 61, dtype=dtype)
    split = choose_plan(describe(deep, narrow), PADDED_C)
    assert split.split > 1 and split.c_row_stride == 61  # K split: the slice sum walks C as one run
    c = forward(deep, narrow, tuning=PADDED_C)
    assert c.is_contiguous()
    assert_close(c, matmul_reference(deep, narrow), dtype)
    aligned = torch.randn(72, 8 * per_run, dtype=dtype)  # rows already whole runs: contiguous, not padded
    assert forward(a, aligned, tuning=PADDED_C).is_contiguous()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_tma_kernel_reads_aligned_copies_of_operands_no_descriptor_describes(launches, dtype):
    """b (K, N) row-major with N odd (an LM head's weight stored (H, V)), and a a view 2 bytes in: each copied
    into 16-byte aligned rows, read by the TMA kernel, C stored through pointers where N is odd."""
    for M, N, K, shift in [(203, 517, 72, 0), (136, 264, 96, 1)]:
        a = torch.randn(M, K + shift, dtype=dtype)[:, shift:]
        b = torch.randn(K, N, dtype=dtype)
        plan = choose_plan(with_tma(a, b))
        assert plan.design == TMA and (plan.copy_a, plan.copy_b) == (shift == 1, N % 8 != 0), plan
        assert_close(matmul_launch.run(plan, a, b), matmul_reference(a, b), dtype)
    assert [flags["C_POINTERS"] for kernel, flags in launches if "C_POINTERS" in flags] == [True, False]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_an_operand_copied_whole_comes_out_row_major(launches, monkeypatch, dtype):
    """A column-major a whose columns are 260 bytes apart, with K = 96 already a whole number of 16-byte runs:
    its copy needs no padding and must still be row-major, as the plan tells the kernel.  And the backward of
    x @ W with W stored (K, N), N odd: grad_x = grad @ W.t() reads W.t() (column-major, 1034 bytes apart) from
    such a copy."""
    a = torch.randn(96, 130, dtype=dtype).t()  # (130, 96), strides (1, 130)
    b = torch.randn(96, 264, dtype=dtype)
    plan = choose_plan(with_tma(a, b))
    assert plan.design == TMA and plan.copy_a and plan.a_layout == Layout(False, 96)
    copy = matmul_launch.aligned_copy(a, 96)
    assert copy.stride() == (96, 1) and torch.equal(copy, a)
    # With padding: the whole padded tensor, contiguous (a traced call's Inductor keeps a new tensor's layout,
    # not necessarily a view's), t's columns first and zeros after.
    padded = matmul_launch.aligned_copy(b[:, :259], 264)
    assert padded.shape == (96, 264) and padded.is_contiguous()
    assert torch.equal(padded[:, :259], b[:, :259]) and not padded[:, 259:].any()
    assert_close(matmul_launch.run(plan, a, b), matmul_reference(a, b), dtype)
    x, w, grad = torch.randn(264, 96, dtype=dtype), torch.randn(96, 517, dtype=dtype), torch.randn(264, 517, dtype=dtype)
    monkeypatch.setattr(matmul_plan, "tma_available", lambda device: True)  # plan as a GPU with TMA would
    grad_x, grad_w = backward(grad, x, w, True, True, tuning=Tuning(interpreter_operand_copy_min=1))
    assert any(kernel is matmul_tma_kernel and flags["B_COLUMN_MAJOR"] is False for kernel, flags in launches)
    assert_close(grad_x, matmul_reference(grad, w.t()), dtype)
    assert_close(grad_w, matmul_reference(x.t(), grad), dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_b_with_rows_an_odd_multiple_of_16_bytes_apart_is_read_from_a_realigned_copy(launches, dtype):
    """Tuning.b_row_bytes in the interpreter's scaled-down rule: b row-major with rows of 264 (528 bytes, 33 runs of
    16) and b = W.t() with columns of 72 (144 bytes, 9 runs) are copied by copy_rows_kernel, layout kept, into rows
    of 128 bytes (320 and 128 elements), and the TMA kernel reads the copies; against float64, edges cut."""
    a = torch.randn(136, 72, dtype=dtype)
    for b, layout in [(torch.randn(72, 264, dtype=dtype), Layout(False, 320)),
                      (torch.randn(264, 72, dtype=dtype).t(), Layout(True, 128))]:  # fmt: skip
        plan = choose_plan(with_tma(a, b))
        assert plan.design == TMA and plan.realign_b and not plan.copy_b and plan.b_layout == layout, plan
        copy = matmul_launch.realigned_copy(plan, b)  # the whole padded tensor, b in its first rows and columns
        assert torch.equal(copy[: b.shape[0], : b.shape[1]], b)
        assert copy.stride() == ((1, layout.leading_stride) if layout.column_major else (layout.leading_stride, 1))
        assert_close(matmul_launch.run(plan, a, b), matmul_reference(a, b), dtype)
        assert not choose_plan(with_tma(a, b), AS_DESCRIBED).realign_b
    copies = [kernel for kernel, flags in launches if kernel is copy_rows_kernel]
    assert len(copies) == 4  # two here, two in the runs
    assert not choose_plan(with_tma(a, torch.randn(72, 256, dtype=dtype))).realign_b  # 512-byte rows: left
    assert not choose_plan(with_tma(a[:60], torch.randn(72, 264, dtype=dtype))).realign_b  # M under the floor


# ------------------------------------------------- product_into: out = a @ b, out += a @ b


def _into_operands(M, N, K, dtype, device="cpu"):
    """a, b, and an out whose values are as large as the product's (K ** 0.5): a term left out shows."""
    a = torch.randn(M, K, dtype=dtype, device=device)
    b = torch.randn(K, N, dtype=dtype, device=device)
    return a, b, (torch.randn(M, N, device=device) * max(K, 1) ** 0.5).to(dtype)


def _copy(t):
    """A contiguous copy of t as many elements into its storage as t is (a clone would start aligned)."""
    start = t.storage_offset()
    copy = torch.empty(start + t.numel(), dtype=t.dtype, device=t.device)[start:].view(t.shape)
    return copy.copy_(t)


def _check_into(a, b, out, dtype):
    """product_into writes a @ b into a copy of out, then adds it to another, both against float64."""
    product = matmul_reference(a, b)
    written = _copy(out)
    assert product_into(written, a, b, accumulate=False) is written
    assert_close(written, product, dtype)
    added = _copy(out)
    assert product_into(added, a, b, accumulate=True) is added
    assert_close(added, out.double() + product, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_product_into_writes_or_adds_in_every_design(launches, monkeypatch, dtype):
    """out = a @ b and out += a @ b through each design, in the interpreter: the pointer kernel; K split,
    where the slice sum adds out; the TMA kernel (16-bit: planned as a GPU with TMA would), storing through
    its descriptor, and through pointers where out's rows or its start are not 16-byte aligned; K = 0."""
    monkeypatch.setattr(matmul_plan, "tma_available", lambda device: True)
    for M, N, K in [(100, 70, 40), (20, 70, 1000), (136, 600, 72), (136, 517, 72), (20, 70, 0)]:
        _check_into(*_into_operands(M, N, K, dtype), dtype)
    a, b, out = _into_operands(136, 600, 72, dtype)
    _check_into(a, b, torch.empty(out.numel() + 1, dtype=dtype)[1:].view(out.shape).copy_(out), dtype)  # 2 or 4 bytes in
    kernels = [(kernel, flags.get("ACCUMULATE"), flags.get("C_POINTERS")) for kernel, flags in launches]
    designs = {kernel for kernel, _, _ in kernels}
    assert (split_k_sum_kernel, True, None) in kernels  # the split's sum added out
    assert {flags["SPLIT_K"] for kernel, flags in launches if kernel is split_k_sum_kernel} == {4}  # 20x70x1000
    if dtype == torch.bfloat16:
        # descriptor store, pointer store (N = 517), pointer store (out 2 bytes in), each writing then adding
        tma = [(accumulate, pointers) for kernel, accumulate, pointers in kernels if kernel is matmul_tma_kernel]
        assert tma == [(False, False), (True, False), (False, True), (True, True), (False, True), (True, True)], tma
    else:
        assert matmul_tma_kernel not in designs  # 16-bit operands only


def test_product_into_rejects_what_it_cannot_write():
    a, b, out = _into_operands(8, 6, 4, torch.float32)
    for wrong in (out.t().contiguous().t(), torch.empty(8, 7)[:, :6], torch.empty(8, 5), torch.empty(6, 8)):
        with pytest.raises(ValueError, match="out must be a contiguous \\(8, 6\\) tensor"):
            product_into(wrong, a, b, accumulate=True)  # column-major, rows apart, contiguous of other shapes
    with pytest.raises(TypeError, match="a has dtype torch.float32 but out has dtype torch.float64"):
        product_into(out.double(), a, b, accumulate=True)
    with pytest.raises(ValueError, match="inner dimensions 4 and 5 differ"):
        product_into(out, a, torch.randn(5, 6), accumulate=True)
    with pytest.raises(ValueError, match="a must be 2-D"):  # batches: tk.matmul itself
        product_into(out, a[None], b, accumulate=True)
    square = torch.randn(6, 6)
    with pytest.raises(ValueError, match="out's memory overlaps a's"):
        product_into(square, square, torch.randn(6, 6), accumulate=True)
    with pytest.raises(ValueError, match="out's memory overlaps b's"):
        product_into(square, torch.randn(6, 6), square.t(), accumulate=True)
    stacked = torch.randn(3, 6, 6)  # three matrices of one buffer, apart: allowed
    expected = stacked[0].double() + stacked[1].double() @ stacked[2].double()
    product_into(stacked[0], stacked[1], stacked[2], accumulate=True)
    with pytest.raises(ValueError, match="overlaps a's"):
        product_into(stacked[0], stacked.view(-1, 6)[3:9], stacked[2], accumulate=True)  # half of a's rows are out's
    assert_close(stacked[0], expected, torch.float32)


def test_product_into_takes_fake_tensors():
    """Fake tensors (a tracer's) have no memory: no overlap is claimed, and nothing is launched."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a, b, out = torch.randn(8, 4), torch.randn(4, 6), torch.empty(8, 6)
        assert product_into(out, a, b, accumulate=True) is out


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_product_into_on_the_gpu(launches, dtype):
    """A weight gradient summed over chunks, as the fused loss sums it: out = a_1 @ b_1, then += a_i @ b_i,
    with a column-major (dlogits^T); the TMA kernel storing through its descriptor, then through pointers
    where N is odd and where out starts 2 bytes in; against float64 and against cuBLAS's addmm."""
    M, K = 2312, 1000
    for N, shift in [(2120, 0), (2117, 0), (2120, 1)]:
        out = torch.empty(M * N + shift, device="cuda", dtype=dtype)[shift:].view(M, N)
        total = torch.zeros(M, N, device="cuda", dtype=torch.float64)
        cublas = torch.empty(M, N, device="cuda", dtype=dtype)
        for chunk in range(3):
            a = torch.randn(K, M, device="cuda", dtype=dtype).t()  # column-major, as dlogits.t()
            b = torch.randn(N, K, device="cuda", dtype=dtype).t() if N % 8 else torch.randn(K, N, device="cuda", dtype=dtype)
            product_into(out, a, b, accumulate=chunk > 0)
            torch.addmm(cublas, a, b, beta=1 if chunk else 0, out=cublas)
            total += matmul_reference(a, b)
            assert_close(out, total, dtype)
        assert_close(out, cublas.double(), dtype)
    if torch.cuda.get_device_capability()[0] >= 9:  # each sum: written, then added twice (a tuner of its own)
        tuned = {matmul_tma_kernel_autotuned: "write", matmul_tma_kernel_accumulating: "add"}
        tma = [(tuned[k], f["ACCUMULATE"], f["C_POINTERS"]) for k, f in launches if k in tuned]
        sums = [[("write", False, pointers), ("add", True, pointers), ("add", True, pointers)] for pointers in (False, True, True)]
        assert tma == sums[0] + sums[1] + sums[2], tma


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matmul_tma_kernel_on_the_gpu(launches, dtype):
    """Hopper and newer: each layout through the TMA kernel, at sizes that cut
    every kind of tile; a misaligned view (2 bytes in) read from a row-major copy of it, N being large enough
    to pay for the copy (Tuning.operand_copy_min)."""
    M, N, K = 2312, 2120, 1000  # multiples of 8 (16-byte strides either way), of no tile size
    a = torch.randn(M, K + 8, device="cuda", dtype=dtype)
    b = torch.randn(K, N, device="cuda", dtype=dtype)
    for a_, b_ in _four_layouts(a[:, :K], b):
        assert_close(torch.ops.tk.matmul(a_, b_), matmul_reference(a_, b_), dtype)
    assert_close(torch.ops.tk.matmul(a[:, 1 : K + 1], b), matmul_reference(a[:, 1 : K + 1], b), dtype)
    compiled = torch.compile(lambda a, b: torch.ops.tk.matmul(a, b), fullgraph=True)  # Inductor launches it
    a_t = a[:, :K].t().contiguous().t()
    assert_close(compiled(a_t, b), matmul_reference(a_t, b), dtype)
    layouts = tma_launches(launches)
    if torch.cuda.get_device_capability()[0] >= 9:
        assert layouts[:5] == [(False, False), (True, False), (False, True), (True, True), (False, False)], layouts
        assert layouts[5:] and set(layouts[5:]) == {(True, False)}  # traced (once or more) for Inductor
    else:
        assert layouts == []


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_an_lm_head_with_an_odd_vocabulary_takes_the_tma_kernel_on_the_gpu(launches, dtype):
    """Hopper and newer: x @ W.t() with N odd reads both operands through descriptors and stores C, its rows
    padded to 16 bytes (Tuning.pad_c_rows), through a descriptor too, eager and compiled with the same strides;
    tiles cut in M and N.  The padded result takes an in-place op and a backward like any other."""
    if not tma_available(torch.device("cuda")):
        pytest.skip("needs a GPU with TMA (Hopper or newer)")
    x = torch.randn(2311, 768, device="cuda", dtype=dtype, requires_grad=True)
    weight = torch.randn(4001, 768, device="cuda", dtype=dtype, requires_grad=True)
    compiled = torch.compile(lambda x, w: torch.ops.tk.matmul(x, w.t()), fullgraph=True)
    for c in (torch.ops.tk.matmul(x, weight.t()), compiled(x, weight)):
        assert c.stride() == (4008, 1) and not c._is_view()
        assert_close(c, matmul_reference(x.detach(), weight.detach().t()), dtype)
    pointers = [flags["C_POINTERS"] for kernel, flags in launches if "C_POINTERS" in flags]
    assert pointers and not any(pointers), pointers
    grad = torch.randn(2311, 4001, device="cuda", dtype=dtype)
    c = torch.ops.tk.matmul(x, weight.t())
    c.mul_(2.0)  # in place on the padded result, under autograd
    c.backward(grad)
    x64, w64 = leaf64(x), leaf64(weight)
    (x64 @ w64.t() * 2.0).backward(grad.double())
    assert_close(x.grad, x64.grad, dtype)
    assert_close(weight.grad, w64.grad, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["row-major", "column-major"])
def test_b_with_rows_an_odd_multiple_of_16_bytes_apart_is_realigned_on_the_gpu(launches, layout):
    """Hopper and newer: 4000x5000x3000 with b (K, N) row-major (rows 10000 bytes apart) or b = W.t() (columns 6000
    bytes apart) reads b from a copy whose rows are 128 bytes apart (Tuning.b_row_bytes), eager and compiled."""
    if not tma_available(torch.device("cuda")):
        pytest.skip("needs a GPU with TMA (Hopper or newer)")
    x = torch.randn(4000, 3000, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(3000, 5000, device="cuda", dtype=torch.bfloat16)
    if layout == "column-major":
        b = torch.randn(5000, 3000, device="cuda", dtype=torch.bfloat16).t()
    assert choose_plan(describe(x, b)).realign_b
    compiled = torch.compile(lambda x, b: torch.ops.tk.matmul(x, b), fullgraph=True)
    for c in (torch.ops.tk.matmul(x, b), compiled(x, b)):
        assert_close(c, matmul_reference(x, b), torch.bfloat16)
    assert any(kernel is copy_rows_kernel for kernel, flags in launches)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_an_lm_head_stored_k_by_n_takes_the_tma_kernel_through_a_copy_on_the_gpu(launches, dtype):
    """Hopper and newer: x @ W with W stored (H, V), V odd: no descriptor reads W's rows (2-byte aligned), so
    with 4100 rows of C it is copied into aligned rows for the TMA kernel, eager and compiled.  Its backward's
    products have a side of 768, too small to pay for copies (Tuning.operand_copy_min): grad_x's grad, whose
    rows are as unaligned, would need one; the pointer kernel for both, checked here too."""
    if not tma_available(torch.device("cuda")):
        pytest.skip("needs a GPU with TMA (Hopper or newer)")
    x = torch.randn(4100, 768, device="cuda", dtype=dtype, requires_grad=True)
    weight = torch.randn(768, 4001, device="cuda", dtype=dtype, requires_grad=True)
    assert choose_plan(describe(x, weight)).copy_b
    compiled = torch.compile(lambda x, w: torch.ops.tk.matmul(x, w), fullgraph=True)
    for c in (torch.ops.tk.matmul(x, weight), compiled(x, weight)):
        assert c.stride() == (4008, 1)  # C's rows padded to 16 bytes (Tuning.pad_c_rows)
        assert_close(c, matmul_reference(x.detach(), weight.detach()), dtype)
    assert not any(flags.get("C_POINTERS") for kernel, flags in launches), launches
    grad = torch.randn(4100, 4001, device="cuda", dtype=dtype)
    assert choose_plan(describe(grad, weight.detach().t())).design == POINTER  # grad_x: N = 768, below the floor
    assert choose_plan(describe(x.detach().t(), grad)).design == POINTER  # grad_w: M = 768, below the floor
    grad_x, grad_w = torch.autograd.grad(torch.ops.tk.matmul(x, weight), (x, weight), grad)
    assert_close(grad_x, matmul_reference(grad, weight.detach().t()), dtype)
    assert_close(grad_w, matmul_reference(x.detach().t(), grad), dtype)


def test_matmul_entry_points_take_a_tuning(launches):
    """forward and backward with another tuning: here a smaller interpreter tile, which every launch takes."""
    small = Tuning(interpreter_tile=Tile(16, 32, 16))
    a, b = torch.randn(40, 50), torch.randn(50, 70)
    grad = torch.randn(40, 70)
    assert_close(forward(a, b, tuning=small), matmul_reference(a, b), torch.float32)
    grad_a, grad_b = backward(grad, a, b, True, True, tuning=small)
    assert_close(grad_a, matmul_reference(grad, b.t()), torch.float32)
    assert_close(grad_b, matmul_reference(a.t(), grad), torch.float32)
    tiles = {(flags["BLOCK_M"], flags["BLOCK_N"], flags["BLOCK_K"]) for kernel, flags in launches if kernel is matmul_kernel}
    assert len(launches) == 3 and tiles == {(16, 32, 16)}, launches


# ------------------------------------------------------------ program order


@triton.jit
def _tile_order_kernel(out_ptr, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """out[program] = the (pid_m, pid_n) of C's tile that program computes, by the kernels' own rule."""
    program = tl.program_id(0)
    pid_m, pid_n = _grouped_tile(program, num_pid_m, num_pid_n, GROUP_M)
    tl.store(out_ptr + 2 * program, pid_m)
    tl.store(out_ptr + 2 * program + 1, pid_n)


def tile_order(num_pid_m: int, num_pid_n: int, group_m: int) -> list[tuple[int, int]]:
    """The tiles of a num_pid_m x num_pid_n grid of tiles in the order programs 0, 1, ... take them."""
    out = torch.full((num_pid_m * num_pid_n, 2), -1, dtype=torch.int32)
    launcher(_tile_order_kernel, out)[(num_pid_m * num_pid_n,)](out, num_pid_m, num_pid_n, GROUP_M=group_m)
    return [tuple(tile) for tile in out.tolist()]


def test_grouped_and_row_major_program_orders():
    """5 x 3 tiles.  GROUP_M = 1 walks C row by row; GROUP_M = 2 walks down a column of two rows of tiles
    before moving right (the programs running together share B's tiles), the fifth row alone last."""
    assert tile_order(5, 3, 1) == [(m, n) for m in range(5) for n in range(3)]
    assert tile_order(5, 3, 2) == [
        (0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2),
        (2, 0), (3, 0), (2, 1), (3, 1), (2, 2), (3, 2),
        (4, 0), (4, 1), (4, 2),
    ]  # fmt: skip
    assert tile_order(5, 3, 8) == [(m, n) for n in range(3) for m in range(5)]  # one group: column by column


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_row_major_variant_matches_float64(launches, dtype):
    """The harness's tk-row-major variant: tk's kernel with GROUP_M = 1, on shapes that are no multiple of the
    interpreter's 64 x 64 x 64 tile (3 x 2 and 4 x 3 tiles, K cut), against float64; every launch of it takes
    row-major order, and tk's own call stays grouped."""
    row_major = SPECS["matmul"].tk_plans["tk-row-major"]
    for M, N, K in [(130, 66, 100), (200, 150, 37)]:
        a, b = torch.randn(M, K, dtype=dtype), torch.randn(K, N, dtype=dtype)
        assert_close(row_major(a, b), matmul_reference(a, b), dtype)
    assert_close(torch.ops.tk.matmul(a, b), matmul_reference(a, b), dtype)
    assert [flags["GROUP_M"] for kernel, flags in launches if kernel is matmul_kernel] == [1, 1, 8]
    # On an H100 the autotuned kernels take the order too (the plan's group_m is every launch's GROUP_M).
    for M, N, K in [(1024, 1024, 1024), (2048, 2048, 2048)]:
        plan = choose_plan(on(H100, *meta_tensors(M, N, K)), ROW_MAJOR)
        assert (plan.tile, plan.group_m, choose_plan(on(H100, *meta_tensors(M, N, K))).group_m) == (None, 1, 8)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_matmul_row_major_variant_on_the_gpu(launches, dtype):
    """Row-major order through the autotuned pointer kernel and (bfloat16, Hopper) the TMA kernel."""
    row_major = SPECS["matmul"].tk_plans["tk-row-major"]
    for M, N, K in [(1000, 1001, 999), (2312, 2120, 1000)]:
        a = torch.randn(M, K, device="cuda", dtype=dtype)
        b = torch.randn(K, N, device="cuda", dtype=dtype)
        assert_close(row_major(a, b), matmul_reference(a, b), dtype)
    autotuned = (matmul_kernel_autotuned, matmul_tma_kernel_autotuned)
    assert [flags["GROUP_M"] for kernel, flags in launches if kernel in autotuned] == [1, 1]


# ------------------------------------------------------- --configs (the spec's)


def test_matmul_configs_fix_each_candidate_of_the_plan(launches):
    """The spec's configurations of a call: the autotuner's candidates for the kernel its plan takes, each a launch
    of that tile, warps and stages, right against float64; on an H100 the TMA kernel's candidates with their flags."""
    a, b = torch.randn(70, 37, dtype=torch.bfloat16), torch.randn(37, 50, dtype=torch.bfloat16)
    calls = SPECS["matmul"].configs(a, b)
    assert len(calls) == len(CONFIGS)  # one label each
    for call in calls.values():
        assert_close(call(a, b), matmul_reference(a, b), torch.bfloat16)
    launched = [(f["BLOCK_M"], f["BLOCK_N"], f["BLOCK_K"], f["num_warps"], f["num_stages"], f["UPCAST_OPERANDS"])
                for kernel, f in launches if kernel is matmul_kernel]  # fmt: skip
    blocks = [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]) for c in CONFIGS]
    # (and bfloat16 upcast in the interpreter, as the call's own plan says)
    assert launched == [(*block, c.num_warps, c.num_stages, True) for block, c in zip(blocks, CONFIGS)]
    tma = choose_plan(on(H100, *meta_tensors(2048, 2048, 2048)))
    fixed = with_config(tma, TMA_CONFIGS[3])  # 128x256x64, 3 stages, 8 warps, warp-specialized
    assert (fixed.design, fixed.tile) == (TMA, Tile(128, 256, 64, warps=8, stages=3))
    assert fixed.store_halves and fixed.warp_specialize
    assert replace(fixed, tile=None, store_halves=False, warp_specialize=False) == tma  # nothing else changed


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


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_backward_of_empty_dims_with_a_broadcast_operand(device):
    """Every size 0 in turn, with the 2-D operand broadcast over the batch on either side: the
    gradients are zeros (or empty) of the operands' shapes, as PyTorch's.  K = 0 against a (5, 5, 0)
    batch raised "cannot reshape tensor of 0 elements into shape [-1, 0]"."""
    dtype = torch.float32
    for batch, m, k, n in [(5, 5, 0, 5), (0, 3, 4, 5), (2, 0, 4, 5), (2, 3, 4, 0), (2, 3, 0, 0), (0, 0, 0, 0)]:
        for a_shape, b_shape in [((batch, m, k), (k, n)), ((m, k), (batch, k, n))]:
            a = torch.randn(a_shape, dtype=dtype, device=device, requires_grad=True)
            b = torch.randn(b_shape, dtype=dtype, device=device, requires_grad=True)
            out = torch.ops.tk.matmul(a, b)
            grad = torch.randn(out.shape, dtype=dtype, device=device)
            da, db = torch.autograd.grad(out, (a, b), grad)
            ea, eb = torch.autograd.grad(torch.matmul(a, b), (a, b), grad)
            assert da.shape == a.shape and db.shape == b.shape, (a_shape, b_shape)
            assert torch.allclose(da, ea, atol=1e-5) and torch.allclose(db, eb, atol=1e-5), (a_shape, b_shape)


def test_the_harness_times_a_models_projection_as_nn_linear_lays_it_out():
    """(M, N, K, LINEAR): b = W.t() of a weight W (N, K), as F.linear multiplies; the label says so."""
    from ops.matmul.spec import LINEAR, REAL_SHAPES

    spec = SPECS["matmul"]
    a, b = spec.make_inputs((37, 29, 21, LINEAR), torch.float32, torch.device("cpu"))
    assert a.shape == (37, 21) and b.shape == (21, 29) and b.stride() == (1, 21)
    assert spec.describe((37, 29, 21, LINEAR)) == "M37xN29xK21-linear" and spec.describe((37, 29, 21)) == "M37xN29xK21"
    assert spec.bytes_moved((37, 29, 21, LINEAR), torch.float32) == spec.bytes_moved((37, 29, 21), torch.float32)
    assert_close(spec.tk(a, b), matmul_reference(a, b), torch.float32)
    lm_heads = [s for s in REAL_SHAPES if s[1] == 50257]
    assert (8191, 50257, 768, LINEAR) in lm_heads and (8191, 50257, 768) in lm_heads  # both layouts of GPT-2's head


_AUTOTUNE_CHILD = """
import torch, ops
torch.manual_seed(0)
a = torch.randn(1000, 1000, device="cuda", dtype=torch.bfloat16)
c = torch.ops.tk.matmul(a, a)
torch.cuda.synchronize()
from ops.matmul.kernels import matmul_kernel_autotuned
print("chosen", matmul_kernel_autotuned.best_config)
"""


@pytest.mark.timeout(900)  # pytest-timeout's limit, where installed: compiles or autotunes for minutes on a GPU
@pytest.mark.gpu
def test_the_autotuners_choice_is_kept_for_the_next_process(tmp_path):
    """The first tk.matmul of a shape in a process sweeps the autotuner's configs (seconds each new shape; a
    float32 model's first step took 154 s); its choice is kept on disk (`cache_results`), so a second process
    with the same Triton cache takes it without a sweep.  Triton prints each sweep it runs under
    TRITON_PRINT_AUTOTUNING=1, and nothing for a choice read from disk."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton"), "TRITON_PRINT_AUTOTUNING": "1", "TK_NATIVE": "0"}
    runs = [
        subprocess.run([sys.executable, "-c", _AUTOTUNE_CHILD], env=env, capture_output=True, text=True, timeout=600)
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    first, second = (run.stdout for run in runs)
    assert "Triton autotuning for function matmul_kernel" in first, first
    assert "Triton autotuning for function" not in second, second
    assert first.splitlines()[-1] == second.splitlines()[-1]  # the same config, swept or read from disk


def test_the_tma_autotuner_times_each_distinct_kernel_once():
    """With C stored through pointers, STORE_HALVES changes nothing: of two configs that differ only
    there the autotuner keeps one; with C stored by TMA every config is a kernel of its own."""
    from ops.matmul.kernels import TMA_CONFIGS, distinct_kernels, matmul_tma_kernel_autotuned

    assert matmul_tma_kernel_autotuned.early_config_prune is distinct_kernels
    assert distinct_kernels(TMA_CONFIGS, {}, C_POINTERS=False) == TMA_CONFIGS
    kept = distinct_kernels(TMA_CONFIGS, {}, C_POINTERS=True)
    dropped = [c for c in TMA_CONFIGS if c not in kept]

    def without_halves(c):
        return ({k: v for k, v in c.kwargs.items() if k != "STORE_HALVES"}, c.num_warps, c.num_stages)

    assert len(dropped) == 1 and without_halves(dropped[0]) in [without_halves(c) for c in kept]
    assert len({str(without_halves(c)) for c in kept}) == len(kept)
