"""Layer norm over the trailing dims: ``torch.ops.tk.layer_norm`` and its backward.

The math and the designs are in engine.py's docstring; this file checks the
arguments and registers the ops.
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
from .engine import LAYER_NORM_KERNELS, normalize, normalize_backward


def _layer_norm(
    x: torch.Tensor,
    normalized_shape: list[int],
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
    dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
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
    return normalize(LAYER_NORM_KERNELS, x.contiguous(), _contiguous(weight), _contiguous(bias), eps, n_cols, dtype)


def _layer_norm_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    normalized_shape: list[int],
    weight: Optional[torch.Tensor],
    eps: float,
    weight_grad: bool,
    bias_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight, dbias).  dx has x's dtype, grad may be float32 for a 16-bit x (a result asked
    for in float32).  dweight (dbias) has normalized_shape when weight_grad (bias_grad) is True,
    and is an empty tensor otherwise: an op cannot return None."""
    check_grad("layer_norm_backward", grad, x)
    n_cols = _normalized_size("layer_norm_backward", x, normalized_shape)
    check_param("layer_norm_backward", "weight", weight, x, normalized_shape)
    if weight_grad and weight is None:
        raise ValueError("tk.layer_norm_backward: weight_grad=True needs the weight")
    dx, dw, db = normalize_backward(
        LAYER_NORM_KERNELS, grad.contiguous(), x.contiguous(), _contiguous(weight), eps, n_cols,
        weight_grad, bias_grad, tuple(normalized_shape),
    )  # fmt: skip
    return dx, x.new_empty(0) if dw is None else dw, x.new_empty(0) if db is None else db


layer_norm = register_op("layer_norm", _layer_norm)
layer_norm_backward = register_op("layer_norm_backward", _layer_norm_backward)
# Under autocast, as F.layer_norm: a float32 result on CUDA (x read as it is, weight and
# bias cast to float32), inputs as they come on the CPU.
follow_autocast("layer_norm", {"cuda": FLOAT32_RESULT})


# x and weight are saved; mean and rstd are recomputed (see the module docstring).
register_formula(
    layer_norm,
    backward=layer_norm_backward,
    arguments=(GRAD, "x", "normalized_shape", "weight", "eps", needs_grad("weight"), needs_grad("bias")),
    gradients={"x": 0, "weight": 1, "bias": 2},
)
