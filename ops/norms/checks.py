"""Argument checks both norms share: parameters, result dtypes, gradients."""

from typing import Optional

import torch

from ..runtime import (
    check_tensor,
    reads_as_float32,
)

# --------------------------------------------------------------------------
# The op: checks, then the shared launchers.
# --------------------------------------------------------------------------


def check_param(op: str, arg: str, t: Optional[torch.Tensor], x: torch.Tensor, shape: tuple) -> None:
    """A weight or bias: None, or a tensor of `shape` on x's device, of x's dtype or, for a 16-bit
    x, float32: PyTorch's norms take float32 parameters with 16-bit inputs too (mixed-precision
    models keep them so), computing in float32 and returning x's dtype; so do these kernels."""
    if t is None:
        return
    check_tensor(op, arg, t)
    if t.device != x.device:
        raise ValueError(f"tk.{op}: x is on {x.device} but {arg} is on {t.device}")
    if t.dtype not in param_dtypes(x):
        allowed = " or ".join(map(str, param_dtypes(x)))
        raise TypeError(f"tk.{op}: x has dtype {x.dtype}, so {arg} must have dtype {allowed}, not {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"tk.{op}: {arg} has shape {tuple(t.shape)}, expected {tuple(shape)}")


def norm_dtype(op: str, x: torch.Tensor, dtype: Optional[torch.dtype]) -> torch.dtype:
    """A norm's `dtype` argument: x's dtype when None, or float32 for a 16-bit x, which is then
    read as it is (what PyTorch's autocast asks of its norms on CUDA, without its copy of x)."""
    if dtype is None or _can_be_result(x.dtype, dtype):
        return x.dtype if dtype is None else dtype
    raise TypeError(f"tk.{op}: dtype {dtype} is not supported for x of dtype {x.dtype}; {_RESULT_DTYPES}")


_RESULT_DTYPES = "a norm's result has x's dtype, or float32 for a float16 or bfloat16 x"


def _can_be_result(x_dtype: torch.dtype, dtype: torch.dtype) -> bool:
    return dtype == x_dtype or reads_as_float32(x_dtype, dtype)


def check_grad(op: str, grad: torch.Tensor, x: torch.Tensor) -> None:
    """The gradient of a norm's result: x's shape and device, and a dtype the result can have."""
    check_tensor(op, "grad", grad)
    check_tensor(op, "x", x)
    if grad.device != x.device:
        raise ValueError(f"tk.{op}: grad is on {grad.device} but x is on {x.device}")
    if not _can_be_result(x.dtype, grad.dtype):
        raise TypeError(f"tk.{op}: grad has dtype {grad.dtype} but x has dtype {x.dtype}; {_RESULT_DTYPES}")
    if grad.shape != x.shape:
        raise ValueError(f"tk.{op}: grad has shape {tuple(grad.shape)} but x has {tuple(x.shape)}")


def param_dtypes(x: torch.Tensor) -> tuple[torch.dtype, ...]:
    return (x.dtype, torch.float32) if x.dtype in (torch.float16, torch.bfloat16) else (x.dtype,)


def _normalized_size(op: str, x: torch.Tensor, normalized_shape) -> int:
    """N, the product of the normalized dims, after checking they are x's trailing dims."""
    shape = tuple(normalized_shape)
    if len(shape) == 0:
        raise ValueError(f"tk.{op}: normalized_shape must name at least one dim, got []")
    if len(shape) > x.dim() or tuple(x.shape[x.dim() - len(shape) :]) != shape:
        raise ValueError(
            f"tk.{op}: normalized_shape {list(shape)} must be the trailing dims of x, of shape {tuple(x.shape)}"
        )
    n = 1
    for s in shape:
        n *= s
    return int(n)  # under torch.compile, the row length is specialized: it picks the block size


def _contiguous(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.contiguous()
