"""tk's multi-design ops planned with another ``Tuning``, differentiable: how tests reach every design.

The registered ops always plan with their op's default ``TUNING``; each op folder has Python entry
points that take ``tuning=`` (ops/softmax/op.py, ops/norms/layer_norm.py...).  These wrappers put an
entry point's forward and backward into one ``torch.autograd.Function``, with the registered op's
formula, so a test can compare values and gradients of a design that small tensors would not reach with
the default constants.  ``eager=True`` runs them as an eager call of the registered op runs its body
(``run_direct``): on CUDA that is what lets the plan take the Gluon kernels and overlap a fill.
"""

import torch

from ops.norms import layer_norm as layer_norm_entry, rms_norm as rms_norm_entry
from ops.runtime.direct import run_direct
from ops.softmax import op as softmax_entry


def _call(fn, args, kwargs, eager):
    return run_direct(fn, args, kwargs) if eager else fn(*args, **kwargs)


class _Softmax(torch.autograd.Function):
    """softmax's formula: dx = backward(dy, y, dim, x's dtype), by the entry points with one tuning."""

    @staticmethod
    def forward(ctx, x, dim, dtype, tuning, eager):
        y = _call(softmax_entry.forward, (x, dim, dtype), {"tuning": tuning}, eager)
        ctx.save_for_backward(y)
        ctx.dim, ctx.input_dtype, ctx.tuning, ctx.eager = dim, x.dtype, tuning, eager
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        dx = _call(softmax_entry.backward, (grad, y, ctx.dim, ctx.input_dtype), {"tuning": ctx.tuning}, ctx.eager)
        return dx, None, None, None, None


def softmax(tuning, *, eager: bool = False):
    """fn(x, dim, dtype=None): tk's softmax planned with `tuning`, forward and backward."""
    return lambda x, dim, dtype=None: _Softmax.apply(x, dim, dtype, tuning, eager)


class _Norm(torch.autograd.Function):
    """A norm's formula (x and weight saved; the backward entry point's gradients where asked)."""

    @staticmethod
    def forward(ctx, op, tuning, eps, dtype, normalized_shape, x, weight, bias):
        ctx.op, ctx.tuning, ctx.eps, ctx.normalized_shape = op, tuning, eps, normalized_shape
        ctx.save_for_backward(x, weight)
        if op == "rms_norm":
            return rms_norm_entry.forward(x, weight, eps, dtype, tuning=tuning)
        return layer_norm_entry.forward(x, normalized_shape, weight, bias, eps, dtype, tuning=tuning)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        weight_grad, bias_grad = ctx.needs_input_grad[6:8]
        if ctx.op == "rms_norm":
            dx, dw = rms_norm_entry.backward(grad, x, weight, ctx.eps, weight_grad, tuning=ctx.tuning)
            db = None
        else:
            dx, dw, db = layer_norm_entry.backward(
                grad, x, ctx.normalized_shape, weight, ctx.eps, weight_grad, bias_grad, tuning=ctx.tuning
            )
        return None, None, None, None, None, dx, dw if weight_grad else None, db if bias_grad else None


def norm(op: str, tuning, eps: float, dtype=None, normalized_shape=None):
    """fn(x, weight, bias): tk's `op` ("rms_norm" over the last dim, or "layer_norm" over
    `normalized_shape`, the last dim if None) planned with `tuning`, differentiable."""

    def fn(x, weight, bias):
        shape = list(normalized_shape) if normalized_shape is not None else [x.shape[-1]]
        return _Norm.apply(op, tuning, eps, dtype, shape, x, weight, bias if op == "layer_norm" else None)

    return fn
