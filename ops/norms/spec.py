"""What the comparison harness reads about layer norm and RMS norm."""

import math

import torch
import torch.nn.functional as F

from ..spec import OpSpec, model, register_spec

# --------------------------------------------------------------------------
# Layer norm.
# --------------------------------------------------------------------------

EPS = 1e-5  # F.layer_norm's default


def _make_inputs(shape, dtype, device):
    """x, and a fixed weight and bias near PyTorch's initial ones (1 and 0), not equal to them."""
    n = shape[-1]
    weight = 1 + 0.1 * torch.randn(n, dtype=dtype, device=device)
    bias = 0.1 * torch.randn(n, dtype=dtype, device=device)
    return torch.randn(shape, dtype=dtype, device=device), weight, bias


def _liger_layer_norm():
    from liger_kernel.transformers.functional import liger_layer_norm  # optional peer

    return lambda x, weight, bias: liger_layer_norm(x, weight, bias, EPS)


# cuda: from launch-bound (2 MB in bfloat16) to hundreds of MB; (16384, 8192)
# and (4096, 32768) move the same bytes through the short- and long-row designs.
NORM_SHAPES = {
    "cuda": [(1024, 1024), (65536, 256), (16384, 2048), (4096, 4096), (16384, 4096), (8192, 8192), (16384, 8192), (4096, 32768)],
    "cpu": [(64, 1000), (4, 70_001)],
    # (tokens, hidden) of real models (ops/spec.py), and a row as long as GPT-2's vocabulary
    "real": [(tokens, model(name).hidden) for tokens, name in ((4095, "gpt2"), (8191, "gpt2-xl"), (1000, "gpt2-large"),
             (8191, "llama3-8b"), (4095, "llama2-13b"), (1000, "qwen2-7b"), (4095, "phi-2"), (8191, "phi-3-mini"),
             (1000, "llama3-70b"))] + [(4096, model("gpt2").vocab)],
}
NORM_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float64: 1e-7}

register_spec(
    OpSpec(
        name="layer_norm",
        tk=lambda x, weight, bias: torch.ops.tk.layer_norm(x, [x.shape[-1]], weight, bias, EPS),
        reference=lambda x, weight, bias: F.layer_norm(x, (x.shape[-1],), weight, bias, EPS),
        make_inputs=_make_inputs,
        # read x, write y, read weight and bias
        bytes_moved=lambda shape, dtype: (2 * math.prod(shape) + 2 * shape[-1]) * torch.empty((), dtype=dtype).element_size(),
        # sum; subtract, square, sum; subtract, scale by rstd; times w, plus b
        flops=lambda shape, dtype: 8 * math.prod(shape),
        tolerance=NORM_TOLERANCE,
        shapes=NORM_SHAPES,
        peers={"liger": _liger_layer_norm},
    )
)


def _make_backward_inputs(shape, dtype, device):
    """grad, x, weight, bias, and the mean and rstd PyTorch's forward saves for its backward
    (tk recomputes them: see the module docstring)."""
    x, weight, bias = _make_inputs(shape, dtype, device)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [shape[-1]], weight, bias, EPS)
    return torch.randn(shape, dtype=dtype, device=device), x, weight, bias, mean, rstd


# The backward on its own, every gradient asked for: (dx, dweight, dbias), against the
# aten kernel eager autograd runs (with the statistics its forward saved) and Inductor's.
register_spec(
    OpSpec(
        name="layer_norm_backward",
        tk=lambda grad, x, weight, bias, mean, rstd: torch.ops.tk.layer_norm_backward(
            grad, x, [x.shape[-1]], weight, EPS, True, True
        ),
        reference=lambda grad, x, weight, bias, mean, rstd: torch.ops.aten.native_layer_norm_backward(
            grad, x, [x.shape[-1]], mean, rstd, weight, bias, [True, True, True]
        ),
        make_inputs=_make_backward_inputs,
        # read grad and x, write dx; read weight, write dweight and dbias
        bytes_moved=lambda shape, dtype: (3 * math.prod(shape) + 3 * shape[-1]) * torch.empty((), dtype=dtype).element_size(),
        # xhat (2), g = dy * w, the two row sums (4), dx (4), dweight and dbias (3)
        flops=lambda shape, dtype: 13 * math.prod(shape),
        tolerance=NORM_TOLERANCE,
        shapes=NORM_SHAPES,
    )
)


# --------------------------------------------------------------------------
# RMS norm.
# --------------------------------------------------------------------------

RMS_EPS = 1e-6  # a common choice for RMS norm in transformers


def _make_rms_inputs(shape, dtype, device):
    """x, and a fixed weight near PyTorch's initial one (1), not equal to it."""
    weight = 1 + 0.1 * torch.randn(shape[-1], dtype=dtype, device=device)
    return torch.randn(shape, dtype=dtype, device=device), weight


def _liger_rms_norm():
    from liger_kernel.transformers.functional import liger_rms_norm  # optional peer

    return lambda x, weight: liger_rms_norm(x, weight, RMS_EPS, in_place=False)


register_spec(
    OpSpec(
        name="rms_norm",
        tk=lambda x, weight: torch.ops.tk.rms_norm(x, weight, RMS_EPS),
        reference=lambda x, weight: F.rms_norm(x, (x.shape[-1],), weight, RMS_EPS),
        make_inputs=_make_rms_inputs,
        # read x, write y, read weight
        bytes_moved=lambda shape, dtype: (2 * math.prod(shape) + shape[-1]) * torch.empty((), dtype=dtype).element_size(),
        # square and sum; scale by rstd; times w
        flops=lambda shape, dtype: 4 * math.prod(shape),
        tolerance=NORM_TOLERANCE,
        shapes=NORM_SHAPES,
        peers={"liger": _liger_rms_norm},
    )
)


def _make_rms_backward_inputs(shape, dtype, device):
    """grad, x, weight, and the rstd PyTorch's fused forward saves for its backward
    (tk recomputes it: see plan.py's docstring)."""
    x, weight = _make_rms_inputs(shape, dtype, device)
    _, rstd = torch.ops.aten._fused_rms_norm(x, [shape[-1]], weight, RMS_EPS)
    return torch.randn(shape, dtype=dtype, device=device), x, weight, rstd


def _rms_backward_formula(grad, x, weight, _saved_rstd):
    """(dx, dweight) from the module docstring's formulas, composed of PyTorch ops; rstd recomputed
    (in float64 for the float64 reference), the saved one left unused."""
    x32 = x.float() if x.dtype != torch.float64 else x
    rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + RMS_EPS)
    xhat, dy = x32 * rstd, grad.to(x32.dtype)
    g = dy * weight.to(x32.dtype)
    dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
    dweight = (dy * xhat).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dweight.to(weight.dtype)


def _rms_eager_backward(grad, x, weight, rstd):
    """What eager autograd runs for F.rms_norm: on CUDA, aten's fused backward with the saved rstd;
    elsewhere F.rms_norm is a composition of ops, whose gradients the formula composes too."""
    if x.is_cuda:
        return torch.ops.aten._fused_rms_norm_backward(grad, x, [x.shape[-1]], rstd, weight, [True, True])
    return _rms_backward_formula(grad, x, weight, rstd)


# The backward on its own, both gradients asked for: (dx, dweight).
register_spec(
    OpSpec(
        name="rms_norm_backward",
        tk=lambda grad, x, weight, rstd: torch.ops.tk.rms_norm_backward(grad, x, weight, RMS_EPS, True),
        reference=_rms_eager_backward,
        reference64=_rms_backward_formula,
        make_inputs=_make_rms_backward_inputs,
        # read grad and x, write dx; read weight, write dweight
        bytes_moved=lambda shape, dtype: (3 * math.prod(shape) + 2 * shape[-1]) * torch.empty((), dtype=dtype).element_size(),
        # xhat, g = dy * w, the row sum (2), dx (3), dweight (2)
        flops=lambda shape, dtype: 9 * math.prod(shape),
        tolerance=NORM_TOLERANCE,
        shapes=NORM_SHAPES,
    )
)
