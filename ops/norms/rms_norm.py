"""RMS norm over the last dim, forward and backward, rows of any length.

For each row of N elements (N = x.shape[-1] = weight.shape[0]):

    rstd = 1 / sqrt(mean(x^2) + eps),   xhat = x * rstd,   y = xhat * w
    g = dy * w,   dx = rstd * (g - xhat * mean(g * xhat)),   dw = sum over rows of dy * xhat

This is layer norm without the centering, so it runs layer norm's kernel
bodies with CENTERED off, through the same plan (plan.py) and launches
(launch.py): the same designs (a tile of short rows per program, rows held
on chip or two sweeps for long rows), the same two-stage dw reduction without
atomics, and the same choice to recompute rstd in the backward rather than
save it; read plan.py's docstring.  Its kernels are thin wrappers that fix
the flag, so that this op's kernels carry its name (kernels.py, held.py).
``forward`` and ``backward`` take a ``tuning`` (tests pass smaller ones); the
registered ops call them with the measured TUNING.

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
from .launch import run_backward, run_forward
from .plan import TUNING, Tuning, choose_backward_plan, choose_forward_plan, describe_backward, describe_forward

CENTERED = False  # no mean subtracted: layer norm's plan without the centering

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


def forward(x, weight=None, eps=None, dtype=None, *, tuning: Tuning = TUNING):
    """As F.rms_norm over the last dim; `dtype` (None: x's) may be float32 for a 16-bit x, which is then read as it is."""
    check_tensor("rms_norm", "x", x)
    dtype = norm_dtype("rms_norm", x, dtype)
    n_cols = _row_length("rms_norm", x, weight)
    eps = default_eps(x.dtype) if eps is None else eps
    w = None if weight is None else weight.contiguous()
    x = x.contiguous()
    plan = choose_forward_plan(describe_forward(CENTERED, x, n_cols), tuning)
    return run_forward(plan, x, w, None, eps, dtype)


def backward(grad, x, weight, eps, weight_grad, *, tuning: Tuning = TUNING):
    """(dx, dweight); dx has x's dtype, grad may be float32 for a 16-bit x.  dweight has weight's
    shape when weight_grad is True and is an empty tensor otherwise (an op cannot return None)."""
    check_grad("rms_norm_backward", grad, x)
    n_cols = _row_length("rms_norm_backward", x, weight)
    if weight_grad and weight is None:
        raise ValueError("tk.rms_norm_backward: weight_grad=True needs the weight")
    eps = default_eps(x.dtype) if eps is None else eps
    w = None if weight is None else weight.contiguous()
    grad, x = grad.contiguous(), x.contiguous()
    plan = choose_backward_plan(describe_backward(CENTERED, grad, x, n_cols), tuning)
    dx, dw, _ = run_backward(plan, grad, x, w, eps, weight_grad, False, (n_cols,))
    return dx, x.new_empty(0) if dw is None else dw


def _rms_norm(
    x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: Optional[float] = None, dtype: Optional[torch.dtype] = None
) -> torch.Tensor:
    """tk.rms_norm: forward with the measured tuning."""
    return forward(x, weight, eps, dtype)


def _rms_norm_backward(
    grad: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor], eps: Optional[float], weight_grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """tk.rms_norm_backward: backward with the measured tuning."""
    return backward(grad, x, weight, eps, weight_grad)


rms_norm = register_op("rms_norm", _rms_norm)
rms_norm_backward = register_op("rms_norm_backward", _rms_norm_backward)
# Under autocast, as F.rms_norm: PyTorch puts it on CUDA's float32 list from 2.12 on (its
# kernel then casts x to float32); before, it ran inputs as they came.  tk follows the
# installed PyTorch, and asks for a float32 result of x read as it is instead of the copy.
if torch._C._dispatch_has_kernel_for_dispatch_key("aten::rms_norm", autocast_key("cuda")):
    follow_autocast("rms_norm", {"cuda": FLOAT32_RESULT})


# x and weight are saved, not rstd: it is recomputed (see plan.py's docstring).
register_formula(
    rms_norm,
    backward=rms_norm_backward,
    arguments=(GRAD, "x", "weight", "eps", needs_grad("weight")),
    gradients={"x": 0, "weight": 1},
)
