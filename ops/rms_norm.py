"""RMS norm over the last dim, forward and backward, rows of any length.

For each row of N elements (N = x.shape[-1] = weight.shape[0]):

    rstd = 1 / sqrt(mean(x^2) + eps),   xhat = x * rstd,   y = xhat * w
    g = dy * w,   dx = rstd * (g - xhat * mean(g * xhat)),   dw = sum over rows of dy * xhat

This is layer norm without the centering, so it runs layer_norm.py's
kernel bodies with CENTERED off: the same designs (a tile of short rows per
program, two sweeps for long rows), the same two-stage dw reduction without
atomics, and the same choice to recompute rstd in the backward rather than
save it; read that module's docstring.  The kernels here are thin wrappers
that fix the flag, so that this op's kernels carry its name.

Arguments, as in ``torch.nn.functional.rms_norm(x, (N,), weight, eps)``:

* ``weight=None``: no scale, y = x * rstd (and no weight gradient).
* ``eps=None``: the machine epsilon of the dtype the statistics are computed
  in, which is what PyTorch does: ``torch.finfo(torch.float32).eps`` for
  float32, float16 and bfloat16 inputs, ``torch.finfo(torch.float64).eps``
  for float64.  (``torch.finfo(x.dtype).eps`` would be 2**-7 for bfloat16,
  far from PyTorch's result on small inputs.)
"""

import math
from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._alignment import known_multiple
from ._cooperative import pack, partial_at, program_segment, publish, row_words, unpack, wait_for_fill
from ._registry import (
    FLOAT32_RESULT,
    GRAD,
    OpSpec,
    autocast_key,
    check_tensor,
    follow_autocast,
    needs_grad,
    register_formula,
    register_op,
    register_spec,
)
from .layer_norm import (  # the bodies both norms share, and layer norm's pieces the held kernel reuses
    NORM_SHAPES,
    NORM_TOLERANCE,
    HeldRows,
    NormKernels,
    check_grad,
    check_param,
    columns_backward,
    normalize,
    normalize_backward,
    normalize_long_rows,
    normalize_rows,
    normalize_rows_backward,
    norm_dtype,
    row_statistics_backward,
    _gradient_at_xhat,
    _load,
    _load_segment,
    _rstd,
    _segment_weight,
    _widen,
    _zeros_1d,
)

# --------------------------------------------------------------------------
# The kernels: layer norm's bodies with CENTERED off.  Their signatures are
# layer norm's, so that one launcher serves both ops: RMS norm has no bias,
# and is always launched with HAS_BIAS=False and BIAS_GRAD=False.
# --------------------------------------------------------------------------


@triton.jit
def rms_norm_forward_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    COL_MULTIPLE: tl.constexpr, AFFINE_FIRST: tl.constexpr,
):  # fmt: skip
    normalize_rows(
        x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps, False, HAS_WEIGHT, HAS_BIAS, BLOCK_M, BLOCK_N, COL_MULTIPLE,
        AFFINE_FIRST,
    )  # fmt: skip


@triton.jit
def rms_norm_forward_long_rows_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    COL_MULTIPLE: tl.constexpr,
):  # fmt: skip
    normalize_long_rows(
        x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps, False, HAS_WEIGHT, HAS_BIAS, BLOCK_M, BLOCK_N, COL_MULTIPLE
    )


@triton.jit
def rms_norm_backward_kernel(
    dy_ptr, x_ptr, w_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, n_rows, n_cols, eps,
    HAS_WEIGHT: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOAD_AHEAD: tl.constexpr, COL_MULTIPLE: tl.constexpr,
):  # fmt: skip
    normalize_rows_backward(
        dy_ptr, x_ptr, w_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, n_rows, n_cols, eps,
        False, HAS_WEIGHT, WEIGHT_GRAD, BIAS_GRAD, BLOCK_M, BLOCK_N, LOAD_AHEAD, COL_MULTIPLE,
    )  # fmt: skip


@triton.jit
def rms_norm_backward_stats_kernel(
    dy_ptr, x_ptr, w_ptr, stats_ptr, n_cols, eps, HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr,
    COL_MULTIPLE: tl.constexpr,
):  # fmt: skip
    row_statistics_backward(
        dy_ptr, x_ptr, w_ptr, stats_ptr, n_cols, eps, False, HAS_WEIGHT, BLOCK_N, COL_MULTIPLE
    )


@triton.jit
def rms_norm_backward_columns_kernel(
    dy_ptr, x_ptr, w_ptr, stats_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, n_rows, n_cols,
    HAS_WEIGHT: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr, BLOCK_N: tl.constexpr,
    COL_MULTIPLE: tl.constexpr,
):  # fmt: skip
    columns_backward(
        dy_ptr, x_ptr, w_ptr, stats_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, n_rows, n_cols,
        False, HAS_WEIGHT, WEIGHT_GRAD, BIAS_GRAD, BLOCK_N, COL_MULTIPLE,
    )  # fmt: skip


# --------------------------------------------------------------------------
# Backward rows past a block, held on chip across programs (CUDA; the protocol:
# ops/_cooperative.py).  A program keeps one segment of x and dy of a row in
# registers, and the dw accumulator of its segment's columns over all the rows
# it takes.  A segment's partial is one word: (sum(x^2), sum(x * g)).
# --------------------------------------------------------------------------


@triton.jit
def _segment_sums(x_stored, dy_stored, w_ptr, cols, n_cols, HAS_WEIGHT: tl.constexpr):
    """A segment's partial: sum(x^2) and sum(x * g)."""
    x = _widen(x_stored)
    g = _gradient_at_xhat(dy_stored, _segment_weight(w_ptr, cols, cols < n_cols, HAS_WEIGHT), HAS_WEIGHT)
    return tl.sum(x * x, axis=0), tl.sum(x * g, axis=0)


@triton.jit
def _publish_sums(dy_ptr, x_ptr, w_ptr, words_ptr, row, n_rows, segment, cols, n_cols, n_segments,
                  HAS_WEIGHT: tl.constexpr, OVERLAPPED: tl.constexpr):  # fmt: skip
    """Load `row`'s segment of x and dy, publish its partial (nothing past the last row); x and dy as stored.
    OVERLAPPED: this is the kernel's first publish (see wait_for_fill)."""
    x, dy = _load_segment(dy_ptr, x_ptr, row, n_rows, cols, n_cols)
    wait_for_fill(OVERLAPPED)
    _publish_loaded(x, dy, w_ptr, words_ptr, row, n_rows, segment, cols, n_cols, n_segments, HAS_WEIGHT)
    return x, dy


@triton.jit
def _publish_loaded(x, dy, w_ptr, words_ptr, row, n_rows, segment, cols, n_cols, n_segments,
                    HAS_WEIGHT: tl.constexpr):  # fmt: skip
    """Publish the partial of `row`'s segment, loaded already as x and dy (nothing past the last row)."""
    if row < n_rows:
        sum_xx, sum_xg = _segment_sums(x, dy, w_ptr, cols, n_cols, HAS_WEIGHT)
        publish(words_ptr, partial_at(row, segment, n_segments), pack(sum_xx, sum_xg))


@triton.jit
def _segments_sums_here(dy_ptr, x_ptr, w_ptr, row, n_rows, n_cols, n_segments, HAS_WEIGHT: tl.constexpr,
                        SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr):  # fmt: skip
    """Every segment's partial of a row, computed by this program: the same code
    on the same data as the programs that own them, so the same bits."""
    segments = tl.arange(0, SEGMENTS_BLOCK)
    sums_xx = tl.zeros((SEGMENTS_BLOCK,), tl.float32)
    sums_xg = sums_xx
    for segment in range(0, n_segments):
        cols = segment * SEGMENT + tl.arange(0, SEGMENT)
        x, dy = _load_segment(dy_ptr, x_ptr, row, n_rows, cols, n_cols)
        sum_xx, sum_xg = _segment_sums(x, dy, w_ptr, cols, n_cols, HAS_WEIGHT)
        sums_xx = tl.where(segments == segment, sum_xx, sums_xx)
        sums_xg = tl.where(segments == segment, sum_xg, sums_xg)
    return sums_xx, sums_xg


@triton.jit
def rms_norm_backward_held_kernel(
    dy_ptr, x_ptr, w_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, words_ptr, n_rows, n_cols, eps,
    n_segments, rows_at_once, max_spins,
    HAS_WEIGHT: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr,
    SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr, COL_MULTIPLE: tl.constexpr, OVERLAPPED: tl.constexpr,
    ROWS_AHEAD: tl.constexpr = 1,
):  # fmt: skip
    """Long rows held on chip across programs, publishing a round ahead: the next
    row's partial goes out before the wait for this row's words, then dx is
    written from the segment in registers, so x and dy are read once.  The
    program's dw accumulator goes out as row `first_row` of the (rows_at_once, N)
    scratch.  ROWS_AHEAD=2 also loads the segment of the row after next at the top of
    a round, so those loads are in flight while the round polls and writes (a third
    segment's registers; see HeldRows).  (BIAS_GRAD and db_partial_ptr: the signature
    is layer norm's.)"""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    segment, cols, first_row = program_segment(n_segments, SEGMENT)
    mask = cols < n_cols
    inside = tl.arange(0, SEGMENTS_BLOCK) < n_segments  # lanes past the row read as padding words
    dw_acc = _zeros_1d(x_ptr, SEGMENT)
    x_stored, dy_stored = _publish_sums(dy_ptr, x_ptr, w_ptr, words_ptr, first_row, n_rows, segment, cols, n_cols,
                                        n_segments, HAS_WEIGHT, OVERLAPPED)  # fmt: skip
    if ROWS_AHEAD == 2:
        x_next, dy_next = _load_segment(dy_ptr, x_ptr, first_row + rows_at_once, n_rows, cols, n_cols)
    for round in range(0, tl.cdiv(n_rows - first_row, rows_at_once)):
        row = first_row + round * rows_at_once
        if ROWS_AHEAD == 2:
            # The round after next is in flight while this one publishes, polls and writes.
            x_after, dy_after = _load_segment(dy_ptr, x_ptr, row + 2 * rows_at_once, n_rows, cols, n_cols)
            _publish_loaded(x_next, dy_next, w_ptr, words_ptr, row + rows_at_once, n_rows, segment, cols, n_cols,
                            n_segments, HAS_WEIGHT)  # fmt: skip
        else:
            x_next, dy_next = _publish_sums(dy_ptr, x_ptr, w_ptr, words_ptr, row + rows_at_once, n_rows, segment,
                                            cols, n_cols, n_segments, HAS_WEIGHT, False)  # fmt: skip
        words, published = row_words(words_ptr, row, n_segments, max_spins, SEGMENTS_BLOCK)
        if published:
            sums_xx, sums_xg = unpack(words)
        else:
            sums_xx, sums_xg = _segments_sums_here(dy_ptr, x_ptr, w_ptr, row, n_rows, n_cols, n_segments, HAS_WEIGHT,
                                                   SEGMENT, SEGMENTS_BLOCK)  # fmt: skip
            # Read this segment again rather than keep it in registers through that loop.
            x_stored, dy_stored = _load_segment(dy_ptr, x_ptr, row, n_rows, cols, n_cols)
        rstd = _rstd(tl.sum(tl.where(inside, sums_xx, 0.0), axis=0), n_cols, eps)
        mean_g_xhat = rstd * tl.sum(tl.where(inside, sums_xg, 0.0), axis=0) / n_cols
        xhat = _widen(x_stored) * rstd
        g = _gradient_at_xhat(dy_stored, _segment_weight(w_ptr, cols, mask, HAS_WEIGHT), HAS_WEIGHT)
        dx = (g - xhat * mean_g_xhat) * rstd
        tl.store(dx_ptr + row * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if WEIGHT_GRAD:
            dw_acc += tl.where(mask, _widen(dy_stored) * xhat, 0.0)
        x_stored, dy_stored = x_next, dy_next
        if ROWS_AHEAD == 2:
            x_next, dy_next = x_after, dy_after
    if WEIGHT_GRAD:
        tl.store(dw_partial_ptr + first_row * n_cols + cols, dw_acc, mask=mask)


RMS_NORM_KERNELS = NormKernels(
    forward=rms_norm_forward_kernel,
    forward_long_rows=rms_norm_forward_long_rows_kernel,
    backward=rms_norm_backward_kernel,
    backward_stats=rms_norm_backward_stats_kernel,
    backward_columns=rms_norm_backward_columns_kernel,
    backward_held=rms_norm_backward_held_kernel,
    # See HeldRows (ops/layer_norm.py): one warp a program up to 128 segments a row, then wider programs.
    held_setups={
        2: (HeldRows(512, 1, 96, 20, 128), HeldRows(2048, 4, 96, 5)),
        4: (HeldRows(512, 1, 128, 16, 128), HeldRows(1024, 2, 128, 8)),
    },
)


# --------------------------------------------------------------------------
# The op.
# --------------------------------------------------------------------------


def default_eps(dtype: torch.dtype) -> float:
    """eps=None: the epsilon of the compute dtype, as torch.nn.functional.rms_norm uses."""
    return torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps


def _row_length(op: str, x: torch.Tensor, weight: Optional[torch.Tensor]) -> int:
    if x.dim() == 0:
        raise ValueError(f"tk.{op}: x must have at least one dim (the one normalized), got a 0-D tensor")
    check_param(op, "weight", weight, x, (x.shape[-1],))
    return int(x.shape[-1])  # under torch.compile, the row length is specialized: it picks the block size


def _rms_norm(
    x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: Optional[float] = None, dtype: Optional[torch.dtype] = None
) -> torch.Tensor:
    """As F.rms_norm over the last dim; `dtype` (None: x's) may be float32 for a 16-bit x, which is then read as it is."""
    check_tensor("rms_norm", "x", x)
    dtype = norm_dtype("rms_norm", x, dtype)
    n_cols = _row_length("rms_norm", x, weight)
    eps = default_eps(x.dtype) if eps is None else eps
    w = None if weight is None else weight.contiguous()
    return normalize(RMS_NORM_KERNELS, x.contiguous(), w, None, eps, n_cols, dtype)


def _rms_norm_backward(
    grad: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor], eps: Optional[float], weight_grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dweight); dx has x's dtype, grad may be float32 for a 16-bit x.  dweight has weight's
    shape when weight_grad is True and is an empty tensor otherwise (an op cannot return None)."""
    check_grad("rms_norm_backward", grad, x)
    n_cols = _row_length("rms_norm_backward", x, weight)
    if weight_grad and weight is None:
        raise ValueError("tk.rms_norm_backward: weight_grad=True needs the weight")
    eps = default_eps(x.dtype) if eps is None else eps
    w = None if weight is None else weight.contiguous()
    dx, dw, _ = normalize_backward(
        RMS_NORM_KERNELS, grad.contiguous(), x.contiguous(), w, eps, n_cols, weight_grad, False, (n_cols,)
    )
    return dx, x.new_empty(0) if dw is None else dw


rms_norm = register_op("rms_norm", _rms_norm)
rms_norm_backward = register_op("rms_norm_backward", _rms_norm_backward)
# Under autocast, as F.rms_norm: PyTorch puts it on CUDA's float32 list from 2.12 on (its
# kernel then casts x to float32); before, it ran inputs as they came.  tk follows the
# installed PyTorch, and asks for a float32 result of x read as it is instead of the copy.
if torch._C._dispatch_has_kernel_for_dispatch_key("aten::rms_norm", autocast_key("cuda")):
    follow_autocast("rms_norm", {"cuda": FLOAT32_RESULT})


# x and weight are saved, not rstd: it is recomputed (see layer_norm.py's docstring).
register_formula(
    rms_norm,
    backward=rms_norm_backward,
    arguments=(GRAD, "x", "weight", "eps", needs_grad("weight")),
    gradients={"x": 0, "weight": 1},
)


# --------------------------------------------------------------------------
# What the comparison harness reads.
# --------------------------------------------------------------------------

EPS = 1e-6  # a common choice for RMS norm in transformers


def _make_inputs(shape, dtype, device):
    """x, and a fixed weight near PyTorch's initial one (1), not equal to it."""
    weight = 1 + 0.1 * torch.randn(shape[-1], dtype=dtype, device=device)
    return torch.randn(shape, dtype=dtype, device=device), weight


def _liger_rms_norm():
    from liger_kernel.transformers.functional import liger_rms_norm  # optional peer

    return lambda x, weight: liger_rms_norm(x, weight, EPS, in_place=False)


register_spec(
    OpSpec(
        name="rms_norm",
        tk=lambda x, weight: torch.ops.tk.rms_norm(x, weight, EPS),
        reference=lambda x, weight: F.rms_norm(x, (x.shape[-1],), weight, EPS),
        make_inputs=_make_inputs,
        # read x, write y, read weight
        bytes_moved=lambda shape, dtype: (2 * math.prod(shape) + shape[-1]) * torch.empty((), dtype=dtype).element_size(),
        # square and sum; scale by rstd; times w
        flops=lambda shape, dtype: 4 * math.prod(shape),
        tolerance=NORM_TOLERANCE,
        shapes=NORM_SHAPES,
        peers={"liger": _liger_rms_norm},
    )
)


def _make_backward_inputs(shape, dtype, device):
    """grad, x, weight, and the rstd PyTorch's fused forward saves for its backward
    (tk recomputes it: see layer_norm.py's docstring)."""
    x, weight = _make_inputs(shape, dtype, device)
    _, rstd = torch.ops.aten._fused_rms_norm(x, [shape[-1]], weight, EPS)
    return torch.randn(shape, dtype=dtype, device=device), x, weight, rstd


def _backward_formula(grad, x, weight, _saved_rstd):
    """(dx, dweight) from the module docstring's formulas, composed of PyTorch ops; rstd recomputed
    (in float64 for the float64 reference), the saved one left unused."""
    x32 = x.float() if x.dtype != torch.float64 else x
    rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + EPS)
    xhat, dy = x32 * rstd, grad.to(x32.dtype)
    g = dy * weight.to(x32.dtype)
    dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
    dweight = (dy * xhat).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dweight.to(weight.dtype)


def _eager_backward(grad, x, weight, rstd):
    """What eager autograd runs for F.rms_norm: on CUDA, aten's fused backward with the saved rstd;
    elsewhere F.rms_norm is a composition of ops, whose gradients the formula composes too."""
    if x.is_cuda:
        return torch.ops.aten._fused_rms_norm_backward(grad, x, [x.shape[-1]], rstd, weight, [True, True])
    return _backward_formula(grad, x, weight, rstd)


# The backward on its own, both gradients asked for: (dx, dweight).
register_spec(
    OpSpec(
        name="rms_norm_backward",
        tk=lambda grad, x, weight, rstd: torch.ops.tk.rms_norm_backward(grad, x, weight, EPS, True),
        reference=_eager_backward,
        reference64=_backward_formula,
        make_inputs=_make_backward_inputs,
        # read grad and x, write dx; read weight, write dweight
        bytes_moved=lambda shape, dtype: (3 * math.prod(shape) + 2 * shape[-1]) * torch.empty((), dtype=dtype).element_size(),
        # xhat, g = dy * w, the row sum (2), dx (3), dweight (2)
        flops=lambda shape, dtype: 9 * math.prod(shape),
        tolerance=NORM_TOLERANCE,
        shapes=NORM_SHAPES,
    )
)
