"""Softmax along any dim, forward and backward, rows of any length.

    y = exp(x - max(x)) / sum(exp(x - max(x)))          along `dim`
    dx = y * (dy - sum(dy * y))                          its backward

A tensor is seen as (outer, n_cols, inner) around `dim`: each of the
outer * inner rows is reduced on its own, its elements `inner` apart in
memory (inner == 1 for the last dim, the common case, which Triton
specializes away).  One program handles one row.

Two designs, picked by row length:
* the row fits in one block: load it once, reduce in registers, write it:
  one read and one write per element, the minimum;
* longer rows (no limit on the length): an *online* softmax.  The first
  pass keeps a running maximum and a running sum, rescaling the sum by
  exp(old_max - new_max) whenever the maximum grows, so max and sum come out
  of a single sweep; the second pass writes exp(x - max) / sum.
"""

import torch
import triton
import triton.language as tl

from ._registry import OpSpec, check_same, check_tensor, launcher, register_op, register_spec


@triton.jit
def _row_start(row, n_cols, inner):
    """Offset of the first element of `row` in an (outer, n_cols, inner) tensor."""
    outer_index = row // inner
    return outer_index * n_cols * inner + (row - outer_index * inner)


@triton.jit
def _load_row(ptr, start, cols, n_cols, inner, other):
    x = tl.load(ptr + start + cols * inner, mask=cols < n_cols, other=other)
    if x.dtype != tl.float64:  # resolved at compile time: half and float32 compute in float32
        x = x.to(tl.float32)
    return x


@triton.jit
def _finite_or_zero(row_max):
    """The shift for exp() in the online sum.  While every value seen is -inf,
    shift by 0 instead: exp(-inf - -inf) would be NaN and poison the sum."""
    return tl.where(row_max == -float("inf"), 0.0, row_max)


@triton.jit
def softmax_forward_kernel(x_ptr, y_ptr, n_cols, inner, BLOCK_SIZE: tl.constexpr):
    """The whole row in one block."""
    start = _row_start(tl.program_id(0).to(tl.int64), n_cols, inner)
    cols = tl.arange(0, BLOCK_SIZE)
    x = _load_row(x_ptr, start, cols, n_cols, inner, -float("inf"))  # -inf lanes add exp(-inf) = 0
    numerator = tl.exp(x - tl.max(x, axis=0))  # subtracting the max keeps exp() from overflowing
    y = numerator / tl.sum(numerator, axis=0)
    tl.store(y_ptr + start + cols * inner, y.to(y_ptr.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def softmax_forward_online_kernel(x_ptr, y_ptr, n_cols, inner, BLOCK_SIZE: tl.constexpr):
    """Rows longer than a block: online max and sum, then a second pass to write."""
    start = _row_start(tl.program_id(0).to(tl.int64), n_cols, inner)
    cols = tl.arange(0, BLOCK_SIZE)
    # The first chunk starts the running max and sum, so they take the compute
    # dtype (float32, or float64) from the data.
    x = _load_row(x_ptr, start, cols, n_cols, inner, -float("inf"))
    row_max = tl.max(x, axis=0)
    row_sum = tl.sum(tl.exp(x - _finite_or_zero(row_max)), axis=0)
    for chunk in range(BLOCK_SIZE, n_cols, BLOCK_SIZE):
        x = _load_row(x_ptr, start, chunk + cols, n_cols, inner, -float("inf"))
        new_max = tl.maximum(row_max, tl.max(x, axis=0))
        shift = _finite_or_zero(new_max)
        row_sum = row_sum * tl.exp(row_max - shift) + tl.sum(tl.exp(x - shift), axis=0)
        row_max = new_max
    # An all -inf row ends with max -inf: exp(-inf - -inf) is NaN, as in torch.softmax.
    for chunk in range(0, n_cols, BLOCK_SIZE):
        x = _load_row(x_ptr, start, chunk + cols, n_cols, inner, -float("inf"))
        y = tl.exp(x - row_max) / row_sum
        tl.store(y_ptr + start + (chunk + cols) * inner, y.to(y_ptr.dtype.element_ty), mask=chunk + cols < n_cols)


@triton.jit
def softmax_backward_kernel(dy_ptr, y_ptr, dx_ptr, n_cols, inner, BLOCK_SIZE: tl.constexpr):
    """dx = y * (dy - sum(dy * y)), the whole row in one block."""
    start = _row_start(tl.program_id(0).to(tl.int64), n_cols, inner)
    cols = tl.arange(0, BLOCK_SIZE)
    dy = _load_row(dy_ptr, start, cols, n_cols, inner, 0.0)
    y = _load_row(y_ptr, start, cols, n_cols, inner, 0.0)
    dx = y * (dy - tl.sum(dy * y, axis=0))
    tl.store(dx_ptr + start + cols * inner, dx.to(dx_ptr.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def softmax_backward_looped_kernel(dy_ptr, y_ptr, dx_ptr, n_cols, inner, BLOCK_SIZE: tl.constexpr):
    """Rows longer than a block: one pass for sum(dy * y), one to write dx."""
    start = _row_start(tl.program_id(0).to(tl.int64), n_cols, inner)
    cols = tl.arange(0, BLOCK_SIZE)
    dy = _load_row(dy_ptr, start, cols, n_cols, inner, 0.0)
    y = _load_row(y_ptr, start, cols, n_cols, inner, 0.0)
    dot = tl.sum(dy * y, axis=0)  # the first chunk sets the accumulator's dtype
    for chunk in range(BLOCK_SIZE, n_cols, BLOCK_SIZE):
        dy = _load_row(dy_ptr, start, chunk + cols, n_cols, inner, 0.0)
        y = _load_row(y_ptr, start, chunk + cols, n_cols, inner, 0.0)
        dot += tl.sum(dy * y, axis=0)
    for chunk in range(0, n_cols, BLOCK_SIZE):
        dy = _load_row(dy_ptr, start, chunk + cols, n_cols, inner, 0.0)
        y = _load_row(y_ptr, start, chunk + cols, n_cols, inner, 0.0)
        dx = y * (dy - dot)
        tl.store(dx_ptr + start + (chunk + cols) * inner, dx.to(dx_ptr.dtype.element_ty), mask=chunk + cols < n_cols)


# Longest row held in one block, and the chunk of the looped kernels.  On the
# GPU a block of 16384 float32 over 16 warps is 32 registers per thread;
# the interpreter has no registers, only per-program Python overhead.
_MAX_BLOCK = {"cuda": 16384, "cpu": 1 << 16}
_CHUNK = {"cuda": 4096, "cpu": 1 << 14}


def _launch(single_kernel, looped_kernel, tensors, n_cols, inner):
    """Launch one program per row with the kernel that fits the row length."""
    like = tensors[-1]
    device = "cuda" if like.device.type == "cuda" else "cpu"
    n_rows = like.numel() // n_cols
    block = triton.next_power_of_2(n_cols)
    if block <= _MAX_BLOCK[device]:
        kernel = single_kernel
    else:
        kernel, block = looped_kernel, _CHUNK[device]
    num_warps = min(max(block // 512, 1), 16)  # about 16 elements per thread
    launcher(kernel, like)[(n_rows,)](*tensors, n_cols, inner, BLOCK_SIZE=block, num_warps=num_warps)


def _normalize_dim(op: str, x: torch.Tensor, dim: int) -> int:
    rank = max(x.dim(), 1)  # a 0-d tensor is a row of one, as in torch.softmax
    if not -rank <= dim < rank:
        raise IndexError(f"tk.{op}: dim {dim} is out of range for a {x.dim()}-D tensor (expected {-rank} to {rank - 1})")
    return dim % rank


def _cols_and_inner(x: torch.Tensor, dim: int) -> tuple[int, int]:
    """Row length and the distance between a row's elements, for softmax along `dim`."""
    if x.dim() == 0:
        return 1, 1
    return x.shape[dim], _prod(x.shape[dim + 1 :])


def _prod(sizes) -> int:
    out = 1
    for s in sizes:
        out *= s
    return out


def _softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    check_tensor("softmax", "x", x)
    dim = _normalize_dim("softmax", x, dim)
    x = x.contiguous()  # the (outer, n_cols, inner) view needs the standard layout
    y = torch.empty_like(x)
    if x.numel() == 0:
        return y
    n_cols, inner = _cols_and_inner(x, dim)
    _launch(softmax_forward_kernel, softmax_forward_online_kernel, (x, y), n_cols, inner)
    return y


def _softmax_backward(grad: torch.Tensor, y: torch.Tensor, dim: int) -> torch.Tensor:
    check_tensor("softmax_backward", "grad", grad)
    check_tensor("softmax_backward", "y", y)
    check_same("softmax_backward", {"grad": grad, "y": y})
    if grad.shape != y.shape:
        raise ValueError(f"tk.softmax_backward: grad has shape {tuple(grad.shape)} but y has {tuple(y.shape)}")
    dim = _normalize_dim("softmax_backward", y, dim)
    grad, y = grad.contiguous(), y.contiguous()
    dx = torch.empty_like(y)
    if y.numel() == 0:
        return dx
    n_cols, inner = _cols_and_inner(y, dim)
    _launch(softmax_backward_kernel, softmax_backward_looped_kernel, (grad, y, dx), n_cols, inner)
    return dx


softmax = register_op("softmax", _softmax)
softmax_backward = register_op("softmax_backward", _softmax_backward)


def _setup_context(ctx, inputs, output):
    _, dim = inputs
    ctx.save_for_backward(output)
    ctx.dim = dim


def _backward(ctx, grad):
    (y,) = ctx.saved_tensors
    return torch.ops.tk.softmax_backward(grad, y, ctx.dim), None


softmax.register_autograd(_backward, setup_context=_setup_context)


# --------------------------------------------------------------------------
# What the comparison harness reads.
# --------------------------------------------------------------------------


def _liger_softmax():
    from liger_kernel.ops.softmax import LigerSoftmaxFunction  # optional peer

    return lambda x: LigerSoftmaxFunction.apply(x)


register_spec(
    OpSpec(
        name="softmax",
        tk=lambda x: torch.ops.tk.softmax(x, -1),
        reference=lambda x: torch.softmax(x, dim=-1),
        make_inputs=lambda shape, dtype, device: (torch.randn(shape, dtype=dtype, device=device),),
        bytes_moved=lambda shape, dtype: 2 * _prod(shape) * torch.empty((), dtype=dtype).element_size(),
        flops=lambda shape, dtype: 4 * _prod(shape),  # max, subtract+exp, sum, divide
        tolerance={torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float64: 1e-7},
        shapes={
            "cuda": [(4096, 128), (4096, 1024), (4096, 4096), (4096, 16384), (1024, 65536), (256, 262144), (64, 1048576)],
            "cpu": [(64, 1000), (4, 70_001)],
        },
        peers={"liger": _liger_softmax},
    )
)
