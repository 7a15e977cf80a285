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

from typing import Optional

import torch

from ..runtime import (
    FLOAT32_RESULT,
    GRAD,
    autocast_key,
    check_tensor,
    follow_autocast,
    needs_grad,
    register_formula,
    register_op,
)
from .checks import check_grad, check_param, norm_dtype
from .engine import RMS_NORM_KERNELS, normalize, normalize_backward

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
