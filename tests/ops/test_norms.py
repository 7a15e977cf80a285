"""rms_norm and layer_norm against float64 references: dtypes, odd shapes,
strides, empties, every design, gradients, opcheck, errors and torch.compile.

Each test runs on the CPU (the Triton kernels through the interpreter, small
sizes) and on CUDA (compiled kernels, realistic sizes; marked `gpu`).
"""

import dataclasses
import math
import re
import types

import pytest
import torch
import torch.nn.functional as F
import tuned as tuned_ops
from ptx_checks import assert_publishes_without_release, assert_waits_for_the_fill_before_the_scratch, build_for_hopper
from reference import (
    DEVICES,
    DTYPES,
    assert_close,
    assert_raises_clearly,
    error_cases,
    leaf64,
    rel_error,
    strided_versions,
)

import ops
from ops.blocks import held_rows
from ops.blocks.alignment import frame_run
from ops.blocks.held_rows import can_overlap_fill
from ops.norms import launch as norm_launch, layer_norm as layer_norm_entry, rms_norm as rms_norm_entry
from ops.norms.plan import (
    CORRECTED_MEAN,
    FRAMED_ROWS,
    HELD_ROWS,
    LONG_ROWS,
    NO_ROWS,
    PIVOT_MEAN,
    PLAIN_MEAN,
    SHORT_ROWS,
    TUNING,
    ByKind,
    HeldNormSetup,
    HeldSetups,
    Meta,
    OddRows,
    backward_tile,
    choose_backward_plan,
    choose_forward_plan,
    describe_backward,
)
from ops.norms.rms_norm import default_eps
from ops.runtime import H100, INTERPRETER, device_facts, launcher
from ops.runtime.direct import run_direct


def pick(device, cpu, cuda):
    return cuda if device == "cuda" else cpu


def params(n, device, dtype, weight=True, bias=True):
    """A weight near 1 and a bias near 0 (not exactly: a wrong use of either shows)."""
    w = 1 + 0.5 * torch.randn(n, device=device, dtype=dtype) if weight else None
    b = 0.5 * torch.randn(n, device=device, dtype=dtype) if bias else None
    return w, b


def as64(t):
    return None if t is None else t.double()


def rms_reference(x, weight, eps):
    return F.rms_norm(x.double(), (x.shape[-1],), as64(weight), eps)


def layer_norm_reference(x, normalized_shape, weight, bias, eps):
    return F.layer_norm(x.double(), normalized_shape, as64(weight), as64(bias), eps)


# ------------------------------------------------------------------ forward


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_float64(device, dtype):
    shapes = pick(
        device,
        [(37, 129), (3, 5, 64), (1, 1), (2, 70_001)],  # 70_001: longer than a CPU block
        [(4096, 4096), (3000, 5000), (8, 1000, 999), (16384, 128), (64, 16385), (1024, 32768), (2, 100_003)]
        + [(1, 4096), (4096, 1)],  # one row, one column: Triton specializes a size of 1
    )
    for i, shape in enumerate(shapes):
        x = 2 * torch.randn(shape, device=device, dtype=dtype)
        weight, _ = params(shape[-1], device, dtype, weight=i % 2 == 0, bias=False)
        for layout, view in strided_versions(x):
            y = torch.ops.tk.rms_norm(view, weight, 1e-6)
            assert y.shape == view.shape, layout
            # float64 on CUDA: eps reaches the kernel as float32 (see _rstd); a
            # one-column row's mean square can be near eps (1.2e-11 measured).
            scale = 100 if device == "cuda" and dtype == torch.float64 else 1
            assert_close(y, rms_reference(view, weight, 1e-6), dtype, scale=scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_matches_float64(device, dtype):
    cases = pick(
        device,
        [((37, 129), [129]), ((3, 5, 64), [5, 64]), ((4, 1), [1]), ((2, 3, 7, 11), [7, 11]), ((2, 70_001), [70_001])],
        [
            ((4096, 4096), [4096]),
            ((3000, 5000), [5000]),
            ((8, 1000, 999), [1000, 999]),
            ((16384, 128), [128]),
            ((64, 16385), [16385]),
            ((1024, 32768), [32768]),
            ((2, 100_003), [100_003]),
            ((1, 4096), [4096]),  # one row, one column: Triton specializes a size of 1
            ((4096, 1), [1]),
        ],
    )
    affine = [(True, True), (True, False), (False, True), (False, False)]
    for i, (shape, normalized_shape) in enumerate(cases):
        x = 5 + 2 * torch.randn(shape, device=device, dtype=dtype)  # a mean far from 0
        has_weight, has_bias = affine[i % len(affine)]
        weight, bias = params(normalized_shape, device, dtype, has_weight, has_bias)
        for layout, view in strided_versions(x):
            y = torch.ops.tk.layer_norm(view, normalized_shape, weight, bias, 1e-5)
            assert y.shape == view.shape, layout
            assert_close(y, layer_norm_reference(view, normalized_shape, weight, bias, 1e-5), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n_cols", [129, 70_001])  # one block, and two sweeps
def test_layer_norm_variance_survives_a_large_mean(device, n_cols):
    """float32 rows of mean 1e4 and std 1.  Any float32 algorithm errs by
    about eps * mean / std (the mean itself is rounded to float32); the
    one-pass sum(x^2)/N - mean^2 loses the whole variance instead (errors of
    0.6 to 250 here), and the chunk merge of long rows must not either."""
    mean, std = 1e4, 1.0
    x = mean + std * torch.randn(pick(device, 3, 512), n_cols, device=device)
    reference = layer_norm_reference(x, [n_cols], None, None, 1e-5)
    error = rel_error(torch.ops.tk.layer_norm(x, [n_cols], None, None, 1e-5), reference)
    assert error < 8 * torch.finfo(torch.float32).eps * mean / std


# Rows of one repeated value.  sum(x) / N need not give that value back (0.9 + 0.9 + 0.9 rounds
# in float32, and 3 * 0.1 in float64), and an ulp of x - mean times rstd (1024 at CONSTANT_EPS)
# shows; PyTorch's Welford mean is exact there.
CONSTANTS = [0.9, 0.1, 1 / 3, 100.1, 9e-4]
CONSTANT_EPS = 2.0**-20  # as the GPU fuzz drew it (exact in float32)


def constant_rows(n_rows, n_cols, device, dtype):
    """n_rows rows of n_cols copies of one value each, CONSTANTS in turn: a column expanded (stride 0 along the rows)."""
    values = torch.tensor(CONSTANTS, dtype=torch.float64)[torch.arange(n_rows) % len(CONSTANTS)]
    return values.to(device, dtype)[:, None].expand(n_rows, n_cols)


def constant_layouts(n_cols, device, dtype):
    """(name, x): one value expanded from a scalar (the fuzz's input), rows of CONSTANTS expanded, and contiguous."""
    rows = constant_rows(2 * len(CONSTANTS), n_cols, device, dtype)
    return [("scalar", rows[0, :1].squeeze().expand(n_cols)), ("expanded", rows), ("contiguous", rows.contiguous())]


def affine_after_layer_norm(n_cols, eps):
    """fn(x, w, b): PyTorch's layer norm with w and b applied after it, so that dw is sum(dy * xhat) of
    its forward's xhat: exactly 0 on constant rows.  (Its fused backward takes dw as
    sum(dy * (rstd * x - rstd * mean)), rounding noise of 1e-13 there, all of a zero gradient's error.)"""
    return lambda x, w, b: F.layer_norm(x, (n_cols,), None, None, eps) * w + b


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_cols", [3, 1000, 8192, 70_001])  # a block (8192: the plain mean's last); chunks
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning", "ignore:overflow encountered:RuntimeWarning")  # numpy, 0 * inf
def test_layer_norm_of_constant_rows_is_the_bias(device, dtype, n_cols):
    """Found by the GPU fuzz: on a constant row x - mean is exactly 0, so y is exactly the bias (0
    without one), and a weight of inf gives NaN there (0 * inf) as PyTorch's float64 does, not inf."""
    weight, bias = params(n_cols, device, dtype)
    for layout, x in constant_layouts(n_cols, device, dtype):
        y = torch.ops.tk.layer_norm(x, [n_cols], weight, bias, CONSTANT_EPS)
        assert torch.equal(y, bias.expand_as(y)), layout
        y = torch.ops.tk.layer_norm(x, [n_cols], None, None, CONSTANT_EPS)
        assert torch.equal(y, torch.zeros_like(y)), layout
    weight[0] = float("inf")
    for layout, x in constant_layouts(n_cols, device, dtype):
        y = torch.ops.tk.layer_norm(x, [n_cols], weight, bias, CONSTANT_EPS)
        expected = layer_norm_reference(x, [n_cols], weight, bias, CONSTANT_EPS)
        assert expected[..., 0].isnan().all() and not expected[..., 1:].isnan().any()
        assert torch.equal(y.isnan(), expected.isnan()), layout
        assert torch.equal(y[..., 1:], bias[1:].expand_as(y[..., 1:])), layout


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # numpy's float32 sum, in the interpreter
def test_layer_norm_of_huge_constant_bfloat16_rows_is_the_bias(device):
    """bfloat16 spans float32's range: n copies of a value above 3.4e38 / n overflow the plain mean's float32 sum
    (_standardize_plain; the review of perf-notes version 58 found NaN rows where PyTorch gives the bias). Such a
    row is summed again at 2**-16 and still gives exactly the bias, and the tile's other rows are unaffected."""
    for value, n_cols in ((1e38, 4), (-3e38, 2), (1e35, 4096), (5e34, 8192)):
        x = torch.full((3, n_cols), value, device=device, dtype=torch.bfloat16)
        weight, bias = params(n_cols, device, torch.bfloat16)
        y = torch.ops.tk.layer_norm(x, [n_cols], weight, bias, 1e-5)
        assert torch.equal(y, bias.expand_as(y)), (value, n_cols)
    x = torch.randn(4, 64, device=device).to(torch.bfloat16)
    x[1] = 1e38
    y = torch.ops.tk.layer_norm(x, [64], None, None, 1e-5)
    assert torch.equal(y[1], torch.zeros_like(y[1]))
    assert_close(y[[0, 2, 3]], layer_norm_reference(x[[0, 2, 3]], [64], None, None, 1e-5), torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n_cols", [3, 1000])  # rows held whole in a tile (float32: _center's corrected mean)
def test_layer_norm_of_a_large_offset_is_float32_accurate(device, n_cols):
    """float32 rows of 1e4 plus noise of std 1e-2, forward and backward within float32's tolerance of
    float64.  sum(x) / N alone missed the mean by up to half an ulp of 1e4 (5e-4), which shifted xhat by up
    to 5%; the correction (sum(x - mean) / N taken out) recovers it."""
    x = 1e4 + 1e-2 * torch.randn(pick(device, 6, 512), n_cols, device=device)
    weight, bias = params(n_cols, device, torch.float32)
    y = torch.ops.tk.layer_norm(x, [n_cols], weight, bias, 1e-5)
    assert_close(y, layer_norm_reference(x, [n_cols], weight, bias, 1e-5), torch.float32)
    check_gradients(
        lambda x, w, b: torch.ops.tk.layer_norm(x, [n_cols], w, b, 1e-5),
        lambda x, w, b: F.layer_norm(x, (n_cols,), w, b, 1e-5),
        [x.requires_grad_(), weight.requires_grad_(), bias.requires_grad_()],
        torch.float32,
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_cols", [3, 1000, 8192, 70_001])  # a block (8192: the plain mean's last); chunks
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning", "ignore:overflow encountered:RuntimeWarning")
def test_layer_norm_of_rows_that_start_with_inf_or_nan(device, dtype, n_cols):
    """Where a row's first element (a 16-bit short row's pivot) is inf, -inf or NaN, that row is NaN in
    every design, as PyTorch's, and the finite rows beside it (in the same tile) are as accurate as ever."""
    x = 5 + 2 * torch.randn(6, n_cols, device=device, dtype=dtype)
    x[1, 0], x[3, 0], x[4, 0] = float("inf"), float("-inf"), float("nan")
    weight, bias = params(n_cols, device, dtype)
    y = torch.ops.tk.layer_norm(x, [n_cols], weight, bias, 1e-5)
    expected = layer_norm_reference(x, [n_cols], weight, bias, 1e-5)
    assert expected[[1, 3, 4]].isnan().all()
    assert torch.equal(y.isnan(), expected.isnan())
    finite = [0, 2, 5]
    assert_close(y[finite], expected[finite], dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rms_norm_default_eps_is_pytorchs(device, dtype):
    """eps=None: PyTorch adds the compute dtype's epsilon (float32's for half
    types), not torch.finfo(dtype).eps; it shows on rows of tiny values."""
    x = 1e-4 * torch.randn(pick(device, 5, 1024), 64, device=device, dtype=dtype)
    weight, _ = params(64, device, dtype, bias=False)
    out = torch.ops.tk.rms_norm(x, weight, None)
    expected = F.rms_norm(x, (64,), weight, None)
    assert_close(out, expected.double(), dtype)
    assert default_eps(dtype) == torch.finfo(torch.float32).eps
    if dtype != torch.float32:  # the other reading of "the dtype's eps" would be far off
        other = rms_reference(x, weight, torch.finfo(dtype).eps)
        assert rel_error(out, other) > 0.5
    assert default_eps(torch.float64) == torch.finfo(torch.float64).eps


@pytest.mark.parametrize("device", DEVICES)
def test_strided_weight_and_bias(device):
    n = 20
    x = torch.randn(5, n, device=device)
    weight = torch.randn(2 * n, device=device)[::2]
    bias = torch.randn(3 * n, device=device)[::3]
    assert_close(torch.ops.tk.rms_norm(x, weight, 1e-6), rms_reference(x, weight, 1e-6), torch.float32)
    assert_close(
        torch.ops.tk.layer_norm(x, [n], weight, bias, 1e-5), layer_norm_reference(x, [n], weight, bias, 1e-5), torch.float32
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning", "ignore:invalid value:RuntimeWarning")  # numpy, in padding
def test_eps_zero_leaves_padding_rows_out_of_the_gradients(device):
    """Rows past the end of the last tile read as zeros: with eps = 0 their
    rstd is inf and xhat NaN, which must not reach dw of the real rows."""
    n_rows, n = 5, 20  # on either device a tile of 8 rows, forward and backward: three rows of padding
    meta = Meta(True, n_rows, n, 8, 8, device_facts(torch.device(device)))
    assert choose_forward_plan(meta).block_m == choose_backward_plan(meta).block_m == 8
    x = torch.randn(n_rows, n, device=device, dtype=torch.float64, requires_grad=True)
    weight, bias = params(n, device, torch.float64)
    inputs = [x, weight.requires_grad_(), bias.requires_grad_()]
    check_gradients(
        lambda x, w, b: torch.ops.tk.rms_norm(x, w, 0.0), lambda x, w, b: F.rms_norm(x, (n,), w, 0.0), inputs, torch.float64
    )
    check_gradients(
        lambda x, w, b: torch.ops.tk.layer_norm(x, [n], w, b, 0.0),
        lambda x, w, b: F.layer_norm(x, (n,), w, b, 0.0),
        inputs,
        torch.float64,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_norms_of_empty_tensors(device):
    weight = torch.randn(5, device=device, requires_grad=True)
    bias = torch.randn(5, device=device, requires_grad=True)
    for shape in [(0, 5), (2, 0, 5)]:
        x = torch.randn(shape, device=device, requires_grad=True)
        y = torch.ops.tk.rms_norm(x, weight, 1e-6) + torch.ops.tk.layer_norm(x, [5], weight, bias, 1e-5)
        assert y.shape == shape
        y.sum().backward()
        assert x.grad.shape == shape
        assert torch.equal(weight.grad, torch.zeros(5, device=device))  # a sum over no rows
        assert torch.equal(bias.grad, torch.zeros(5, device=device))
        weight.grad = bias.grad = None
    x = torch.randn(4, 0, device=device)
    assert torch.ops.tk.rms_norm(x, None, None).shape == (4, 0)
    assert torch.ops.tk.layer_norm(x, [0], None, None, 1e-5).shape == (4, 0)


# ----------------------------------------------------------------- backward


def check_gradients(tk_fn, torch_fn, inputs, dtype, scale=2.0):
    """Gradients of every input that requires them, against PyTorch in float64, each in its input's
    dtype (`dtype` for 16-bit inputs; float32 parameters of a 16-bit x get float32 gradients)."""
    tk_inputs = [None if t is None else t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    out = tk_fn(*tk_inputs)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref_inputs = [None if t is None else leaf64(t).requires_grad_(t.requires_grad) for t in inputs]
    torch_fn(*ref_inputs).backward(grad.double())
    for got, want in zip(tk_inputs, ref_inputs):
        if want is None or want.grad is None:  # frozen, or unused (a bias passed to rms_norm's lambda)
            assert got is None or got.grad is None
            continue
        assert_close(got.grad, want.grad, dtype if got.dtype == dtype else got.dtype, scale=scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_backward_matches_pytorch(device, dtype):
    shapes = pick(device, [(37, 129), (2, 3, 64)], [(4096, 4096), (16384, 1024), (3000, 5000), (512, 16385)])
    for shape in shapes:
        n = shape[-1]
        x = 2 * torch.randn(shape, device=device, dtype=dtype).requires_grad_()
        weight, _ = params(n, device, dtype, bias=False)
        check_gradients(
            lambda x, w: torch.ops.tk.rms_norm(x, w, 1e-6),
            lambda x, w: F.rms_norm(x, (n,), w, 1e-6),
            [x, weight.requires_grad_()],
            dtype,
        )


@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_backward_spec(device):
    """The harness's rms_norm backward: on CUDA eager runs aten's fused backward (what autograd runs
    for F.rms_norm there), elsewhere the formula; the formula, in float64, is the reference."""
    from ops.norms import spec as rms_ops

    spec = ops.get_spec("rms_norm_backward")
    shape = pick(device, spec.shapes["cpu"][0], (4096, 4096))
    assert spec.bytes_moved(shape, torch.bfloat16) == 2 * (3 * shape[0] * shape[1] + 2 * shape[1])
    for dtype in spec.dtypes:
        grad, x, weight, rstd = inputs = spec.make_inputs(shape, dtype, torch.device(device))
        x64, w64 = x.double().requires_grad_(), weight.double().requires_grad_()
        F.rms_norm(x64, (shape[-1],), w64, rms_ops.RMS_EPS).backward(grad.double())
        ref64 = spec.reference64(*(t.double() for t in inputs))
        torch.testing.assert_close(ref64, (x64.grad, w64.grad))
        for got in (spec.reference(*inputs), spec.tk(*inputs)):
            assert [t.dtype for t in got] == [dtype, dtype]
            assert_close(got[0], x64.grad, dtype)
            assert_close(got[1], w64.grad, dtype, scale=4)  # a sum over the rows: PyTorch's own rounding


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_backward_matches_pytorch(device, dtype):
    cases = pick(
        device,
        [((37, 129), [129]), ((2, 3, 4, 16), [4, 16])],
        [((4096, 4096), [4096]), ((16384, 1024), [1024]), ((3000, 5000), [5000]), ((512, 16385), [16385])],
    )
    for shape, normalized_shape in cases:
        x = (5 + 2 * torch.randn(shape, device=device, dtype=dtype)).requires_grad_()
        weight, bias = params(normalized_shape, device, dtype)
        check_gradients(
            lambda x, w, b: torch.ops.tk.layer_norm(x, normalized_shape, w, b, 1e-5),
            lambda x, w, b: F.layer_norm(x, normalized_shape, w, b, 1e-5),
            [x, weight.requires_grad_(), bias.requires_grad_()],
            dtype,
        )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_cols", [3, 1000, 70_001])  # one block, and two sweeps
def test_layer_norm_backward_of_constant_rows(device, dtype, n_cols):
    """xhat is 0 on a constant row: dw is exactly 0 (any error is all of it), and dx is rstd * (g - mean(g))."""
    x = constant_rows(2 * len(CONSTANTS), n_cols, device, dtype).contiguous().requires_grad_()
    weight, bias = params(n_cols, device, dtype)
    check_gradients(
        lambda x, w, b: torch.ops.tk.layer_norm(x, [n_cols], w, b, CONSTANT_EPS),
        affine_after_layer_norm(n_cols, CONSTANT_EPS),
        [x, weight.requires_grad_(), bias.requires_grad_()],
        dtype,
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_layer_norm_backward_of_16_bit_rows_far_from_zero_is_as_accurate_as_pytorchs(device, dtype):
    """The short-row backward's 16-bit tiles take the plain mean and the row sums about it as one reduction
    (perf-notes version 63): on rows whose mean is hundreds of times their spread, dx and dw stay within 1.5x
    PyTorch's own error against float64 (a one-pass variance, sum(x^2) - n mean^2, would not).  One block of 1000
    and one of 4096 columns."""
    offset = {torch.bfloat16: 200.0, torch.float16: 1000.0}[dtype]
    for n_cols in (1000, 4096):
        generator = torch.Generator().manual_seed(n_cols)
        x, grad = (torch.randn(6, n_cols, generator=generator) for _ in range(2))
        x, grad = (offset + x).to(device, dtype), grad.to(device, dtype)
        weight, bias = params(n_cols, device, dtype)
        got = torch.ops.tk.layer_norm_backward(grad, x, [n_cols], weight, 1e-5, True, True)
        exact = [t.detach().requires_grad_() for t in (x.double(), weight.double(), bias.double())]
        F.layer_norm(exact[0], [n_cols], exact[1], exact[2], 1e-5).backward(grad.double())
        native = [t.detach().requires_grad_() for t in (x, weight, bias)]
        F.layer_norm(native[0], [n_cols], native[1], native[2], 1e-5).backward(grad)

        def error(t, want):
            return ((t.double() - want).abs().max() / want.abs().max()).item()

        for tk, pytorch, want in zip(got[:2], native[:2], exact[:2], strict=True):
            assert error(tk, want.grad) <= 1.5 * error(pytorch.grad, want.grad), (n_cols, error(tk, want.grad))


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_only_where_asked(device):
    """A frozen weight or bias gets no gradient (and none is computed); x may be frozen too."""
    n = pick(device, 33, 4096)
    dtype = torch.float32
    x = torch.randn(pick(device, 6, 2048), n, device=device, dtype=dtype)
    weight, bias = params(n, device, dtype)
    for x_grad, w_grad, b_grad in [(True, False, False), (False, True, False), (True, False, True), (False, False, True)]:
        inputs = [x.requires_grad_(x_grad), weight.requires_grad_(w_grad), bias.requires_grad_(b_grad)]
        check_gradients(
            lambda x, w, b: torch.ops.tk.layer_norm(x, [n], w, b, 1e-5),
            lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5),
            inputs,
            dtype,
        )
        if x_grad or w_grad:
            check_gradients(
                lambda x, w: torch.ops.tk.rms_norm(x, w, 1e-6), lambda x, w: F.rms_norm(x, (n,), w, 1e-6), inputs[:2], dtype
            )
    check_gradients(  # no weight at all, bias only
        lambda x, b: torch.ops.tk.layer_norm(x, [n], None, b, 1e-5),
        lambda x, b: F.layer_norm(x, (n,), None, b, 1e-5),
        [x.requires_grad_(), bias.requires_grad_()],
        dtype,
    )
    check_gradients(lambda x: torch.ops.tk.rms_norm(x, None, None), lambda x: F.rms_norm(x, (n,), None, None), [x], dtype)


def test_gradcheck():
    x = torch.randn(3, 2, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 7, dtype=torch.float64, requires_grad=True)
    cases = [
        (lambda x, w, b: torch.ops.tk.layer_norm(x, [2, 7], w, b, 1e-5), (x, w, b)),
        (lambda x, w: torch.ops.tk.rms_norm(x, w[0], 1e-6), (x, w)),
        (lambda x: torch.ops.tk.rms_norm(x, None, None), (x,)),
        (lambda x: torch.ops.tk.layer_norm(x, [7], None, None, 1e-5), (x,)),
    ]
    for fn, inputs in cases:
        assert torch.autograd.gradcheck(fn, inputs, fast_mode=True)


# ---------------------------------------------------------------- designs
#
# SMALL: the interpreter's constants shrunk so that rows of tens of columns
# take every design: forward blocks of at most 64 columns, backward blocks of
# 32, tiles of 32 elements, chunks of 16, up to 8 programs of at least 2 rows,
# and a column sum of 2 partial rows by 8 columns a step.  The ops' Python
# entry points take it (`tuned` makes them differentiable, as the registered
# ops are), and `launched` records the kernels, grids and constexprs, so that
# each test checks it reached the design it means to test.

SMALL = dataclasses.replace(
    TUNING.with_cpu(max_block=64, max_block_backward=32, tile=32, chunk=16, column_sum_block=(2, 8)),
    cpu_programs=8,
    min_rows_per_program=2,
)
EPS = {"rms_norm": 1e-6, "layer_norm": 1e-5}


def tuned(op, tuning, dtype=None):
    """fn(x, w, b): tk's `op` with `tuning`, differentiable (tests/tuned.py; RMS norm takes no bias)."""
    return tuned_ops.norm(op, tuning, EPS[op], dtype)


def pytorch_norm(op):
    """fn(x, w, b): PyTorch's `op` over the last dim."""
    if op == "rms_norm":
        return lambda x, w, b: F.rms_norm(x, (x.shape[-1],), w, EPS[op])
    return lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, EPS[op])


def _backward(op, grad, x, weight, weight_grad, bias_grad, tuning=TUNING):
    """The op's backward entry point: (dx, dweight[, dbias])."""
    if op == "rms_norm":
        return rms_norm_entry.backward(grad, x, weight, EPS[op], weight_grad, tuning=tuning)
    return layer_norm_entry.backward(grad, x, [x.shape[-1]], weight, EPS[op], weight_grad, bias_grad, tuning=tuning)


def _op_backward(op, grad, x, weight, bias):
    """The registered backward op: (dx, dweight[, dbias])."""
    if op == "rms_norm":
        return torch.ops.tk.rms_norm_backward(grad, x, weight, EPS[op], weight is not None)
    return torch.ops.tk.layer_norm_backward(grad, x, [x.shape[-1]], weight, EPS[op], weight is not None, bias is not None)


def _kernel_name(kernel):
    return getattr(kernel, "__name__", None) or kernel.fn.__name__  # an autotuner: its function's


@pytest.fixture
def launched(monkeypatch):
    """(kernel name, grid, keyword arguments) of every launch the norms' launch.py makes."""
    calls, launcher = [], norm_launch.launcher

    class Recorded:
        def __init__(self, kernel, like):
            self.kernel, self.like = kernel, like

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                calls.append((_kernel_name(self.kernel), tuple(grid), kwargs))
                return launcher(self.kernel, self.like)[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(norm_launch, "launcher", Recorded)
    return calls


# (shape, forward design, backward design, forward grid, backward grid) under SMALL
DESIGN_CASES = [
    ((13, 20), "forward", "backward", (13,), (6,)),  # tiles of 1 row; 6 programs looping over 2 or 3 tiles
    ((9, 6), "forward", "backward", (3,), (3,)),  # tiles of 4 rows of 8 lanes; the last tile is 3 rows of padding
    # 2 row groups x 4 chunks, the last of 2 columns; framed in 16 bits (100 bytes a row: 4 skews, and the groups
    # a multiple of them) and float32 (200 bytes: 2 skews): framed, 4 chunks of places cover 50 columns + 8 (4)
    ((7, 50), "forward", "backward_long", (7,), {torch.float64: (2, 4), "16-bit": (4, 4), torch.float32: (2, 4)}),
    ((5, 100), "forward_long_rows", "backward_long", (5,), (2, 7)),  # 7 chunks, the last of 4 columns
    # Rows off 16-byte boundaries in every dtype (101 elements), the long forward framed (FRAME: 8 16-bit
    # elements, 4 float32, 2 float64): each row's partial runs apart from its whole ones.  The backward's row
    # groups are a multiple of the skews (8, 4, 2), or as many as the rows.
    ((6, 101), "forward_long_rows", "backward_long", (6,), {"16-bit": (6, 7), torch.float32: (4, 7), torch.float64: (2, 7)}),
]


def grid_for(grid, dtype):
    """A case's grid, or its grid for `dtype` where the grid depends on it (framed rows)."""
    if not isinstance(grid, dict):
        return grid
    return grid["16-bit" if dtype.itemsize == 2 else dtype]


def kernel_names(prefix, forward, backward):
    backward_kernels = {
        "backward": [f"{prefix}_backward_kernel"],
        "backward_long": [f"{prefix}_backward_stats_kernel", f"{prefix}_backward_columns_kernel"],
    }[backward]
    forward_kernel = {"forward": f"{prefix}_forward_kernel", "forward_long_rows": f"{prefix}_forward_long_rows_kernel"}
    return [forward_kernel[forward], *backward_kernels]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", DESIGN_CASES, ids=[str(c[0]) for c in DESIGN_CASES])
def test_designs_match_float64(launched, dtype, case):
    shape, forward, backward, forward_grid, backward_grid = case
    n = shape[-1]
    x = 5 + 2 * torch.randn(shape, dtype=dtype)
    weight, bias = params(n, "cpu", dtype)
    for prefix in ("rms_norm", "layer_norm"):
        tk_fn, torch_fn = tuned(prefix, SMALL), pytorch_norm(prefix)
        launched.clear()
        assert_close(tk_fn(x, weight, bias), torch_fn(x.double(), as64(weight), as64(bias)), dtype)
        check_gradients(tk_fn, torch_fn, [x.requires_grad_(), weight.requires_grad_(), bias.requires_grad_()], dtype)
        names = [name for name, *_ in launched]
        # the forward twice (the value, then under autograd), the backward, one column sum for dw (and db)
        forward_kernel, *backward_kernels = kernel_names(prefix, forward, backward)
        assert names == [forward_kernel, forward_kernel, *backward_kernels, "column_sum_kernel"], names
        grids = {name: grid for name, grid, _ in launched}
        assert grids[forward_kernel] == forward_grid
        assert grids[backward_kernels[-1]] == grid_for(backward_grid, dtype)
        assert grids["column_sum_kernel"][1] == (1 if prefix == "rms_norm" else 2)  # a block per parameter


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", DESIGN_CASES, ids=[str(c[0]) for c in DESIGN_CASES])
def test_float32_params_with_a_16bit_x(launched, dtype, case):
    """A 16-bit x with a float32 weight and bias, as mixed-precision models keep norms (PyTorch's norms
    take them): y in x's dtype, dx in x's, dweight and dbias in float32, every design."""
    shape, forward, backward, *_ = case
    n = shape[-1]
    x = 5 + 2 * torch.randn(shape, dtype=dtype)
    weight, bias = params(n, "cpu", torch.float32)
    for prefix in ("rms_norm", "layer_norm"):
        tk_fn, torch_fn = tuned(prefix, SMALL), pytorch_norm(prefix)
        launched.clear()
        assert_close(tk_fn(x, weight, bias), torch_fn(x.double(), as64(weight), as64(bias)), dtype)
        check_gradients(tk_fn, torch_fn, [x.requires_grad_(), weight.requires_grad_(), bias.requires_grad_()], dtype)
        assert {name for name, *_ in launched} >= set(kernel_names(prefix, forward, backward))


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("param_dtype", ["x's", torch.float32])
@pytest.mark.parametrize("case", DESIGN_CASES, ids=[str(c[0]) for c in DESIGN_CASES])
def test_a_float32_result_of_a_16bit_x(launched, x_dtype, param_dtype, case):
    """dtype=float32 (what autocast asks for on CUDA): x read as it is, y in float32 and as accurate
    as float32 allows, in every design; dx in x's dtype, the parameters' gradients in theirs."""
    shape, forward, backward, *_ = case
    n = shape[-1]
    x = 5 + 2 * torch.randn(shape, dtype=x_dtype)
    weight, bias = params(n, "cpu", x_dtype if param_dtype == "x's" else param_dtype)
    for prefix in ("rms_norm", "layer_norm"):
        tk_fn, torch_fn = tuned(prefix, SMALL, torch.float32), pytorch_norm(prefix)
        launched.clear()
        y = tk_fn(x, weight, bias)
        assert y.dtype == torch.float32
        # x and the parameters widen exactly: only float32's own rounding is left
        assert_close(y, torch_fn(x.double(), as64(weight), as64(bias)), torch.float32)
        inputs = [x.requires_grad_(), weight.requires_grad_(), bias.requires_grad_()]
        check_gradients(tk_fn, torch_fn, inputs, x_dtype)
        assert {name for name, *_ in launched} >= set(kernel_names(prefix, forward, backward))


@pytest.mark.parametrize("device", DEVICES)
def test_a_float32_result_of_strided_and_empty_16bit_inputs(device):
    n = pick(device, 33, 4096)
    weight, bias = params(n, device, torch.float32)
    for _, x in strided_versions(torch.randn(pick(device, 6, 1024), n, device=device, dtype=torch.bfloat16)):
        y = torch.ops.tk.layer_norm(x, [n], weight, bias, 1e-5, torch.float32)
        assert y.dtype == torch.float32
        assert_close(y, layer_norm_reference(x, (n,), weight, bias, 1e-5), torch.float32)
        y = torch.ops.tk.rms_norm(x, weight, 1e-6, torch.float32)
        assert_close(y, rms_reference(x, weight, 1e-6), torch.float32)
    for shape in [(0, n), (4, 0)]:
        x = torch.randn(shape, device=device, dtype=torch.float16)
        assert torch.ops.tk.rms_norm(x, None, None, torch.float32).dtype == torch.float32
        y = torch.ops.tk.layer_norm(x, [shape[-1]], None, None, 1e-5, torch.float32)
        assert y.shape == shape and y.dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
def test_float32_params_with_a_16bit_x_at_model_sizes(device):
    shape = (37, 129) if device == "cpu" else (4096, 4096)
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.randn(shape, device=device, dtype=dtype).requires_grad_()
        weight, bias = params(shape[-1], device, torch.float32)
        n = shape[-1]
        check_gradients(
            lambda x, w, b: torch.ops.tk.layer_norm(x, [n], w, b, 1e-5),
            lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5),
            [x, weight.requires_grad_(), bias.requires_grad_()],
            dtype,
        )
        check_gradients(
            lambda x, w: torch.ops.tk.rms_norm(x, w, 1e-6),
            lambda x, w: F.rms_norm(x, (n,), w, 1e-6),
            [x, weight],
            dtype,
        )


def test_the_short_row_backward_loads_ahead_by_tile_bytes(launched):
    """Tiles of at most load_ahead_bytes of the widest input load the next tile before this one's
    math, larger ones after its store: the same sums in the same order, so the same bits."""
    x = torch.randn(37, 20, dtype=torch.bfloat16)  # tiles of 1 row of 32 lanes, several a program
    weight, bias = params(20, "cpu", torch.float32)
    results = {}
    for grad_dtype in (torch.bfloat16, torch.float32):  # float32: a float32 result's gradient
        grad = torch.randn(37, 20, dtype=grad_dtype)
        for limit in (32 * grad.element_size(), 32 * grad.element_size() - 1):
            tuning = dataclasses.replace(SMALL, load_ahead_bytes=limit)
            launched.clear()
            results[limit == 32 * grad.element_size()] = [
                layer_norm_entry.backward(grad, x, [20], weight, 1e-5, True, True, tuning=tuning),
                rms_norm_entry.backward(grad, x, weight, 1e-6, True, tuning=tuning),
            ]
            flags = [kwargs["LOAD_AHEAD"] for _, _, kwargs in launched if "LOAD_AHEAD" in kwargs]
            assert flags == [limit == 32 * grad.element_size()] * 2
        for ahead, after in zip(results[True], results[False], strict=True):
            assert all(torch.equal(a, b) for a, b in zip(ahead, after, strict=True))


@pytest.mark.parametrize("present", [(True, True), (True, False), (False, True), (False, False)], ids=["w+b", "w", "b", "none"])
def test_the_forward_loads_w_and_b_beside_x_or_after(launched, present):
    """Blocks of at most affine_first_max_block columns load w and b beside x, wider ones after
    the reductions: both give the float64 values, with w and b each there or not, of a bfloat16
    x (float32 parameters where there is a weight: a lone bias must have x's dtype)."""
    tuning = dataclasses.replace(SMALL, affine_first_max_block=16, pivoted_affine_first_max_block=16)
    for n in (6, 20):  # blocks of 8 and 32 columns
        x = 5 + 2 * torch.randn(9, n, dtype=torch.bfloat16)
        weight, bias = params(n, "cpu", torch.float32 if present[0] else torch.bfloat16, *present)
        y = layer_norm_entry.forward(x, [n], weight, bias, 1e-5, tuning=tuning)
        assert_close(y, layer_norm_reference(x, (n,), weight, bias, 1e-5), torch.bfloat16)
        y = rms_norm_entry.forward(x, weight, 1e-6, tuning=tuning)
        assert_close(y, rms_reference(x, weight, 1e-6), torch.bfloat16)
    assert [kwargs.get("AFFINE_FIRST") for _, _, kwargs in launched] == [True, True, False, False]


def test_the_gpu_forward_centers_16_bit_layer_norms_by_a_plain_mean_up_to_8192_columns_then_by_pivots():
    """The GPU's rules (Tuning.plain_max_cols, pivot_element_sizes, pivoted_affine_first_max_block; perf-notes
    versions 53 and 58): layer norm's 16-bit short rows take the plain two-pass mean up to 8192 columns (exact on
    constant rows there), longer ones are shifted by their pivots; both load w and b after the reductions past
    2048 columns, but on the hidden tile (many rows of up to 4096: Tuning.hidden_blocks), which loads them beside x;
    RMS norm and float32 take neither, and load w and b beside x up to 4096."""
    cases = ((4095, 768, True, True), (4095, 4096, True, True), (2000, 4096, True, False), (4095, 8192, True, False),
             (4095, 20000, False, False))  # fmt: skip
    for n_rows, n_cols, plain, beside in cases:
        plan = choose_forward_plan(h100_meta(n_rows, n_cols, x_size=2))
        assert (plan.design, plan.mean, plan.affine_first) == ("short_rows", PLAIN_MEAN if plain else PIVOT_MEAN, beside)
        for meta in (h100_meta(4095, n_cols, x_size=4), h100_meta(4095, n_cols, x_size=2, centered=False)):
            plan = choose_forward_plan(meta)
            assert (plan.mean, plan.affine_first) == (CORRECTED_MEAN, n_cols <= 4096), (n_cols, meta)
    assert choose_forward_plan(h100_meta(4096, 20000, x_size=2)).mean == PIVOT_MEAN  # where a sum could round


def test_the_short_row_backward_takes_the_forwards_plain_mean():
    """Layer norm's short-row backward of 16-bit x and dy takes the plain mean where the forward's tiles do
    (Tuning.plain_max_cols; perf-notes version 63); a float32 dy (float32 gradients asked for), float32 x, RMS norm
    and the interpreter's rows past plain_max_cols (no pivot in the backward) take the corrected one."""
    for n_rows, n_cols in ((4095, 768), (1000, 1280), (4095, 5120), (1000, 8192)):
        for grad_size, mean in ((2, PLAIN_MEAN), (4, CORRECTED_MEAN)):
            assert choose_backward_plan(h100_meta(n_rows, n_cols, x_size=2, grad_size=grad_size)).mean == mean
        for meta in (h100_meta(n_rows, n_cols, x_size=4), h100_meta(n_rows, n_cols, x_size=2, centered=False)):
            assert choose_backward_plan(meta).mean == CORRECTED_MEAN, meta
    interpreted = choose_backward_plan(Meta(True, 4, 10000, 2, 2))
    assert (interpreted.design, interpreted.mean) == (SHORT_ROWS, CORRECTED_MEAN)
    # Layer norm's exceptions of one row four an SM at 2048 columns and two at 4096 keep the sums apart, the mean
    # corrected (TileException.one_reduction); RMS norm's tile at 4096 and every other tile take one reduction.
    for n_rows, n_cols in ((8191, 1600), (4095, 2048), (4095, 2560), (8191, 4096)):
        plan = choose_backward_plan(h100_meta(n_rows, n_cols, x_size=2))
        assert (plan.one_reduction, plan.mean) == (False, CORRECTED_MEAN), (n_rows, n_cols)
        assert choose_backward_plan(h100_meta(n_rows, n_cols, x_size=2, centered=False)).one_reduction
    for n_rows, n_cols in ((1000, 1280), (1000, 3584), (4095, 768), (4095, 5120)):
        assert choose_backward_plan(h100_meta(n_rows, n_cols, x_size=2)).one_reduction, (n_rows, n_cols)
    # The 4096-column exception is two entries now, one an op: RMS norm's keeps one row two an SM.
    rms = h100_meta(8191, 4096, x_size=2, centered=False)
    assert backward_tile(rms) == (1, 4096, 8, 2) and choose_backward_plan(rms).grid == (264,)
    assert backward_tile(h100_meta(1000, 4096, x_size=2, centered=False)) != (1, 4096, 8, 2)  # under 2048 rows


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_short_row_backward_sums_apart_or_as_one_reduction(launched, op, dtype):
    """Both ways a short-row tile sums its rows (BackwardPlan.one_reduction; the GPU's plan keeps them apart on two
    of layer norm's tiles) give the float64 gradients, on rows whose mean is far from 0, off the block's width
    (27 columns of a 32-lane block under SMALL)."""
    n_cols = 27
    x = 5 + 2 * torch.randn(11, n_cols, dtype=dtype)
    grad = torch.randn_like(x)
    weight, bias = params(n_cols, "cpu", dtype)
    centered = op == "layer_norm"
    exact = [t.double().requires_grad_() for t in (x, weight, bias)]
    if centered:
        F.layer_norm(exact[0], [n_cols], exact[1], exact[2], EPS[op]).backward(grad.double())
    else:
        F.rms_norm(exact[0], [n_cols], exact[1], EPS[op]).backward(grad.double())
    plan = choose_backward_plan(describe_backward(centered, grad, x, n_cols), SMALL)
    assert plan.design == SHORT_ROWS and plan.one_reduction
    for one_reduction in (True, False):
        mean = plan.mean if one_reduction else CORRECTED_MEAN
        ways = dataclasses.replace(plan, one_reduction=one_reduction, mean=mean)
        launched.clear()
        dx, dw, db = norm_launch.run_backward(ways, grad, x, weight, EPS[op], True, centered, (n_cols,))
        assert [kwargs["ONE_REDUCTION"] for _, _, kwargs in launched if "ONE_REDUCTION" in kwargs] == [one_reduction]
        assert_close(dx, exact[0].grad, dtype)
        assert_close(dw, exact[1].grad, dtype, scale=4)  # a sum over the rows
        if centered:
            assert_close(db, exact[2].grad, dtype, scale=4)


def test_the_short_row_backward_launches_its_plans_mean(launched):
    x, grad = torch.randn(9, 20, dtype=torch.bfloat16), torch.randn(9, 20, dtype=torch.bfloat16)
    weight, _ = params(20, "cpu", torch.bfloat16)
    for x_dtype, plain in ((torch.bfloat16, True), (torch.float32, False)):
        x_, grad_, weight_ = (t.to(x_dtype) for t in (x, grad, weight))
        layer_norm_entry.backward(grad_, x_, [20], weight_, 1e-5, True, True, tuning=SMALL)
        flags = [kwargs["PLAIN"] for _, _, kwargs in launched if "PLAIN" in kwargs]
        assert flags == [plain], x_dtype
        launched.clear()


def test_the_gpu_forward_tiles_at_hidden_sizes():
    """Many 16-bit short rows in blocks of 1024-4096 columns for layer norm, 1024 for RMS norm (Tuning.hidden_blocks,
    rms_hidden_blocks; perf-notes version 58): two rows a program at 64 elements a thread where that leaves 8
    programs an SM (one warp for two rows of 1024); fewer rows, other blocks and float32 keep the tile rule (2048
    elements, 1024 for 16-bit, 16 a thread)."""
    tile_rule = {(4095, 1280, 2): (1, 2048, 4), (8191, 4096, 2): (1, 4096, 8)}
    cases = {
        (4095, 768, 2): (2, 1024, 1), (4095, 1024, 2): (2, 1024, 1), (1000, 768, 2): (1, 1024, 2),
        (2111, 768, 2): (1, 1024, 2), (2112, 768, 2): (2, 1024, 1), (4095, 1280, 2): (2, 2048, 2),
        (8191, 4096, 2): (2, 4096, 4), (512, 2048, 2): (1, 2048, 4), (4095, 512, 2): (2, 512, 2),
        (4095, 768, 4): (2, 1024, 4),
    }  # (rows, columns, element size): (BLOCK_M, BLOCK_N, warps); 2112 = 2 rows x 8 programs x 132 SMs
    for (n_rows, n_cols, size), tile in cases.items():
        for centered in (True, False):
            plan = choose_forward_plan(h100_meta(n_rows, n_cols, x_size=size, centered=centered))
            want = tile if centered else tile_rule.get((n_rows, n_cols, size), tile)
            assert (plan.design, (plan.block_m, plan.block_n, plan.warps)) == ("short_rows", want), (n_rows, n_cols)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_of_rows_led_by_an_outlier(device, dtype):
    """Rows of randn whose first value is 1e4: a float32 row shifted by that pivot would round x - pivot at 1e4's
    scale, 4e-6 of xhat at 8192 columns (perf-notes version 53), so float32 is not pivoted and stays within 1e-6
    of float64 (PyTorch: 3e-8); bfloat16 rows are pivoted, exactly (x - pivot of two bfloat16 values 2**13 apart
    is exact in float32), and meet bfloat16's tolerance."""
    n_cols = pick(device, 4096, 8192)  # pivoted, float32 would err by 2e-6 at 4096 (CPU) and 4e-6 at 8192
    x = torch.randn(pick(device, 3, 64), n_cols, device=device).to(dtype)
    x[:, 0] = 1e4
    weight, bias = params(n_cols, device, dtype)
    y = torch.ops.tk.layer_norm(x, [n_cols], weight, bias, 1e-5)
    expected = layer_norm_reference(x, [n_cols], weight, bias, 1e-5)
    if dtype == torch.float32:
        assert rel_error(y, expected) < 1e-6
    else:
        assert_close(y, expected, dtype)


def test_long_rows_gradcheck(launched):
    x = torch.randn(3, 2, 50, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, dtype=torch.float64, requires_grad=True)
    b = torch.randn(50, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(tuned("layer_norm", SMALL), (x, w, b), fast_mode=True)
    assert torch.autograd.gradcheck(lambda x, w: tuned("rms_norm", SMALL)(x, w, None), (x, w), fast_mode=True)
    names = {name for name, *_ in launched}
    assert {"layer_norm_backward_columns_kernel", "rms_norm_backward_columns_kernel"} <= names


def _long_rows_against_float64(x, launched):
    """Layer norm of the float64 rows x (and a weight and bias) in float32 under SMALL's long rows, forward and
    backward: each row's relative error of y and dx, and those of dw and db, against float64."""
    n_cols = x.shape[-1]
    w, b = torch.randn(n_cols, dtype=torch.float64), torch.randn(n_cols, dtype=torch.float64)
    x64, w64, b64 = (t.clone().requires_grad_() for t in (x, w, b))
    expected = F.layer_norm(x64, [n_cols], w64, b64, EPS["layer_norm"])
    dy = torch.randn_like(expected)
    expected.backward(dy)
    x32, w32, b32 = (t.float().requires_grad_() for t in (x, w, b))
    y = tuned("layer_norm", SMALL)(x32, w32, b32)
    y.backward(dy.float())
    names = {name for name, *_ in launched}
    assert {"layer_norm_forward_long_rows_kernel", "layer_norm_backward_stats_kernel"} <= names, names
    rows = [(rel_error(y[row], expected[row]), rel_error(x32.grad[row], x64.grad[row])) for row in range(len(x))]
    return rows, rel_error(w32.grad, w64.grad), rel_error(b32.grad, b64.grad)


def test_long_rows_whose_first_chunk_is_far_from_their_mean(launched):
    """The two sweeps' statistics are sums about a pivot, the row's first chunk's mean (_pivoted_moments).
    Where that chunk is unlike the rest (here 1000 standard deviations off, and a row of spread 1e-3 whose
    first chunk is 1000 of them off), M2 = sum d^2 - mean d * sum d cancels, and the row is swept again
    about its mean.  float32 against float64, forward and backward: about 1e-7 here, where the sums
    about the first chunk alone gave 3e-5 (y), 4.6e-5 (dx) and 2.6e-5 (dw)."""
    torch.manual_seed(0)
    n_cols = 4000  # 250 of SMALL's chunks of 16
    x = torch.randn(3, n_cols, dtype=torch.float64)
    x[0, :16] += 1000.0
    x[1] = 3.0 + 1e-3 * torch.randn(n_cols, dtype=torch.float64)
    x[1, :16] += 1.0
    rows, dw_error, db_error = _long_rows_against_float64(x, launched)
    assert max(max(errors) for errors in rows) < 2e-6, rows
    assert dw_error < 2e-6 and db_error < 2e-6


def test_long_rows_whose_sums_about_the_pivot_overflow(launched):
    """float32 rows of spread 1e16 whose first chunk is 1e18 off: M2 (1.5e37) fits float32, the sums about the
    pivot (3.8e38) do not, and M2 = inf - inf is NaN.  A NaN M2 sweeps the row again about its mean (as a small
    one does): y, dx and dw within float32's rounding of float64 (a comparison that a NaN fails gave y off
    by 4e19 and dx NaN)."""
    torch.manual_seed(0)
    x = 1e16 * torch.randn(2, 400, dtype=torch.float64)
    x[:, :16] += 1e18
    rows, dw_error, _ = _long_rows_against_float64(x, launched)
    assert max(max(errors) for errors in rows) < 1e-6, rows
    assert dw_error < 1e-6


def test_long_rows_holding_an_infinity_are_nan_as_in_pytorch(launched):
    """A long row holding inf, -inf or NaN (not in its first chunk, or in it): PyTorch's y and dx are NaN across
    the row.  The sums about the pivot give M2 = inf - inf = NaN there, which a clamp by tl.maximum (max.f32
    returns the number of a number and a NaN) turned into 0, and y into infinities (the fuzz found it)."""
    x = torch.randn(4, 100)
    x[0, 50], x[1, 3], x[2, 70], x[3, 90] = float("inf"), float("-inf"), float("nan"), 1.0
    w, b = torch.randn(100), torch.randn(100)
    x_in = x.clone().requires_grad_()
    y = tuned("layer_norm", SMALL)(x_in, w, b)
    y.backward(torch.ones_like(y))
    assert "layer_norm_forward_long_rows_kernel" in {name for name, *_ in launched}
    assert y[:3].isnan().all() and x_in.grad[:3].isnan().all()
    expected = F.layer_norm(x[3:].double(), [100], w.double(), b.double(), EPS["layer_norm"])
    assert rel_error(y[3:], expected) < 1e-6  # the finite row beside them


def h100_meta(n_rows, n_cols, x_size=4, grad_size=None, centered=True, **facts):
    """A call on the H100 the plans were measured on (`facts`: fields of it changed)."""
    grad_size = x_size if grad_size is None else grad_size
    return Meta(centered, n_rows, n_cols, x_size, grad_size, dataclasses.replace(H100, **facts))


def test_the_design_rules():
    """Tiles hold whole rows and about `tile` elements; the backward's programs are a few per SM,
    each with at least min_rows_per_program rows, in the short-row design and the two sweeps."""
    two_sweeps = dataclasses.replace(TUNING, held_rows=ByKind(cuda=False, cpu=False))
    for n_rows in [1, 3, 100, 4096, 1 << 20]:
        for n_cols in [1, 7, 128, 1000, 4096, 16384]:
            plan = choose_forward_plan(h100_meta(n_rows, n_cols))
            block_m, block_n = plan.block_m, plan.block_n
            assert plan.design == SHORT_ROWS and plan.grid == (-(-n_rows // block_m),)
            assert block_n >= n_cols and block_n & (block_n - 1) == 0 and block_m & (block_m - 1) == 0
            assert block_m == 1 or block_m * block_n <= TUNING.tile.cuda
            assert block_m < 2 * n_rows  # no tile of padding rows only
            meta = h100_meta(n_rows, n_cols)
            plan = choose_backward_plan(meta, two_sweeps)
            if plan.design == SHORT_ROWS:  # programs_per_sm of them an SM (four for a 1024-column exception)
                work_items, target = -(-n_rows // plan.block_m), backward_tile(meta)[3] * 132
            else:
                assert plan.design == LONG_ROWS and n_cols > TUNING.max_block_backward.cuda
                target = TUNING.programs_per_sm * 132
                work_items = -(-target // plan.grid[1])  # row groups, spread over the chunks
            assert 1 <= plan.partial_rows <= min(target, work_items)
            assert plan.partial_rows == 1 or n_rows / plan.partial_rows >= TUNING.min_rows_per_program
    # big inputs fill every SM: the short-row backward one program an SM (a program loading ahead
    # holds its registers; the exceptions' small tiles aside), the two sweeps' (row group, chunk) programs two
    assert choose_backward_plan(h100_meta(1 << 20, 2048)).grid == (132,)
    assert choose_backward_plan(h100_meta(1 << 20, 1024)).grid == (528,)  # the float32 1024-column exception
    plan = choose_backward_plan(h100_meta(1 << 20, 16384), two_sweeps)
    assert plan.design == LONG_ROWS and plan.grid == (66, 4)
    # the two sweeps' statistics: per-lane sums on 8 warps over chunks of 2048 (Tuning.statistics_chunk); the
    # columns pass on 16 warps over chunks of 4096; a tuning of smaller chunks shrinks both
    assert (plan.block_n, plan.warps, plan.statistics.block_n, plan.statistics.warps) == (4096, 16, 2048, 8)
    small = choose_backward_plan(h100_meta(4096, 50257, 2), dataclasses.replace(two_sweeps, chunk=ByKind(1024, 16)))
    assert (small.block_n, small.statistics.block_n, small.statistics.warps) == (1024, 1024, 4)
    assert choose_backward_plan(h100_meta(1 << 20, 1024)).statistics is None  # the other designs have none
    long_forward = choose_forward_plan(h100_meta(4096, 50257, 2))
    assert (long_forward.design, long_forward.block_n, long_forward.warps) == (LONG_ROWS, 4096, 16)
    # The forward's tile: 2048 elements, 1024 of 16-bit rows (measured, see Tuning.tile); longer rows alone.
    tiles = [(plan.block_m, plan.block_n) for plan in (choose_forward_plan(h100_meta(1 << 20, n)) for n in (128, 768, 2048, 4100))]
    assert tiles == [(16, 128), (2, 1024), (1, 2048), (1, 8192)]
    tiles = [(plan.block_m, plan.block_n) for plan in (choose_forward_plan(h100_meta(1 << 20, n, 2)) for n in (128, 768, 2048))]
    assert tiles == [(8, 128), (2, 1024), (2, 2048)]  # 16-bit hidden sizes: two rows (Tuning.hidden_blocks)
    assert choose_forward_plan(h100_meta(1 << 20, 128, 8)).block_m == 8  # float64: two registers a value
    # Past a block: a row a program, in chunks; float64 rows past half the block.
    assert choose_forward_plan(h100_meta(8, 32768)).design == SHORT_ROWS
    assert choose_forward_plan(h100_meta(8, 32769)).design == LONG_ROWS
    assert choose_forward_plan(h100_meta(8, 16385, 8)).design == LONG_ROWS
    assert choose_forward_plan(h100_meta(0, 128)).design == NO_ROWS


# ------------------------------------------------------ rows held across programs

# The backward rows held across programs on CPU: each program computes its row's partials
# itself there (the interpreter runs programs one after another), over 32-column segments.
HELD = SMALL.with_cpu(held_rows=True)
HELD_16 = dataclasses.replace(HELD, cpu_programs=16)  # 8 framed rows of 33 columns at once (a multiple of 8)
HELD_32 = dataclasses.replace(HELD, cpu_programs=32)  # 8 framed rows of 101 columns (4 segments) at once


def check_a_float32_grad(op, x, weight, bias, tuning):
    """The backward entry point with a float32 grad (as autocast hands a float32 result's gradient) of x, under
    `tuning`: dx, dweight (and dbias) in x's dtype, against float64."""
    grad = torch.randn(x.shape)
    bias = bias if op == "layer_norm" else None
    tk_grads = _backward(op, grad, x.detach(), weight, True, bias is not None, tuning)
    leaves = [leaf64(x), leaf64(weight), None if bias is None else leaf64(bias)]
    pytorch_norm(op)(*leaves).backward(grad.double())
    for got, leaf in zip(tk_grads, leaves):
        assert got.dtype == x.dtype
        assert_close(got, leaf.grad, x.dtype)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype", DTYPES[:3])  # float64 keeps the two sweeps (see test_the_held_rows_rule)
@pytest.mark.parametrize("shape", [(7, 100), (20, 33), (3, 2, 64)], ids=str)
def test_norm_backward_held_rows_match_float64(launched, op, dtype, shape):
    """Rows not cut evenly by segments (100 = 3 x 32 + 4; 33 = 32 + 1), rows not cut evenly by the
    rounds (20 rows, 16 programs of 2 segments: 8 rows at once), rows off 16-byte boundaries held
    framed (33 columns in every dtype, 100 in 16 bits: 200 bytes), with a weight (and bias) and
    without, rows whose mean is far from 0 (layer norm merges its segments' moments, no
    cancellation), and a float32 grad of a 16-bit x (an autocast result's): the gradients against
    float64."""
    n = shape[-1]
    tk_fn, torch_fn = tuned(op, HELD_16), pytorch_norm(op)
    x = 100 + torch.randn(shape, dtype=dtype) if op == "layer_norm" else 3 + 2 * torch.randn(shape, dtype=dtype)
    weight, bias = params(n, "cpu", dtype)
    for w, b in ((weight, bias), (None, None)):
        launched.clear()
        leaves = [x.requires_grad_(), None if w is None else w.requires_grad_(), None if b is None else b.requires_grad_()]
        check_gradients(tk_fn, torch_fn, leaves, dtype)
        names = [name for name, *_ in launched]
        assert f"{op}_backward_held_kernel" in names and f"{op}_backward_stats_kernel" not in names, names
    check_a_float32_grad(op, x, weight, bias, HELD_16)


def _held_twice(op, x, grad, weight, rows_ahead=1):
    """The op's held backward launched twice over the same words: first no program waits (each
    computes every partial of its rows and publishes its own), then each finds its rows' words
    published and combines those.  Both (dx, dw partials), and the words."""
    n_rows, n_cols = x.shape
    plan = choose_backward_plan(Meta(op == "layer_norm", n_rows, n_cols, x.element_size(), grad.element_size()), HELD_32)
    held = plan.held
    assert plan.design == HELD_ROWS and held.rows_at_once < n_rows / 2  # a program's rounds reach the segment two rows ahead
    words = ops.blocks.held_rows.unpublished_words(x, n_rows, held.words)
    kernel = ops.blocks.held_rows.register_capped(norm_launch.KERNELS[plan.centered].backward_held, held.setup.warps,
                                                  held.setup.registers)  # fmt: skip
    results = []
    for max_spins in (0, 1):
        dx, dw_partial = torch.full_like(x, float("nan")), torch.full((held.rows_at_once, n_cols), float("nan"))
        launcher(kernel, x)[plan.grid](
            grad, x, weight, dx, dw_partial, dx, words, n_rows, n_cols, 1e-6, held.n_segments, held.rows_at_once,
            max_spins, HAS_WEIGHT=True, WEIGHT_GRAD=True, BIAS_GRAD=False, COL_MULTIPLE=1, OVERLAPPED=False,
            **{**held.constexprs(), "ROWS_AHEAD": rows_ahead},
        )  # fmt: skip
        results.append((dx, dw_partial))
    return results, words


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows_ahead", [1, 2])
@pytest.mark.parametrize("n_cols", [100, 96, 101])
def test_norm_held_rows_published_partials_give_the_same_bits(op, dtype, rows_ahead, n_cols):
    """The path a GPU takes when a row's programs all run at once (partials read from the words)
    and the one it takes when they do not (computed here): the same bits, with the next row's
    segment loaded ahead or the next two, on rows with a part segment (100 = 3 x 32 + 4), rows
    of whole ones (96, where the moments run unmasked) and rows off 16-byte boundaries (101, and
    100 in bfloat16), held framed: a row's segments then start at the boundary before it, so
    row r's first segment holds (r * n_cols) % run places before its first element.  RMS norm's
    word holds its segment's (sum(x^2), sum(x * dy * w)); layer norm's two words (mean x, M2 of
    x) and (mean g, sum((x - mean x) * g)), g = dy * w."""
    n_rows = 25
    x, grad = (3 + 2 * torch.randn(n_rows, n_cols)).to(dtype), torch.randn(n_rows, n_cols).to(dtype)
    weight = (1 + 0.5 * torch.randn(n_cols)).to(dtype)
    ((dx_here, dw_here), (dx_read, dw_read)), words = _held_twice(op, x, grad, weight, rows_ahead)
    assert torch.equal(dx_here, dx_read) and torch.equal(dw_here, dw_read)
    assert not dx_read.isnan().any() and not dw_read.isnan().any()  # every row and partial column written
    assert (words != ops.blocks.held_rows.UNPUBLISHED.value).all()
    halves = words.view(torch.int32).view(*words.shape, 2).view(torch.float32)  # little-endian: lower half first
    run = frame_run(n_cols, 1, x.element_size())
    skews = [(r * n_cols) % run if run else 0 for r in range(n_rows)]
    n_segments = -(-(n_cols + max(run - 1, 0)) // 32)
    assert halves.shape[1] == n_segments * (2 if op == "layer_norm" else 1)

    def in_segments(t):  # each row at its skew in a frame of n_segments x 32 places
        rows = [F.pad(row, (skew, 32 * n_segments - n_cols - skew)) for row, skew in zip(t, skews)]
        return torch.stack(rows).view(n_rows, n_segments, 32)

    x64 = in_segments(x.double())
    g64 = in_segments(grad.double() * weight.double())
    if op == "rms_norm":
        torch.testing.assert_close(halves[..., 1].double(), (x64 * x64).sum(-1), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(halves[..., 0].double(), (x64 * g64).sum(-1), rtol=1e-2, atol=1e-2)
    else:
        inside = in_segments(torch.ones(n_rows, n_cols, dtype=torch.float64)) > 0
        counts = inside.sum(-1).double()
        means_x = x64.sum(-1) / counts.clamp(min=1)  # a segment past a row's end: 0
        centered = torch.where(inside, x64 - means_x[..., None], 0.0)
        expected = [means_x, (centered * centered).sum(-1), g64.sum(-1) / counts.clamp(min=1), (centered * g64).sum(-1)]
        got = [halves[:, 0::2, 1], halves[:, 0::2, 0], halves[:, 1::2, 1], halves[:, 1::2, 0]]  # segment s: 2s, 2s + 1
        for g, e in zip(got, expected):
            torch.testing.assert_close(g.double(), e, rtol=1e-2, atol=1e-2)
    reference = _backward(op, grad.double(), x.double(), weight.double(), True, False)[0]
    assert_close(dx_read, reference, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tuning", ["SMALL", "HELD"])
@pytest.mark.parametrize("case", DESIGN_CASES, ids=[str(c[0]) for c in DESIGN_CASES])
def test_constant_rows_in_every_design(launched, dtype, tuning, case):
    """Constant rows stay exact in every design (tiles of whole rows, chunks merged, a held row's
    segments merged): y is the bias, and the gradients as test_layer_norm_backward_of_constant_rows checks them."""
    shape, forward, backward, *_ = case
    n_rows, n_cols = shape
    x = constant_rows(n_rows, n_cols, "cpu", dtype).contiguous()
    weight, bias = params(n_cols, "cpu", dtype)
    tk_fn = tuned("layer_norm", SMALL if tuning == "SMALL" else HELD)
    assert torch.equal(tk_fn(x, weight, bias), bias.expand_as(x))
    inputs = [x.requires_grad_(), weight.requires_grad_(), bias.requires_grad_()]
    check_gradients(tk_fn, affine_after_layer_norm(n_cols, EPS["layer_norm"]), inputs, dtype)
    names = {name for name, *_ in launched}
    forward_kernel, *backward_kernels = kernel_names("layer_norm", forward, backward)
    meta = Meta(True, n_rows, n_cols, x.element_size(), x.element_size())
    if tuning == "HELD" and choose_backward_plan(meta, HELD).design == HELD_ROWS:
        # float64 keeps the two sweeps; so do framed rows of 101 columns, too few at once for their run here
        backward_kernels = ["layer_norm_backward_held_kernel"]
    assert (tuning, backward, dtype, n_cols) != ("HELD", "backward_long", torch.float32, 100) or backward_kernels == [
        "layer_norm_backward_held_kernel"
    ]  # the held case this test is for is reached
    assert names >= {forward_kernel, *backward_kernels}, names


def test_rows_that_fit_a_block_but_take_two_sweeps():
    """On an H100 plan: rows off 16-byte boundaries that no framed-tile rule names, in blocks past
    framed_max_block (2048 columns of 16-bit x, 4096 of 32-bit and of float64), take the framed two
    sweeps (a tile of whole rows is not framed); layer norm's pivoted rows of a 16384-column block take
    two sweeps too (one program an SM there); the others keep their tiles, and the interpreter keeps
    every tile."""

    def design(centered, n_cols, size, facts=H100):
        return choose_forward_plan(Meta(centered, 4096, n_cols, size, facts=facts), unframed).design

    unframed = dataclasses.replace(TUNING, framed_tiles=())
    assert TUNING.framed_max_block.cuda == ((2, 2048), (4, 4096), (8, 4096))
    assert TUNING.pivoted_two_sweep_blocks == (16384,)
    assert [design(c, 20001, s) for c in (True, False) for s in (2, 4)] == [LONG_ROWS] * 4
    for centered in (True, False):
        # 16-bit: odd rows of a 4096-column block and wider take two sweeps; 2048-column blocks keep tiles
        odd_16_bit = [design(centered, n, 2) for n in (1001, 1537, 2049, 4095, 5001, 8191)]
        assert odd_16_bit == [SHORT_ROWS] * 2 + [LONG_ROWS] * 4
        # 32-bit: from 8192-column blocks (8190 float32 columns: 8 bytes past a boundary a row)
        assert [design(centered, n, 4) for n in (1001, 3001, 4095, 4097, 8190)] == [SHORT_ROWS] * 3 + [LONG_ROWS] * 2
        assert design(centered, 4095, 8) == SHORT_ROWS and design(centered, 4097, 8) == LONG_ROWS  # float64
        # aligned rows keep their tiles (2056 bf16 = 257 runs), as does the interpreter
        assert design(centered, 2056, 2) == design(centered, 4100, 4) == SHORT_ROWS
        assert design(centered, 5001, 2, INTERPRETER) == SHORT_ROWS
    assert design(True, 12288, 2) == design(True, 16384, 2) == LONG_ROWS  # pivoted, a 16384-column block
    assert design(True, 12288, 4) == design(False, 12288, 2) == design(True, 32768, 2) == SHORT_ROWS
    assert choose_forward_plan(Meta(True, 4096, 12288, 2)).design == SHORT_ROWS  # the interpreter's blocks


def test_odd_rows_named_by_a_rule_take_a_framed_tile():
    """Tuning.framed_tiles names the forward rows off 16-byte boundaries that take a framed tile, by op,
    element size and block (measured on an H200, see Tuning): 16-bit layer norm in blocks of 1024-4096
    columns, RMS norm to 8192; float32 layer norm at 128 and 4096, RMS norm at 128.  On both sides of each
    block the others keep the tile or the sweeps; aligned rows and float64 are never framed."""

    def plan(centered, n_cols, size, n_rows=4096, facts=H100):
        return choose_forward_plan(Meta(centered, n_rows, n_cols, size, facts=facts))

    def design(*args, **kwargs):
        return plan(*args, **kwargs).design

    assert TUNING.framed_tiles == (
        OddRows(True, 2, (1024, 2048, 4096)),
        OddRows(False, 2, (1024, 2048, 4096, 8192)),
        OddRows(True, 4, (128, 4096)),
        OddRows(False, 4, (128,)),
    )
    widths = (511, 513, 1001, 1537, 2049, 4095, 4097, 8191, 8193)  # each side of 512-8192
    assert [design(True, n, 2) for n in widths] == [SHORT_ROWS] + [FRAMED_ROWS] * 5 + [LONG_ROWS] * 3
    assert [design(False, n, 2) for n in widths] == [SHORT_ROWS] + [FRAMED_ROWS] * 7 + [LONG_ROWS]
    float32_widths = (63, 65, 101, 127, 129, 2049, 4095, 4097)
    shorts, framed = [SHORT_ROWS], [FRAMED_ROWS]
    assert [design(True, n, 4) for n in float32_widths] == shorts + framed * 3 + shorts + framed * 2 + [LONG_ROWS]
    assert [design(False, n, 4) for n in float32_widths] == shorts + framed * 3 + shorts * 3 + [LONG_ROWS]
    # aligned rows (4096 and 1000 bf16, 4100 float32), float64 and float16 like bfloat16
    assert design(True, 4096, 2) == design(False, 1000, 2) == design(True, 4100, 4) == SHORT_ROWS
    assert design(True, 4095, 8) == SHORT_ROWS and design(True, 1001, 2) == FRAMED_ROWS
    # the tile: rows of one skew (8 rows apart for 1001 bf16 columns, 4 for 4095 float32 and 1002 bf16)
    framed = plan(True, 1001, 2)
    assert (framed.frame, framed.skews, framed.block_m, framed.block_n, framed.warps) == (8, 8, 4, 1024, 4)
    assert framed.grid == (8 * 128,) and framed.mean == PIVOT_MEAN and framed.affine_first
    assert (plan(True, 4095, 4).frame, plan(True, 4095, 4).skews) == (4, 4)
    assert (plan(False, 1002, 2).frame, plan(False, 1002, 2).skews) == (8, 4)
    assert plan(False, 7001, 2).block_m == 1 and plan(False, 7001, 2).warps == 8
    # few rows: fewer classes' rows than a tile's
    few = plan(False, 1001, 2, n_rows=3)
    assert few.grid == (8,) and few.block_m == 1


def _framing_everything(framed_tile):
    """TUNING with every odd row that fits a block in a framed tile of about `framed_tile` elements
    (the interpreter's), whatever its op, element size and block."""
    rules = tuple(OddRows(c, size, tuple(1 << b for b in range(17))) for c in (True, False) for size in (2, 4, 8))
    return dataclasses.replace(TUNING.with_cpu(framed_tile=framed_tile), framed_tiles=rules)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape, framed_tile",
    [
        ((37, 101), 512),  # tiles of 4 rows of one skew; 37 rows: the classes end in part-filled tiles
        ((5, 23), 32),  # fewer rows than skews (8 16-bit, 4 float32, 2 float64): some programs take none
        ((3, 4, 33), 1 << 14),  # a 3-d x; one tile a class
        ((9, 18), 64),  # 16-bit: 36 bytes a row, rows 4 apart share a skew; a row of two runs and its ends
    ],
    ids=str,
)
def test_framed_tiles_match_float64(launched, op, dtype, shape, framed_tile):
    """The framed tile (FRAMED_ROWS) in the interpreter, against float64: every dtype, rows each side of
    their runs' edges, tiles part-filled, weight and bias each present or not."""
    n = shape[-1]
    tuning = _framing_everything(framed_tile)
    meta = Meta(op == "layer_norm", math.prod(shape[:-1]), n, dtype.itemsize)
    plan = choose_forward_plan(meta, tuning)
    if not frame_run(n, 1, dtype.itemsize):
        pytest.skip(f"{n} {dtype} columns start every row on a 16-byte boundary")
    assert plan.design == FRAMED_ROWS and plan.skews > 1
    x = 3 + 2 * torch.randn(shape, dtype=dtype)
    # w and b beside x and after the reductions (AFFINE_FIRST; the interpreter's blocks are all beside x)
    late = dataclasses.replace(tuning, affine_first_max_block=0, pivoted_affine_first_max_block=0)
    for weight_on, bias_on, tuned_as in [(True, True, tuning), (True, False, late), (False, True, late),
                                         (False, False, tuning), (True, True, late)]:  # fmt: skip
        weight, bias = params(n, "cpu", dtype, weight_on, bias_on and op == "layer_norm")
        launched.clear()
        y = tuned(op, tuned_as)(x, weight, bias)
        assert_close(y, pytorch_norm(op)(x.double(), as64(weight), as64(bias)), dtype)
        assert [(name, grid) for name, grid, _ in launched] == [(f"{op}_forward_framed_kernel", plan.grid)]
        assert launched[0][2]["AFFINE_FIRST"] == (tuned_as is tuning)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_framed_tiles_of_constant_rows_and_strided_inputs(dtype):
    """Layer norm's framed tile on constant rows gives exactly the bias (the pivot's or _center's exact mean,
    over a row's two pieces); a transposed x and a strided weight give what their contiguous copies give."""
    tuning = _framing_everything(256)
    n = 101
    x = torch.full((20, n), 0.7, dtype=dtype)
    weight, bias = params(n, "cpu", dtype)
    assert torch.equal(tuned("layer_norm", tuning)(x, weight, bias), bias.expand_as(x))
    x = (3 + torch.randn(n, 20, dtype=dtype)).t()  # rows 20 apart in memory: the op copies them
    wide = torch.randn(2 * n, dtype=dtype)
    for op in ("layer_norm", "rms_norm"):
        b = bias if op == "layer_norm" else None
        got = tuned(op, tuning)(x, wide[::2], b)
        assert torch.equal(got, tuned(op, tuning)(x.contiguous(), wide[::2].contiguous(), b))
        assert_close(got, pytorch_norm(op)(x.double(), as64(wide[::2]), as64(b)), dtype)


@pytest.mark.parametrize("centered", [False, True], ids=["rms_norm", "layer_norm"])
def test_the_framed_forward_reads_and_writes_16_bytes_an_access(centered):
    """Built for sm_90 (no GPU needed): the framed tile of rows of 1001 bfloat16 columns loads x and
    stores y 16 bytes an access; the same rows in a tile (COL_MULTIPLE 1) move an element an access."""
    from triton.compiler import ASTSource

    plan = choose_forward_plan(Meta(centered, 4096, 1001, 2, facts=H100))
    assert plan.design == FRAMED_ROWS
    kernels = norm_launch.KERNELS[centered]
    accesses = {}
    for kernel in (kernels.forward_framed, kernels.forward):
        signature = {name: "*bf16" if name.endswith("_ptr") else "i32" for name in kernel.arg_names}
        signature["eps"] = "fp32"
        constants = dict(HAS_WEIGHT=True, HAS_BIAS=centered, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
                         AFFINE_FIRST=True, PIVOTED=plan.mean == PIVOT_MEAN)  # fmt: skip
        if kernel is kernels.forward_framed:
            constants.update(FRAME=plan.frame, SKEWS=plan.skews)
        else:
            constants.update(COL_MULTIPLE=1, PLAIN=False)
        signature.update({name: "constexpr" for name in constants})
        aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names) if name.endswith("_ptr")}
        launch = types.SimpleNamespace(warps=plan.warps, registers=255)  # the plan's warps, no register cap
        ptx = build_for_hopper(ASTSource(kernel, signature, constants, aligned), launch).asm["ptx"]
        accesses[kernel] = re.findall(r"\b(?:ld|st)\.global(?:\.[a-z0-9]+)*", ptx)
    framed, tiled = accesses[kernels.forward_framed], accesses[kernels.forward]
    assert "ld.global.v4.b32" in framed and "st.global.v4.b32" in framed, sorted(set(framed))
    assert "st.global.v4.b32" not in tiled and "st.global.b16" in tiled, sorted(set(tiled))


@pytest.mark.parametrize("centered", [False, True], ids=["rms_norm", "layer_norm"])
def test_the_framed_two_sweeps_backward_reads_and_writes_16_bytes_an_access(centered):
    """Built for sm_90 (no GPU needed): the long-row backward's two passes over rows of 50257 bfloat16
    columns, framed (FRAME 8), load x, dy and w and store dx 16 bytes an access; unframed (COL_MULTIPLE 1,
    before this design) no access is wider than an element."""
    from triton.compiler import ASTSource

    kernels = norm_launch.KERNELS[centered]
    two_sweeps = dataclasses.replace(TUNING, held_rows=ByKind(cuda=False, cpu=False))  # RMS norm holds these rows
    plan = choose_backward_plan(h100_meta(4096, 50257, 2, centered=centered), two_sweeps)
    assert (plan.design, plan.frame) == (LONG_ROWS, 8)
    accesses = {}
    for frame in (8, 0):
        for kernel in (kernels.backward_stats, kernels.backward_columns):
            signature = {name: "*bf16" if name.endswith("_ptr") else "i32" for name in kernel.arg_names}
            wider = {"stats_ptr": "*fp32", "dw_partial_ptr": "*fp32", "db_partial_ptr": "*fp32", "eps": "fp32"}
            signature.update({name: kind for name, kind in wider.items() if name in signature})
            constants = dict(HAS_WEIGHT=True, BLOCK_N=plan.block_n, COL_MULTIPLE=1, FRAME=frame)
            if kernel is kernels.backward_columns:
                constants.update(WEIGHT_GRAD=True, BIAS_GRAD=centered)
            signature.update({name: "constexpr" for name in constants})
            aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names) if name.endswith("_ptr")}
            launch = types.SimpleNamespace(warps=plan.warps, registers=255)
            ptx = build_for_hopper(ASTSource(kernel, signature, constants, aligned), launch).asm["ptx"]
            accesses[frame, kernel] = re.findall(r"\b(?:ld|st)\.global(?:\.[a-z0-9]+)*", ptx)
    # the statistics sweep's x, dy and w, each 16 bytes an access (w_stride is no multiple of 16 here, as at 50265
    # bf16 columns: the kernel tells the compiler that the shifted copies' rows are whole runs); layer norm's
    # sweep is built twice, the second for rows swept again about their mean (_pivoted_moments)
    sweeps = 2 if centered else 1
    assert accesses[8, kernels.backward_stats].count("ld.global.v4.b32") == 3 * sweeps, accesses[8, kernels.backward_stats]
    for kernel in (kernels.backward_stats, kernels.backward_columns):
        assert "ld.global.v4.b32" in accesses[8, kernel], accesses[8, kernel]
        assert not any(".v4" in access or ".v2" in access for access in accesses[0, kernel]), accesses[0, kernel]
    assert "st.global.v4.b32" in accesses[8, kernels.backward_columns]  # dx


@pytest.mark.parametrize("centered", [False, True], ids=["rms_norm", "layer_norm"])
def test_the_long_row_sweeps_build_for_hopper(centered):
    """Built for sm_90 (no GPU needed): the statistics sweeps of the long rows, forward and backward, framed
    and not.  The interpreter does not check that a loop keeps its variables' types; the GPU's compiler
    does (a loop reassigning a name the sums had bound, as float32, to an int32 count failed only there)."""
    from triton.compiler import ASTSource

    kernels = norm_launch.KERNELS[centered]
    for kernel, constants in [
        (kernels.forward_long_rows, dict(HAS_WEIGHT=True, HAS_BIAS=centered, BLOCK_M=1, BLOCK_N=4096, COL_MULTIPLE=1)),
        (kernels.backward_stats, dict(HAS_WEIGHT=True, BLOCK_N=4096, COL_MULTIPLE=1)),
    ]:
        for frame in (0, 8):
            signature = {name: "*bf16" if name.endswith("_ptr") else "i32" for name in kernel.arg_names}
            signature.update({name: kind for name, kind in {"stats_ptr": "*fp32", "eps": "fp32"}.items() if name in signature})
            built = dict(constants, FRAME=frame)
            signature.update({name: "constexpr" for name in built})
            ptx = build_for_hopper(ASTSource(kernel, signature, built), types.SimpleNamespace(warps=16, registers=255))
            assert "ld.global" in ptx.asm["ptx"], (kernel, frame)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype", DTYPES[:3])
@pytest.mark.parametrize("shape", [(37, 61), (5, 61), (40, 99), (2, 10, 50)], ids=str)
def test_framed_two_sweeps_backward_matches_float64(launched, op, dtype, shape):
    """The long-row backward framed, in the interpreter, against float64: rows off boundaries of 8 skews (61 and
    99 columns) and 4 (50, 16-bit), fewer rows than skews (5), groups of one skew holding several rows each, a
    mean far from 0 (layer norm), with a weight (and bias) and without; and a float32 grad of a 16-bit x."""
    n_rows, n_cols = math.prod(shape[:-1]), shape[-1]
    meta = Meta(op == "layer_norm", n_rows, n_cols, dtype.itemsize, dtype.itemsize)
    plan = choose_backward_plan(meta, SMALL)
    assert (plan.design, plan.frame) == (LONG_ROWS, 16 // dtype.itemsize), plan
    skews = plan.frame // math.gcd(n_cols, plan.frame)
    assert plan.grid[0] == n_rows if n_rows <= skews else plan.grid[0] % skews == 0, plan.grid
    tk_fn, torch_fn = tuned(op, SMALL), pytorch_norm(op)
    x = 100 + torch.randn(shape, dtype=dtype) if op == "layer_norm" else 3 + 2 * torch.randn(shape, dtype=dtype)
    weight, bias = params(n_cols, "cpu", dtype)
    for w, b in ((weight, bias), (None, None)):
        launched.clear()
        leaves = [x.requires_grad_(), None if w is None else w.requires_grad_(), None if b is None else b.requires_grad_()]
        check_gradients(tk_fn, torch_fn, leaves, dtype)
        frames = {constexprs.get("FRAME") for name, _, constexprs in launched if "_backward_" in name and "FRAME" in constexprs}
        assert frames == {plan.frame}, launched
    check_a_float32_grad(op, x, weight, bias, SMALL)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_framed_long_rows_with_chunks_no_longer_than_a_run(op):
    """Framed long rows swept in chunks of one run (8 bf16): the first chunk holds none of the row's
    whole runs, and its count of 0 must weigh it out of the merge, not divide by it (NaN)."""
    x = 3 + torch.randn(3, 65, dtype=torch.bfloat16)
    weight, bias = params(65, "cpu", torch.bfloat16)
    tuning = TUNING.with_cpu(max_block=64, chunk=8)
    assert choose_forward_plan(Meta(op == "layer_norm", 3, 65, 2), tuning).frame == 8
    got = tuned(op, tuning)(x, weight, bias)
    assert_close(got, pytorch_norm(op)(x.double(), as64(weight), as64(bias)), torch.bfloat16)


def test_the_held_rows_rule():
    """Backward rows past a block held across programs on CUDA, in 16 and 32 bits, by the first setup
    that takes a row (one warp a program up to 128 segments, then wider programs; layer norm's up to
    128 segments of 1024, then two sweeps, as for rows of no 16-element multiple) when its segments fit in the grid;
    float64 and the interpreter keep the two sweeps."""
    rms, ln = TUNING.rms_norm_held, TUNING.layer_norm_held

    def held(centered, n_rows, n_cols, widest, facts=H100):
        plan = choose_backward_plan(Meta(centered, n_rows, n_cols, widest, widest, facts))
        if plan.held is None:
            assert plan.design == LONG_ROWS
            return None
        assert plan.design == HELD_ROWS and plan.grid == (plan.held.rows_at_once * plan.held.n_segments,)
        return plan.held.setup, plan.held.segment, plan.held.n_segments, plan.held.rows_at_once

    (bf16, bf16_wide), (fp32, fp32_wide) = rms.for_16_bit, rms.for_32_bit
    assert (bf16.segment, bf16.max_segments, bf16_wide.segment) == (512, 128, 2048)  # the numbers below follow
    assert (fp32.segment, fp32.max_segments, fp32_wide.segment) == (512, 128, 1024)
    # 16-bit: 20 programs an SM (96 registers on 1 warp), 2640: 41 rows of 64 segments at once
    assert held(False, 4096, 32768, 2) == (bf16, 512, 64, 41)
    # 128 segments of 512 the last the one-warp setup takes; past that 2048 columns, 5 an SM
    assert held(False, 1024, 65536, 2) == (bf16, 512, 128, 20)
    assert held(False, 256, 65536 + 16, 2) == (bf16_wide, 2048, 33, 20)
    # float32: 16 an SM (128 registers on 1 warp), 2112: 88 rows of 24 segments (the last of 512)
    assert held(False, 8192, 12288, 4) == (fp32, 512, 24, 88)
    assert held(False, 5, 16384, 4) == (fp32, 512, 32, 5)  # fewer rows than the grid holds
    # the longest row held: 8 an SM of 2 warps, 1056 segments of 1024; longer: two sweeps
    assert held(False, 2, 1056 * 1024, 4) == (fp32_wide, 1024, 1056, 1)
    assert held(False, 2, 1056 * 1024 + 1, 4) is None
    assert held(False, 4096, 32768, 8) is None  # float64
    # layer norm: the one-warp setup up to 128 segments, 12 an SM (160 registers), then two sweeps
    assert held(True, 4096, 32768, 2) == (ln.for_16_bit[0], 512, 64, 24)
    # past 128 segments of 512: 1024 columns on two warps, 6 an SM, up to 128 segments; then two sweeps
    assert held(True, 256, 65536 + 16, 2) == (ln.for_16_bit[1], 1024, 65, 12)
    assert held(True, 512, 131072, 4) == (ln.for_32_bit[1], 1024, 128, 6)
    assert held(True, 512, 131072 + 16, 2) is None
    assert held(True, 2000, 20000, 4) == (ln.for_32_bit[0], 512, 40, 39)
    # Rows of any length: 16-byte aligned with COL_MULTIPLE (20008), or framed (20001 float32 columns:
    # run 4; 50257 bfloat16 columns, GPT-2's vocabulary: run 8), the frame adding a segment where the
    # row's places pass one (50257 + 7 places), on the framed setups where the op has them, rows at once
    # a multiple of the run
    assert held(True, 2000, 20008, 4) == (ln.for_32_bit[0], 512, 40, 39)
    assert held(False, 2000, 20001, 4) == (rms.framed_32_bit[0], 512, 40, 36)  # 12 an SM: 39 -> 36
    # layer norm's framed setups stop at 64 segments (version 57): past them, the framed two sweeps
    assert held(True, 4096, 32761, 2) == (ln.framed_16_bit[0], 512, 64, 24)  # 32761 + 7 places: 64 segments
    assert held(True, 4096, 32763, 2) is None and held(True, 4096, 50257, 2) is None  # 65 and 99
    assert held(True, 2000, 20001, 4) == (ln.framed_32_bit[0], 512, 40, 36)
    assert held(True, 2000, 32765, 4) == (ln.framed_32_bit[0], 512, 64, 24)  # 32765 + 3 places
    assert held(True, 2000, 32767, 4) is None
    assert choose_backward_plan(Meta(True, 4096, 50257, 2, 2, H100)).frame == 8
    assert held(False, 4096, 50257, 2) == (rms.framed_16_bit[0], 512, 99, 16)  # 16 an SM: 21 -> 16
    assert held(False, 4096, 50260, 2) == (rms.framed_16_bit[0], 512, 99, 20)  # 4 mod 8: two rows are whole runs
    # A setup's segment cap counts a framed row's places (65535 + 7 bf16: 129 segments of 512, past the cap)
    assert held(False, 4096, 65535, 2)[0] == rms.framed_16_bit[1]
    # RMS norm's rows no framed setup fits at once are held as before version 54, unframed (150001 bf16:
    # 74 segments of 2048, 4 programs an SM fit 7 rows at once, not 8); layer norm's take two sweeps
    plan = choose_backward_plan(Meta(False, 4096, 150001, 2, 2, H100))
    assert plan.design == HELD_ROWS and plan.held.frame == 0 and plan.held.setup == bf16_wide
    for centered, n_cols, widest, frame in ((True, 20001, 2, 8), (False, 20001, 4, 4), (True, 20008, 4, 0)):
        assert choose_backward_plan(Meta(centered, 4096, n_cols, widest, widest, H100)).held.frame == frame
    assert held(False, 4, 70016, 2, INTERPRETER) is None  # off in the interpreter, unless a tuning turns it on
    assert choose_backward_plan(Meta(False, 4, 100, 2, 2), SMALL).design == LONG_ROWS
    assert choose_backward_plan(Meta(False, 4, 100, 2, 2), HELD).design == HELD_ROWS


def test_short_rows_off_boundaries_held_in_the_backward():
    """On an H100 plan: backward rows off 16-byte boundaries that fit a block are held framed where
    Tuning.held_short_rows names their op, widest element size and block (16-bit: blocks of 4096 and
    8192 columns, and of 1024 from 2048 rows; not 2048, whose tiles run two an SM; RMS norm float32
    from 4096, layer norm float32 at 8192); aligned rows, other blocks, float64 and the interpreter
    keep their tiles."""

    def plan(centered, n_cols, widest, n_rows=4096, facts=H100):
        return choose_backward_plan(Meta(centered, n_rows, n_cols, widest, widest, facts))

    def design(centered, n_cols, widest, **kw):
        return plan(centered, n_cols, widest, **kw).design

    assert TUNING.held_short_rows == (
        OddRows(True, 2, (4096, 8192)),
        OddRows(False, 2, (4096, 8192)),
        OddRows(True, 2, (1024,), min_rows=2048),
        OddRows(False, 2, (1024,), min_rows=2048),
        OddRows(True, 4, (8192,)),
        OddRows(False, 4, (4096, 8192)),
    )
    for centered in (True, False):
        assert [design(centered, n, 2) for n in (1001, 1537, 2049, 4095, 5001, 8191)] == [
            HELD_ROWS, SHORT_ROWS, HELD_ROWS, HELD_ROWS, HELD_ROWS, HELD_ROWS,
        ]  # fmt: skip
        assert [design(centered, n, 2) for n in (1000, 2056, 4104, 8184)] == [SHORT_ROWS] * 4  # aligned
        assert design(centered, 513, 2) == HELD_ROWS and design(centered, 511, 2) == SHORT_ROWS  # blocks of 1024, 512
        # 1024-column blocks from 2048 rows; wider blocks at any count
        assert design(centered, 1001, 2, n_rows=2048) == HELD_ROWS
        assert design(centered, 1001, 2, n_rows=2047) == SHORT_ROWS
        assert design(centered, 3001, 2, n_rows=64) == design(centered, 8191, 2, n_rows=100) == HELD_ROWS
    # float32: RMS norm from a 4096-column block, layer norm at 8192
    assert [design(False, n, 4) for n in (1001, 1537, 3001, 5001)] == [SHORT_ROWS, SHORT_ROWS, HELD_ROWS, HELD_ROWS]
    assert [design(True, n, 4) for n in (1001, 3001, 5001, 8191)] == [SHORT_ROWS, SHORT_ROWS, HELD_ROWS, HELD_ROWS]
    assert design(True, 4095, 8) == design(False, 3001, 8) == SHORT_ROWS  # float64 has no held setups
    assert design(True, 5001, 2, facts=INTERPRETER) == SHORT_ROWS  # held rows are off there
    # A held short row is framed and takes the framed setup; 4096 rows of 5001 bf16 columns: 10 segments of
    # 512 places (5001 + 7), 12 programs an SM: 158 rows of the grid's 1584, down to a multiple of the run
    held = plan(True, 5001, 2).held
    framed_setup = TUNING.layer_norm_held.framed_16_bit[0]
    assert (held.frame, held.setup, held.n_segments, held.rows_at_once) == (8, framed_setup, 10, 152)
    # A grad of float32 for a 16-bit x: the widest input is 32-bit; layer norm's rule there is 8192 only
    assert choose_backward_plan(Meta(True, 4096, 3001, 2, 4, H100)).design == SHORT_ROWS
    assert choose_backward_plan(Meta(False, 4096, 3001, 2, 4, H100)).design == HELD_ROWS
    # Rows no framed setup fits fall back to the tile: not to two sweeps, and in RMS norm not to its unframed
    # held rows (which long rows fall back to), an element an access as the tile
    no_row_fits = (HeldNormSetup(512, 1, 168, 12, max_segments=4),)
    none_fit = dataclasses.replace(
        TUNING,
        layer_norm_held=dataclasses.replace(TUNING.layer_norm_held, framed_16_bit=no_row_fits),
        rms_norm_held=dataclasses.replace(TUNING.rms_norm_held, framed_16_bit=no_row_fits),
    )
    for centered in (True, False):
        assert choose_backward_plan(Meta(centered, 4096, 5001, 2, 2, H100), none_fit).design == SHORT_ROWS
    long_rows = choose_backward_plan(Meta(False, 4096, 20001, 2, 2, H100), none_fit)
    assert long_rows.design == HELD_ROWS and long_rows.held.frame == 0  # long rows do fall back, unframed


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_short_rows_held_by_the_rule_match_float64(launched, op):
    """Rows that fit a block, off 16-byte boundaries (101 bf16 columns), held through the rule of
    Tuning.held_short_rows in the interpreter: the held kernel runs, and the gradients match float64."""
    rule = OddRows(op == "layer_norm", 2, (128,))
    tuning = dataclasses.replace(TUNING.with_cpu(held_rows=True), held_short_rows=(rule,), cpu_programs=32)
    meta = Meta(op == "layer_norm", 24, 101, 2, 2)
    assert choose_backward_plan(meta, tuning).design == HELD_ROWS
    assert choose_backward_plan(meta, TUNING.with_cpu(held_rows=True)).design == SHORT_ROWS
    x = 5 + torch.randn(24, 101, dtype=torch.bfloat16)
    weight, bias = params(101, "cpu", torch.bfloat16)
    bias = bias if op == "layer_norm" else None
    leaves = [x.requires_grad_(), weight.requires_grad_(), None if bias is None else bias.requires_grad_()]
    launched.clear()
    check_gradients(tuned(op, tuning), pytorch_norm(op), leaves, torch.bfloat16)
    names = [name for name, *_ in launched]
    assert f"{op}_backward_held_kernel" in names and f"{op}_backward_kernel" not in names, names


def test_the_held_plan_follows_the_call():
    """What the held kernel is launched with comes from its setup and the call: layer norm publishes
    two words a segment and takes FULL (rows of whole segments, moments unmasked), RMS norm one word
    and no FULL; the kernel overlaps its scratch fill where the call may (Meta.overlap_fill)."""
    ln = choose_backward_plan(h100_meta(4096, 32768, 2)).held
    assert (ln.words, ln.setup.rows_ahead, ln.overlap_fill, ln.max_spins) == (2 * 64, 2, False, 1 << 16)
    assert ln.constexprs() == {"SEGMENT": 512, "SEGMENTS_BLOCK": 64, "ROWS_AHEAD": 2, "FULL": True, "FRAME": 0}
    assert choose_backward_plan(h100_meta(4096, 32768 - 16, 2)).held.constexprs()["FULL"] is False
    meta = dataclasses.replace(h100_meta(4096, 32768, 2, centered=False), overlap_fill=True)
    rms = choose_backward_plan(meta).held
    assert (rms.words, rms.setup.rows_ahead, rms.overlap_fill) == (64, 1, True)
    assert rms.constexprs() == {"SEGMENT": 512, "SEGMENTS_BLOCK": 64, "ROWS_AHEAD": 1, "FRAME": 0}
    # Rows off 16-byte boundaries: framed, never FULL (a row's places start up to a run before it)
    framed = choose_backward_plan(h100_meta(4096, 63 * 512 + 1, 2)).held  # 64 segments: layer norm holds it
    assert framed.constexprs()["FRAME"] == 8 and framed.constexprs()["FULL"] is False


def test_a_held_setup_loads_one_or_two_rows_ahead():
    with pytest.raises(ValueError, match="rows_ahead is 1 or 2"):
        HeldNormSetup(512, 1, 160, 12, rows_ahead=3)
    assert HeldNormSetup(512, 1, 160, 12, rows_ahead=2).rows_ahead == 2


def test_an_op_without_held_setups_keeps_two_sweeps():
    """The held design is an op's where its tuning names setups for it: without them, its long rows
    take the two sweeps (the other op's are held as before)."""
    tuning = dataclasses.replace(TUNING, rms_norm_held=HeldSetups())
    assert choose_backward_plan(h100_meta(4096, 32768, 2, centered=False), tuning).design == LONG_ROWS
    assert choose_backward_plan(h100_meta(4096, 32768, 2, centered=False)).design == HELD_ROWS
    assert choose_backward_plan(h100_meta(4096, 32768, 2), tuning).design == HELD_ROWS


def test_a_tuning_shrinks_the_interpreters_constants_only():
    small = TUNING.with_cpu(max_block=64, column_sum_block=(2, 8))
    assert (small.max_block, small.column_sum_block) == (ByKind(32768, 64), ByKind((256, 8), (2, 8)))
    assert dataclasses.replace(small, max_block=TUNING.max_block, column_sum_block=TUNING.column_sum_block) == TUNING
    with pytest.raises(TypeError, match="not per-kind fields"):
        TUNING.with_cpu(cpu_programs=8)
    # framed_max_block holds (element size, block) pairs: a bare block is refused by name, not deep in a plan
    with pytest.raises(TypeError, match=r"framed_max_block takes a tuple like \(\), not 4096"):
        TUNING.with_cpu(framed_max_block=4096)
    assert TUNING.with_cpu(framed_max_block=((2, 64),)).framed_max_block.cpu == ((2, 64),)


def _backward_planned(op, grad, x, weight, bias, tuning=TUNING, **meta_changes):
    """The op's backward as an eager call runs it (kernels launched directly), through its plan,
    with `meta_changes` made to the call's Meta: (dx, dweight, dbias or None)."""
    centered, n_cols = op == "layer_norm", x.shape[-1]

    def body():
        meta = dataclasses.replace(describe_backward(centered, grad, x, n_cols), **meta_changes)
        plan = choose_backward_plan(meta, tuning)
        weight_grad, bias_grad = weight is not None, bias is not None and centered
        return norm_launch.run_backward(plan, grad, x, weight, EPS[op], weight_grad, bias_grad, (n_cols,))

    return run_direct(body, (), {})


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_norm_held_rows_on_the_gpu(launched, op, dtype):
    """Rows held across programs on the GPU: rows not cut evenly by segments and rows of whole ones
    (layer norm's moments unmasked), rows not cut evenly by rounds, both setups of each op, rows off
    16-byte boundaries held framed (20001 and 70001 columns; 20004 in 16 bits; rows that fit a block),
    against float64; and a
    run in which no program waits (each computes its rows' partials itself) gives the same bits as the
    run in which they read each other's words, as does a run in which the kernel starts only after its
    scratch fill ends."""
    torch_fn = pytorch_norm(op)
    # and rows that fit a block, off 16-byte boundaries, held by Tuning.held_short_rows: 3001 (RMS norm) and
    # 5001 (layer norm) columns in every dtype here
    rms_cases = [(1000, 20001), (40, 70001), (999, 20004), (999, 3001)]
    # 3, 4: 1024 a program
    ln_cases = [(1000, 20000), (600, 20480), (40, 70016), (30, 131072), (1000, 20001), (999, 20004), (999, 5001)]
    for n_rows, n_cols in rms_cases if op == "rms_norm" else ln_cases:
        x = (100 if op == "layer_norm" else 3) + torch.randn(n_rows, n_cols, device="cuda", dtype=dtype)
        grad = torch.randn_like(x)
        weight, bias = params(n_cols, "cuda", dtype)
        bias = bias if op == "layer_norm" else None
        launched.clear()
        grads = _op_backward(op, grad, x, weight, bias)
        assert [name for name, *_ in launched] == [f"{op}_backward_held_kernel", "column_sum_kernel"]
        overlapped = can_overlap_fill(device_facts(x.device))  # the eager call's kernel starts during its fill
        assert launched[0][2]["OVERLAPPED"] == overlapped
        leaves = [leaf64(x), leaf64(weight), None if bias is None else leaf64(bias)]
        torch_fn(*leaves).backward(grad.double())
        for got, leaf in zip(grads, leaves):
            assert_close(got, leaf.grad, dtype)
        alone = _backward_planned(op, grad, x, weight, bias, dataclasses.replace(TUNING, max_spins=ByKind(0, 0)))
        assert all(torch.equal(a, b) for a, b in zip(alone, grads))
        after_fill = _backward_planned(op, grad, x, weight, bias, overlap_fill=False)
        assert not launched[-2][2]["OVERLAPPED"]
        assert all(torch.equal(a, b) for a, b in zip(after_fill, grads))


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_norm_framed_two_sweeps_on_the_gpu(launched, op, dtype):
    """The long-row backward framed on the GPU against float64: layer norm's rows off 16-byte boundaries past its
    framed setups' 64 segments (32769, 50257 and 70001 columns; fewer rows than skews; a mean far from 0), and
    RMS norm's with held rows turned off (its plan holds them); with a weight and without."""
    tuning = TUNING if op == "layer_norm" else dataclasses.replace(TUNING, held_rows=ByKind(cuda=False, cpu=False))
    torch_fn = pytorch_norm(op)
    for n_rows, n_cols in [(1000, 32769), (257, 50257), (5, 50257), (40, 70001)]:
        x = (100 if op == "layer_norm" else 3) + torch.randn(n_rows, n_cols, device="cuda", dtype=dtype)
        grad = torch.randn_like(x)
        weight, bias = params(n_cols, "cuda", dtype)
        bias = bias if op == "layer_norm" else None
        for w, b in ((weight, bias), (None, None)):
            launched.clear()
            grads = _backward(op, grad, x, w, w is not None, b is not None, tuning)
            frames = [constexprs.get("FRAME") for name, _, constexprs in launched if "FRAME" in constexprs]
            assert frames == [16 // dtype.itemsize] * 2, launched  # the statistics sweep and the columns, framed
            leaves = [leaf64(x), None if w is None else leaf64(w), None if b is None else leaf64(b)]
            torch_fn(*leaves).backward(grad.double())
            for got, leaf in zip(grads, leaves):
                if leaf is not None:
                    assert_close(got, leaf.grad, dtype)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_framed_two_sweeps_with_chunks_shorter_than_a_run(op):
    """Chunks of 4 columns, half a bf16 run: framed, a chunk wholly below the first whole run counts no
    elements, and a negative count in the moments' merge gave NaN (the forward's sweep and the backward's
    statistics sweep, layer norm; found by review), against float64 both ways."""
    tuning = dataclasses.replace(SMALL, chunk=ByKind(cuda=4096, cpu=4))
    x = (torch.randn(8, 277) * 2 + 3).to(torch.bfloat16)
    weight, bias = params(277, "cpu", torch.bfloat16)
    assert choose_backward_plan(Meta(op == "layer_norm", 8, 277, 2, 2), tuning).frame == 8
    leaves = [x.requires_grad_(), weight.requires_grad_(), bias.requires_grad_()]
    check_gradients(tuned(op, tuning), pytorch_norm(op), leaves, torch.bfloat16)


def test_framed_two_sweeps_of_a_normalized_shape_of_two_dims():
    """Layer norm over normalized_shape (5, 13) (65 bfloat16 columns a row, off 16-byte boundaries) in the framed
    two sweeps: the weight (5, 13) is shifted as one row of 65 (padding its last dim alone read past the copies:
    the fuzz's segfault), against float64."""
    x = (torch.randn(6, 5, 13) * 2 + 3).to(torch.bfloat16)
    weight, grad = torch.randn(5, 13).to(torch.bfloat16), torch.randn(6, 5, 13).to(torch.bfloat16)
    assert choose_backward_plan(Meta(True, 6, 65, 2, 2), SMALL).frame == 8
    dx, dw, db = layer_norm_entry.backward(grad, x, [5, 13], weight, 1e-5, True, True, tuning=SMALL)
    leaves = [leaf64(x), leaf64(weight), leaf64(torch.zeros(5, 13))]
    F.layer_norm(leaves[0], [5, 13], leaves[1], leaves[2], 1e-5).backward(grad.double())
    for got, leaf in zip((dx, dw, db), leaves):
        assert got.shape == leaf.shape
        assert_close(got, leaf.grad, torch.bfloat16)


def test_shifted_weights_hold_each_skews_columns():
    """launch.py's shifted_weights: the row frame - 1 - skew holds column p - skew at place p, 0 off w's ends;
    rows whole runs, every one starting on a 16-byte boundary."""
    for n, frame, dtype in [(11, 4, torch.float32), (61, 8, torch.bfloat16), (50257, 8, torch.bfloat16)]:
        w = torch.arange(1, n + 1).to(dtype)
        copies, stride = norm_launch.shifted_weights(w, frame)
        assert copies.is_contiguous() and copies.shape == (frame, stride) and (stride * copies.element_size()) % 16 == 0
        assert stride >= n + frame - 1  # the places of a row of any skew
        assert torch.equal(norm_launch.shifted_weights(w.reshape(1, n), frame)[0], copies)  # w of any shape: one row
        for skew in range(frame):
            columns = torch.arange(stride) - skew
            expected = torch.where((columns >= 0) & (columns < n), columns + 1, 0).to(dtype)
            assert torch.equal(copies[frame - 1 - skew], expected), skew


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_norm_framed_tiles_on_the_gpu(launched, op, dtype):
    """The forward's framed tile on the GPU, by the shipped rules, against float64: rows of every width
    class the rules name (blocks of 128 float32 columns, 1024-8192 16-bit ones, 4096 float32 ones),
    rows fewer than a tile, rows not a multiple of the skews, and a layer norm of constant rows (exactly
    the bias)."""
    shapes = {2: [(4096, 1001), (999, 1537), (37, 3001), (5, 4095), (1000, 6001)], 4: [(999, 101), (1000, 4095)]}
    cases = [(r, c) for r, c in shapes[dtype.itemsize] if _named(op, c, dtype)]
    assert cases, "the rules name no shape of this test"
    for n_rows, n_cols in cases:
        x = (100 if op == "layer_norm" else 3) + torch.randn(n_rows, n_cols, device="cuda", dtype=dtype)
        weight, bias = params(n_cols, "cuda", dtype)
        bias = bias if op == "layer_norm" else None
        launched.clear()
        y = tuned(op, TUNING)(x, weight, bias)
        assert [name for name, *_ in launched] == [f"{op}_forward_framed_kernel"], (n_rows, n_cols)
        assert_close(y, pytorch_norm(op)(x.double(), as64(weight), as64(bias)), dtype)
        if op == "layer_norm":
            constant = torch.full_like(x, 0.7)
            assert torch.equal(tuned(op, TUNING)(constant, weight, bias), bias.expand_as(x))


def _named(op, n_cols, dtype):
    """Whether the shipped rules put rows of n_cols in a framed tile on this GPU."""
    meta = Meta(op == "layer_norm", 4096, n_cols, dtype.itemsize, facts=device_facts(torch.device("cuda")))
    return choose_forward_plan(meta).design == FRAMED_ROWS


def _layer_norm_backward_tile(widest, block_n, n_rows):
    """(tile bytes, programs an SM) of layer norm's short-row backward on the GPU: 16 KB, one an SM, but for
    Tuning.backward_exceptions: 16-bit rows of a 1024-column block a quarter, four an SM; of a 2048-column
    block a quarter, four an SM, from 2048 rows (layer norm's only), else half, two an SM; of a 4096-column
    block half, two an SM, from 2048 rows; float32 rows of a 1024-column block a quarter, four an SM, from
    2048 rows."""
    many = n_rows >= 2048
    if (widest, block_n) == (2, 1024) or (widest, block_n, many) in ((2, 2048, True), (4, 1024, True)):
        return 4096, 4
    if (widest, block_n) == (2, 2048) or (widest, block_n, many) == (2, 4096, True):
        return 8192, 2
    return 16384, 1


@pytest.mark.parametrize("centered", [False, True], ids=["rms_norm", "layer_norm"])
def test_the_short_row_backward_tiles_fit_their_programs_an_sm(centered):
    """Built for sm_90 (no GPU needed): each short-row backward tile the H200's plan gives 16-bit and float32 rows
    at hidden sizes holds at most the registers that leave room for its programs an SM (65536 an SM), and spills
    nothing.  Over them, fewer programs share an SM than the plan counts on: layer norm's exception tiles with one
    reduction took 148-159 registers on Triton 3.6 and ran 3-16% slower on the H200, and the plain mean's overflow
    branch (_row_means) took them to 139 and 154 on Triton 3.9 (perf-notes version 63).  Built with the installed
    Triton, CI's 3.9, where one reduction also fits those two tiles: this guards the landed code on that Triton
    (the GPU's 3.6 was checked apart).  Where a tile runs one program an SM the bound is ptxas's own cap, and the
    spills are what can fail."""
    from ptx_checks import registers_and_spills
    from triton.compiler import ASTSource

    from ops.runtime import H200

    kernels = norm_launch.KERNELS[centered]
    tiles = {}
    for size in (2, 4):
        for n_rows, n_cols in ((4095, 768), (4095, 1600), (4095, 2560), (4095, 5120), (1000, 1280), (1000, 3584)):
            meta = Meta(centered, n_rows, n_cols, size, size, H200)
            plan = choose_backward_plan(meta)
            tiles[(size, *backward_tile(meta))] = plan
    # blocks of 1024 to 8192 columns, two element sizes; 1000 rows: two rows a tile of 2048 and of 4096 columns
    assert len(tiles) == (10 if centered else 9), sorted(tiles)  # RMS norm has no tile of one row of 2048
    for (size, block_m, block_n, warps, per_sm), plan in tiles.items():
        kernel = kernels.backward
        pointer = "*bf16" if size == 2 else "*fp32"
        signature = {name: pointer for name in ("dy_ptr", "x_ptr", "w_ptr", "dx_ptr")}
        signature.update(dw_partial_ptr="*fp32", db_partial_ptr="*fp32", n_rows="i32", n_cols="i32", eps="fp32")
        constants = dict(HAS_WEIGHT=True, WEIGHT_GRAD=True, BIAS_GRAD=centered, BLOCK_M=block_m, BLOCK_N=block_n,
                         LOAD_AHEAD=plan.load_ahead, COL_MULTIPLE=plan.col_multiple, PLAIN=plan.mean == PLAIN_MEAN,
                         ONE_REDUCTION=plan.one_reduction)  # fmt: skip
        signature.update({name: "constexpr" for name in constants})
        aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names) if name.endswith("_ptr")}
        launch = types.SimpleNamespace(warps=warps, registers=None)  # as launched: no cap but the warps' own
        built = build_for_hopper(ASTSource(kernel, signature, constants, aligned), launch)
        registers, spilled = registers_and_spills(built)
        assert registers <= min(255, 65536 // (per_sm * warps * 32)) and spilled == 0, (size, block_n, registers)


@pytest.mark.parametrize("sms", [0, 132])
@pytest.mark.parametrize("widest", [2, 4, 8])
def test_the_short_row_backward_tile_rule(widest, sms):
    """About 16 KB of the widest input a tile (whole rows), 32 bytes of it a thread, one program an
    SM, but for the exceptions (_layer_norm_backward_tile).  With fewer tiles than programs the tile is
    halved, not below 8 KB.  A tile of at most load_ahead_bytes loads ahead."""
    for n_rows in [1, 3, 100, 1000, 2047, 2048, 1 << 20]:  # 2047 and 2048: the exceptions' row floors
        for n_cols in [1, 7, 100, 1000, 1536, 2048, 4096, 8192]:
            meta = h100_meta(n_rows, n_cols, widest, sm_count=sms)
            block_m, block_n, warps, per_sm = backward_tile(meta)
            assert block_n == 1 << (n_cols - 1).bit_length() and block_m & (block_m - 1) == 0
            tile_bytes, programs_per_sm = _layer_norm_backward_tile(widest, block_n, n_rows)
            assert per_sm == programs_per_sm
            assert block_m == 1 or block_m * block_n * widest <= tile_bytes
            assert block_m < 2 * n_rows  # no tile of padding rows only
            rule = max(1, min(tile_bytes // (block_n * widest), 1 << (n_rows - 1).bit_length()))
            tiles = -(-n_rows // block_m)
            if block_m < rule:  # halved: there were fewer tiles than programs, and not below 8 KB
                assert -(-n_rows // (2 * block_m)) < sms * per_sm and block_m * block_n * widest >= 8192
            if block_m > 1 and block_m * block_n * widest > 8192:
                assert tiles >= sms * per_sm  # not halved: enough tiles
            assert warps == min(max(block_m * block_n * widest // (32 * 32), 1), 32)
            plan = choose_backward_plan(meta)
            if plan.design != SHORT_ROWS:  # float64 rows past half the block: two registers a value
                assert (widest, n_cols) == (8, 8192) and plan.design == LONG_ROWS
                continue
            assert (plan.block_m, plan.block_n, plan.warps) == (block_m, block_n, warps)
            assert plan.load_ahead == (block_m * block_n * widest <= 16384)
    cases = [(1 << 20, 4096, 2), (1 << 20, 4096, 4), (1 << 20, 2048, 2), (1 << 20, 8192, 4), (1024, 1024, 2), (1024, 1024, 4),
             (2047, 3584, 2), (2048, 3584, 2)]  # fmt: skip
    plans = [choose_backward_plan(h100_meta(n_rows, n_cols, widest)) for n_rows, n_cols, widest in cases]
    assert [(p.block_m, p.block_n, p.warps, p.grid) for p in plans] == [
        (1, 4096, 8, (264,)),  # two an SM
        (1, 4096, 16, (132,)),
        (1, 2048, 4, (528,)),  # layer norm's 2048-column exception: one row, four an SM
        (1, 8192, 32, (132,)),
        (2, 1024, 4, (128,)),  # the 1024-column exception: 512 tiles of 2 rows; programs of at least 8 rows
        (4, 1024, 16, (128,)),  # 256 tiles of 4 rows: too few rows for the float32 1024-column exception
        (2, 4096, 16, (132,)),  # too few rows for the 4096-column exception: the rule's tile
        (1, 4096, 8, (256,)),  # the exception, two an SM: 264 programs wanted, programs of at least 8 rows
    ]
    assert [p.load_ahead for p in plans] == [True, True, True, False, True, True, True, True]  # float32 8192: after the store
    rms = choose_backward_plan(h100_meta(1 << 20, 2048, 2, centered=False))
    assert (rms.block_m, rms.block_n, rms.warps, rms.grid) == (2, 2048, 8, (264,))  # RMS norm: two rows, two an SM


# ------------------------------------------------------------ PyTorch side


def opcheck_cases(device):
    def t(*shape, grad=False, dtype=torch.float32):
        return torch.randn(shape, device=device, dtype=dtype, requires_grad=grad)

    return [
        (torch.ops.tk.rms_norm.default, (t(5, 7, grad=True), t(7, grad=True), 1e-6), {}),
        (torch.ops.tk.rms_norm.default, (t(2, 3, 8, dtype=torch.bfloat16), None, None), {}),
        (torch.ops.tk.rms_norm_backward.default, (t(5, 7), t(5, 7), t(7), 1e-6, True), {}),
        (torch.ops.tk.rms_norm_backward.default, (t(5, 7), t(5, 7), None, None, False), {}),
        (torch.ops.tk.layer_norm.default, (t(3, 4, 5, grad=True), [4, 5], t(4, 5, grad=True), t(4, 5, grad=True), 1e-5), {}),
        (torch.ops.tk.layer_norm.default, (t(6, 5, grad=True), [5], None, t(5, grad=True)), {}),
        (torch.ops.tk.layer_norm_backward.default, (t(3, 4, 5), t(3, 4, 5), [4, 5], t(4, 5), 1e-5, True, True), {}),
        (torch.ops.tk.layer_norm_backward.default, (t(6, 5), t(6, 5), [5], None, 1e-5, False, True), {}),
        # a float32 result of a 16-bit x, and its float32 gradient
        (torch.ops.tk.rms_norm.default, (t(5, 7, grad=True, dtype=torch.bfloat16), t(7, grad=True), 1e-6, torch.float32), {}),
        (
            torch.ops.tk.layer_norm.default,
            (t(3, 4, 5, grad=True, dtype=torch.float16), [4, 5], t(4, 5, grad=True), t(4, 5, grad=True)),
            {"dtype": torch.float32},
        ),
        (torch.ops.tk.rms_norm_backward.default, (t(5, 7), t(5, 7, dtype=torch.bfloat16), t(7), 1e-6, True), {}),
        (
            torch.ops.tk.layer_norm_backward.default,
            (t(6, 5), t(6, 5, dtype=torch.float16), [5], t(5, dtype=torch.float16), 1e-5, True, True),
            {},
        ),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for op, args, kwargs in opcheck_cases(device):
        torch.library.opcheck(op, args, kwargs)


ERROR_CASES = [
    ("rms int", lambda: torch.ops.tk.rms_norm(torch.ones(3, 4, dtype=torch.int64), None, None), TypeError, "x has dtype int64"),
    ("rms 0-d", lambda: torch.ops.tk.rms_norm(torch.tensor(1.0), None, None), ValueError, "at least one dim"),
    (
        "rms weight size",
        lambda: torch.ops.tk.rms_norm(torch.ones(3, 4), torch.ones(5), None),
        ValueError,
        r"weight has shape \(5,\), expected \(4,\)",
    ),
    (
        "rms weight rank",
        lambda: torch.ops.tk.rms_norm(torch.ones(3, 4), torch.ones(1, 4), None),
        ValueError,
        r"weight has shape \(1, 4\), expected \(4,\)",
    ),
    (
        "rms weight dtype",
        lambda: torch.ops.tk.rms_norm(torch.ones(3, 4), torch.ones(4, dtype=torch.float16), None),
        TypeError,
        "x has dtype torch.float32, so weight must have dtype torch.float32, not torch.float16",
    ),
    (
        "rms weight of the other 16-bit dtype",
        lambda: torch.ops.tk.rms_norm(torch.ones(3, 4, dtype=torch.bfloat16), torch.ones(4, dtype=torch.float16), None),
        TypeError,
        "x has dtype torch.bfloat16, so weight must have dtype torch.bfloat16 or torch.float32, not torch.float16",
    ),
    (
        "rms weight device",
        lambda: torch.ops.tk.rms_norm(torch.ones(3, 4), torch.ones(4, device="meta"), None),
        ValueError,
        "x is on cpu but weight is on meta",
    ),
    (
        "rms_backward shapes",
        lambda: torch.ops.tk.rms_norm_backward(torch.ones(3, 4), torch.ones(4, 3), None, None, False),
        ValueError,
        "grad has shape",
    ),
    (
        "rms_backward weight_grad",
        lambda: torch.ops.tk.rms_norm_backward(torch.ones(3, 4), torch.ones(3, 4), None, None, True),
        ValueError,
        "weight_grad=True needs the weight",
    ),
    (
        "ln bool",
        lambda: torch.ops.tk.layer_norm(torch.ones(3, 4, dtype=torch.bool), [4], None, None, 1e-5),
        TypeError,
        "x has dtype bool",
    ),
    (
        "ln shape",
        lambda: torch.ops.tk.layer_norm(torch.ones(3, 4), [3], None, None, 1e-5),
        ValueError,
        r"normalized_shape \[3\] must be the trailing dims of x",
    ),
    (
        "ln shape too long",
        lambda: torch.ops.tk.layer_norm(torch.ones(4), [1, 4], None, None, 1e-5),
        ValueError,
        "must be the trailing dims",
    ),
    ("ln no dims", lambda: torch.ops.tk.layer_norm(torch.ones(3, 4), [], None, None, 1e-5), ValueError, "at least one dim"),
    (
        "ln bias shape",
        lambda: torch.ops.tk.layer_norm(torch.ones(2, 3, 4), [3, 4], None, torch.ones(12), 1e-5),
        ValueError,
        r"bias has shape \(12,\), expected \(3, 4\)",
    ),
    (
        "ln weight dtype",
        lambda: torch.ops.tk.layer_norm(torch.ones(3, 4), [4], torch.ones(4, dtype=torch.bfloat16), None, 1e-5),
        TypeError,
        "x has dtype torch.float32, so weight must have dtype torch.float32, not torch.bfloat16",
    ),
    (
        "ln weight and bias of two dtypes",
        lambda: torch.ops.tk.layer_norm(
            torch.ones(3, 4, dtype=torch.bfloat16), [4], torch.ones(4), torch.ones(4, dtype=torch.bfloat16), 1e-5
        ),
        TypeError,
        "bias has dtype torch.bfloat16 but weight has dtype torch.float32; give them one dtype",
    ),
    (
        "ln float32 bias, no weight, 16-bit x",
        lambda: torch.ops.tk.layer_norm(torch.ones(3, 4, dtype=torch.float16), [4], None, torch.ones(4), 1e-5),
        TypeError,
        "bias has dtype torch.float32 but there is no weight and x has dtype torch.float16",
    ),
    (
        "ln_backward dtypes",
        lambda: torch.ops.tk.layer_norm_backward(
            torch.ones(3, 4, dtype=torch.float16), torch.ones(3, 4), [4], None, 1e-5, False, False
        ),
        TypeError,
        "grad has dtype torch.float16 but x has dtype torch.float32",
    ),
    (
        "ln_backward grad wider than a result",
        lambda: torch.ops.tk.layer_norm_backward(
            torch.ones(3, 4, dtype=torch.float64), torch.ones(3, 4), [4], None, 1e-5, False, False
        ),
        TypeError,
        "grad has dtype torch.float64 but x has dtype torch.float32; a norm's result has x's dtype, or float32",
    ),
    (
        "rms_backward grad on another device",
        lambda: torch.ops.tk.rms_norm_backward(torch.ones(3, 4, device="meta"), torch.ones(3, 4), None, None, False),
        ValueError,
        "grad is on meta but x is on cpu",
    ),
    (
        "ln dtype narrower than x",
        lambda: torch.ops.tk.layer_norm(torch.ones(3, 4), [4], None, None, 1e-5, torch.bfloat16),
        TypeError,
        "dtype torch.bfloat16 is not supported for x of dtype torch.float32; a norm's result has x's dtype, or float32",
    ),
    (
        "rms dtype float64 of a 16-bit x",
        lambda: torch.ops.tk.rms_norm(torch.ones(3, 4, dtype=torch.float16), None, None, torch.float64),
        TypeError,
        "dtype torch.float64 is not supported for x of dtype torch.float16",
    ),
    (
        "rms integer dtype",
        lambda: torch.ops.tk.rms_norm(torch.ones(3, 4, dtype=torch.float16), None, None, torch.int32),
        TypeError,
        "dtype torch.int32 is not supported for x of dtype torch.float16",
    ),
    (
        "ln_backward weight_grad",
        lambda: torch.ops.tk.layer_norm_backward(torch.ones(3, 4), torch.ones(3, 4), [4], None, 1e-5, True, False),
        ValueError,
        "weight_grad=True needs the weight",
    ),
]


@error_cases(ERROR_CASES)
def test_bad_input_raises_a_clear_error(case):
    assert_raises_clearly(case)


@pytest.mark.gpu
def test_device_mismatch_on_cuda():
    with pytest.raises(ValueError, match="x is on cuda:0 but weight is on cpu"):
        torch.ops.tk.rms_norm(torch.ones(3, 4, device="cuda"), torch.ones(4), None)
    with pytest.raises(ValueError, match="x is on cuda:0 but bias is on cpu"):
        torch.ops.tk.layer_norm(torch.ones(3, 4, device="cuda"), [4], None, torch.ones(4), 1e-5)


class TinyBlock(torch.nn.Module):
    """A pre-norm residual block: layer norm, a projection, RMS norm."""

    def __init__(self, dim=24, tk=True):
        super().__init__()
        self.tk = tk
        self.ln_weight = torch.nn.Parameter(1 + 0.1 * torch.randn(dim))
        self.ln_bias = torch.nn.Parameter(0.1 * torch.randn(dim))
        self.proj = torch.nn.Parameter(torch.randn(dim, dim) / dim**0.5)
        self.rms_weight = torch.nn.Parameter(1 + 0.1 * torch.randn(dim))

    def forward(self, x):
        n = x.shape[-1]
        if self.tk:
            h = torch.ops.tk.layer_norm(x, [n], self.ln_weight, self.ln_bias, 1e-5)
            return torch.ops.tk.rms_norm(x + h @ self.proj, self.rms_weight, 1e-6)
        h = F.layer_norm(x, (n,), self.ln_weight, self.ln_bias, 1e-5)
        return F.rms_norm(x + h @ self.proj, (n,), self.rms_weight, 1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_block_matches_eager_and_pytorch(device):
    torch._dynamo.reset()
    model = TinyBlock().to(device)
    reference = TinyBlock(tk=False).to(device)
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 19, 24, device=device)
    compiled = torch.compile(model, fullgraph=True)  # fullgraph: any graph break is an error

    eager_out = model(x)
    compiled_out = compiled(x)
    torch.testing.assert_close(compiled_out, eager_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(eager_out, reference(x), rtol=1e-4, atol=1e-5)

    target = torch.randn_like(eager_out)
    (compiled_out * target).sum().backward()
    compiled_grads = [p.grad.clone() for p in model.parameters()]
    (reference(x) * target).sum().backward()
    for got, want in zip(compiled_grads, [p.grad for p in reference.parameters()]):
        assert_close(got, want.double(), torch.float32, scale=10)


def test_compiled_with_dynamic_shapes():
    """dynamic=True: sizes are symbolic while tracing; the launch rules turn them into plain ints."""
    torch._dynamo.reset()
    model = TinyBlock()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for batch in [3, 5, 40]:
        x = torch.randn(batch, 7, 24)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


def test_compiled_cpu_graph_calls_the_interpreted_ops():
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    _, code = run_and_get_code(torch.compile(TinyBlock(), fullgraph=True), torch.randn(5, 24))
    source = "\n".join(code)
    for op in ["tk.layer_norm_cpu", "tk.rms_norm_cpu"]:
        assert op in source, f"{op} missing from the compiled code"


@pytest.mark.gpu
def test_compiled_cuda_graph_contains_the_hand_written_kernels():
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    _, code = run_and_get_code(torch.compile(TinyBlock().cuda(), fullgraph=True), torch.randn(64, 24, device="cuda"))
    source = "\n".join(code)
    for kernel in ["layer_norm_forward_kernel", "rms_norm_forward_kernel"]:
        assert kernel in source, f"{kernel} missing from Inductor's output code"
    assert "tk.rms_norm_cpu" not in source


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(16384, 4096), (2048, 32768)])  # both backward designs
def test_weight_gradients_are_deterministic(shape):
    """No atomics in the dw/db reduction: the same bits on every run."""
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    weight, bias = params(shape[-1], "cuda", torch.bfloat16)
    grad = torch.randn_like(x)
    runs = [
        torch.ops.tk.layer_norm_backward(grad, x, [shape[-1]], weight, 1e-5, True, True) for _ in range(3)
    ] + [torch.ops.tk.rms_norm_backward(grad, x, weight, 1e-6, True) for _ in range(3)]
    for first, again in [(runs[0], runs[1]), (runs[0], runs[2]), (runs[3], runs[4]), (runs[3], runs[5])]:
        for a, b in zip(first, again):
            assert torch.equal(a, b)


def test_every_norm_has_a_spec_the_harness_can_run():
    for name, n_params in [("rms_norm", 1), ("layer_norm", 2)]:
        spec = ops.get_spec(name)
        assert set(spec.tolerance) >= set(spec.dtypes)
        assert spec.shapes["cpu"] and spec.shapes["cuda"]
        for dtype in [torch.float32, torch.bfloat16]:
            inputs = spec.make_inputs((6, 40), dtype, torch.device("cpu"))
            assert len(inputs) == 1 + n_params
            y = spec.tk(*inputs)
            moved = sum(t.numel() * t.element_size() for t in (*inputs, y))  # each read or written once
            assert spec.bytes_moved((6, 40), dtype) == moved
            assert_close(y, spec.reference(*[t.double() for t in inputs]), dtype)


@pytest.mark.parametrize("centered", [False, True], ids=["rms_norm", "layer_norm"])
def test_the_held_norm_kernels_hold_framed_rows_16_bytes_an_access(centered):
    """Built for sm_90 (no GPU needed): rows of 50257 bfloat16 columns (COL_MULTIPLE 1) held framed
    read x and dy and write dx 16 bytes an access in the segments between a row's partial runs; held
    from their first element, as before version 54, no access was wider than an element."""
    from triton.compiler import ASTSource

    setup = TUNING.held_setups(centered).for_16_bit[0]
    kernel = norm_launch.KERNELS[centered].backward_held
    signature = {name: "*bf16" if name.endswith("_ptr") else "i32" for name in kernel.arg_names}
    signature.update(dw_partial_ptr="*fp32", db_partial_ptr="*fp32", words_ptr="*i64", eps="fp32")
    accesses = {}
    for frame in (8, 0):
        constants = dict(HAS_WEIGHT=True, WEIGHT_GRAD=True, BIAS_GRAD=centered, SEGMENT=setup.segment,
                         SEGMENTS_BLOCK=held_rows.words_block(setup.warps, 99), COL_MULTIPLE=1, OVERLAPPED=False,
                         ROWS_AHEAD=setup.rows_ahead, FRAME=frame)  # fmt: skip
        signature.update({name: "constexpr" for name in constants})
        aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names) if name.endswith("_ptr")}
        ptx = build_for_hopper(ASTSource(kernel, dict(signature), constants, aligned), setup).asm["ptx"]
        accesses[frame] = re.findall(r"\b(?:ld|st)\.global(?:\.[a-z0-9]+)*", ptx)
    assert "ld.global.v4.b32" in accesses[8] and "st.global.v4.b32" in accesses[8], sorted(set(accesses[8]))
    assert not [a for a in accesses[0] if ".v4." in a or ".v2." in a], sorted(set(accesses[0]))


def test_the_held_norm_kernels_wait_for_their_fill():
    """Built for sm_90 (no GPU needed): the norms' held backwards wait for their scratch fill after
    their first loads and before their first publish, as the softmax kernels do (the fill itself:
    tests/blocks/test_held_rows.py)."""
    from triton.compiler import ASTSource

    for overlapped in (False, True):
        for centered in (False, True):
            setup = TUNING.held_setups(centered).for_16_bit[0]
            kernel = norm_launch.KERNELS[centered].backward_held
            signature = {name: "*bf16" if name.endswith("_ptr") else "i32" for name in kernel.arg_names}
            signature.update(dw_partial_ptr="*fp32", db_partial_ptr="*fp32", words_ptr="*i64", eps="fp32")
            constants = dict(HAS_WEIGHT=True, WEIGHT_GRAD=True, BIAS_GRAD=True, SEGMENT=setup.segment,
                             SEGMENTS_BLOCK=held_rows.words_block(setup.warps, 8), COL_MULTIPLE=16, OVERLAPPED=overlapped,
                             ROWS_AHEAD=setup.rows_ahead, FRAME=0)  # fmt: skip
            signature.update({name: "constexpr" for name in constants})
            ptx = build_for_hopper(ASTSource(kernel, signature, constants), setup).asm["ptx"]
            assert_publishes_without_release(ptx)
            assert_waits_for_the_fill_before_the_scratch(ptx, overlapped)
