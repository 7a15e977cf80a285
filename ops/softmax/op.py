"""torch.ops.tk.softmax and softmax_backward: argument checks, then a plan, then its launch.

A call goes checks -> ``describe`` (its Meta) -> ``choose_plan`` (plan.py) ->
``run`` (launch.py).  ``forward`` and ``backward`` are the Python entry points
the registered ops call with the default ``TUNING``; tests call them with a
smaller Tuning, or launch a plan of their own with ``run``.
"""

import torch

from ..blocks.held_rows import may_overlap_fill
from ..runtime import (
    FLOAT32_RESULT,
    GRAD,
    RESULT,
    check_same,
    check_tensor,
    device_facts,
    dtype_of,
    follow_autocast,
    launching_directly,
    reads_as_float32,
    register_formula,
    register_op,
    result_dtype,
)
from .launch import HAS_GLUON, run
from .plan import BACKWARD, FORWARD, TUNING, Meta, Tuning, choose_plan


def describe(direction: str, tensors, n_cols: int, inner: int) -> Meta:
    """The Meta of a call over `tensors` (inputs..., output), seen as rows of n_cols
    elements `inner` apart: the one place that asks the device and the call context."""
    out = tensors[-1]
    facts = device_facts(out.device)
    eager = launching_directly()
    return Meta(
        direction,
        n_rows=out.numel() // n_cols,
        n_cols=n_cols,
        inner=inner,
        input_bytes=tensors[0].element_size(),
        output_bytes=out.element_size(),
        facts=facts,
        eager=eager,
        aligned=eager and facts.cuda and starts_aligned(tensors),  # a traced tensor has no address to read
        overlap_fill=may_overlap_fill(facts),
        gluon=HAS_GLUON,
    )


def starts_aligned(tensors) -> bool:
    """Whether every tensor's first element is 16-byte aligned (a view may start off it)."""
    return all(t.data_ptr() % 16 == 0 for t in tensors)


def _normalize_dim(op: str, x: torch.Tensor, dim: int) -> int:
    rank = max(x.dim(), 1)  # a 0-d tensor is a row of one, as in torch.softmax
    if not -rank <= dim < rank:
        raise IndexError(
            f"tk.{op}: dim {dim} is out of range for a {x.dim()}-D tensor (expected {-rank} to {rank - 1})"
        )
    return dim % rank


def _check_row_count(op: str, x: torch.Tensor, dim: int) -> None:
    """Each row is one program of the grid's first axis, which holds 2**31 - 1 on CUDA."""
    if x.device.type != "cuda":
        return
    n_cols, _ = _cols_and_inner(x, dim)
    n_rows = x.numel() // max(n_cols, 1)
    if n_rows > 2**31 - 1:
        raise ValueError(
            f"tk.{op}: {n_rows} rows of {n_cols} along dim {dim} of shape {tuple(x.shape)}: "
            "more than a CUDA grid holds (2**31 - 1); softmax over a longer dim, or split the tensor"
        )


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


def forward(
    x: torch.Tensor, dim: int = -1, dtype: torch.dtype | None = None, *, tuning: Tuning = TUNING
) -> torch.Tensor:
    """As torch.softmax(x, dim, dtype): with `dtype`, x is cast to it first and y comes in it.
    A 16-bit x with dtype float32, what autocast asks for on CUDA and what attention
    code writes, is read as it is and y written in float32: 6 bytes an element.
    `tuning`: the constants the plan is chosen with."""
    check_tensor("softmax", "x", x)
    dim = _normalize_dim("softmax", x, dim)
    _check_row_count("softmax", x, dim)
    dtype = result_dtype("softmax", "dtype", dtype, x.dtype)
    if dtype != x.dtype and not reads_as_float32(x.dtype, dtype):
        x = x.to(dtype)
    x = x.contiguous()  # the (outer, n_cols, inner) view needs the standard layout
    y = torch.empty_like(x, dtype=dtype)
    if x.numel() == 0:
        return y
    n_cols, inner = _cols_and_inner(x, dim)
    run(choose_plan(describe(FORWARD, (x, y), n_cols, inner), tuning), (x, y))
    return y


def backward(
    grad: torch.Tensor, y: torch.Tensor, dim: int, input_dtype: torch.dtype | None = None, *, tuning: Tuning = TUNING
) -> torch.Tensor:
    """dx for y = softmax(x, dim); dx comes in `input_dtype`, x's dtype (y's if None), which
    differs from y's when the forward was given a dtype: float32 grad and y give a bfloat16 dx.
    `tuning`: the constants the plan is chosen with."""
    check_tensor("softmax_backward", "grad", grad)
    check_tensor("softmax_backward", "y", y)
    check_same("softmax_backward", {"grad": grad, "y": y})
    if grad.shape != y.shape:
        raise ValueError(f"tk.softmax_backward: grad has shape {tuple(grad.shape)} but y has {tuple(y.shape)}")
    dim = _normalize_dim("softmax_backward", y, dim)
    _check_row_count("softmax_backward", y, dim)
    input_dtype = result_dtype("softmax_backward", "input_dtype", input_dtype, y.dtype)
    grad, y = grad.contiguous(), y.contiguous()
    dx = torch.empty_like(y, dtype=input_dtype)
    if y.numel() == 0:
        return dx
    n_cols, inner = _cols_and_inner(y, dim)
    run(choose_plan(describe(BACKWARD, (grad, y, dx), n_cols, inner), tuning), (grad, y, dx))
    return dx


def _softmax(x: torch.Tensor, dim: int = -1, dtype: torch.dtype | None = None) -> torch.Tensor:
    return forward(x, dim, dtype)


def _softmax_backward(
    grad: torch.Tensor, y: torch.Tensor, dim: int, input_dtype: torch.dtype | None = None
) -> torch.Tensor:
    return backward(grad, y, dim, input_dtype)


softmax = register_op("softmax", _softmax)
softmax_backward = register_op("softmax_backward", _softmax_backward)
# Under autocast, as torch.softmax: on CUDA an unset dtype becomes float32 (x is
# read as it comes, y is float32); on the CPU nothing changes.
follow_autocast("softmax", {"cuda": FLOAT32_RESULT})


# dx = y * (dy - sum(dy * y)): the backward reads the result y, not x, and x's dtype.
register_formula(
    softmax, backward=softmax_backward, arguments=(GRAD, RESULT, "dim", dtype_of("x")), gradients={"x": 0}
)
