"""Layer norm over the trailing dims: ``torch.ops.tk.layer_norm`` and its backward.

The math and the designs are in plan.py's docstring.  This file checks the
arguments, describes the call, plans it and runs the plan (plan.py, launch.py),
in ``forward`` and ``backward``, which take a ``tuning`` (tests pass smaller
ones); the registered ops call them with the measured TUNING.
"""

from typing import Optional

import torch

from ..runtime import (
    FLOAT32_RESULT,
    GRAD,
    check_tensor,
    follow_autocast,
    needs_grad,
    register_formula,
    register_op,
)
from .checks import _contiguous, _normalized_size, check_grad, check_param, norm_dtype
from .launch import run_backward, run_forward
from .plan import TUNING, Tuning, choose_backward_plan, choose_forward_plan, describe_backward, describe_forward

CENTERED = True  # layer norm subtracts the mean (RMS norm is the same plan without)


def forward(x, normalized_shape, weight=None, bias=None, eps=1e-5, dtype=None, *, tuning: Tuning = TUNING):
    """As F.layer_norm; `dtype` (None: x's) may be float32 for a 16-bit x, which is then read as it is."""
    check_tensor("layer_norm", "x", x)
    dtype = norm_dtype("layer_norm", x, dtype)
    n_cols = _normalized_size("layer_norm", x, normalized_shape)
    check_param("layer_norm", "weight", weight, x, normalized_shape)
    check_param("layer_norm", "bias", bias, x, normalized_shape)
    if bias is not None and bias.dtype != (x if weight is None else weight).dtype:
        # The backward sees the weight, not the bias, and gives dbias the weight's dtype (x's without one).
        raise TypeError(
            f"tk.layer_norm: bias has dtype {bias.dtype} but "
            + (f"weight has dtype {weight.dtype}" if weight is not None else f"there is no weight and x has dtype {x.dtype}")
            + "; give them one dtype"
        )
    x, weight, bias = x.contiguous(), _contiguous(weight), _contiguous(bias)
    plan = choose_forward_plan(describe_forward(CENTERED, x, n_cols), tuning)
    return run_forward(plan, x, weight, bias, eps, dtype)


def backward(grad, x, normalized_shape, weight, eps, weight_grad, bias_grad, *, tuning: Tuning = TUNING):
    """(dx, dweight, dbias).  dx has x's dtype, grad may be float32 for a 16-bit x (a result asked
    for in float32).  dweight (dbias) has normalized_shape when weight_grad (bias_grad) is True,
    and is an empty tensor otherwise: an op cannot return None."""
    check_grad("layer_norm_backward", grad, x)
    n_cols = _normalized_size("layer_norm_backward", x, normalized_shape)
    check_param("layer_norm_backward", "weight", weight, x, normalized_shape)
    if weight_grad and weight is None:
        raise ValueError("tk.layer_norm_backward: weight_grad=True needs the weight")
    grad, x, weight = grad.contiguous(), x.contiguous(), _contiguous(weight)
    plan = choose_backward_plan(describe_backward(CENTERED, grad, x, n_cols), tuning)
    dx, dw, db = run_backward(plan, grad, x, weight, eps, weight_grad, bias_grad, tuple(normalized_shape))
    return dx, x.new_empty(0) if dw is None else dw, x.new_empty(0) if db is None else db


def _layer_norm(
    x: torch.Tensor,
    normalized_shape: list[int],
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
    dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    """tk.layer_norm: forward with the measured tuning."""
    return forward(x, normalized_shape, weight, bias, eps, dtype)


def _layer_norm_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    normalized_shape: list[int],
    weight: Optional[torch.Tensor],
    eps: float,
    weight_grad: bool,
    bias_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tk.layer_norm_backward: backward with the measured tuning."""
    return backward(grad, x, normalized_shape, weight, eps, weight_grad, bias_grad)


layer_norm = register_op("layer_norm", _layer_norm)
layer_norm_backward = register_op("layer_norm_backward", _layer_norm_backward)
# Under autocast, as F.layer_norm: a float32 result on CUDA (x read as it is, weight and
# bias cast to float32), inputs as they come on the CPU.
follow_autocast("layer_norm", {"cuda": FLOAT32_RESULT})


# x and weight are saved; mean and rstd are recomputed (see plan.py's docstring).
register_formula(
    layer_norm,
    backward=layer_norm_backward,
    arguments=(GRAD, "x", "normalized_shape", "weight", "eps", needs_grad("weight"), needs_grad("bias")),
    gradients={"x": 0, "weight": 1, "bias": 2},
)
