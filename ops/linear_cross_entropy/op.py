"""Linear cross entropy: the loss of a linear layer's logits, and its gradients, without the logits.

For rows x_n (N of them, H features), a weight W (V, H), a bias b (V,) or none, targets t_n and
label smoothing s:

    z_n    = W x_n + b                                  the row's V logits, rounded to x's dtype
    lse_n  = log(sum_c exp(z_nc))
    loss_n = (1 - s) (lse_n - z_n,t) + s (lse_n - sum_c z_nc / V)
    dz_nc  = (exp(z_nc - lse_n) - (1 - s) [c == t_n] - s / V) * g_n
    grad_x = dz W        grad_W = dz^T x        grad_b = sum_n dz_n

where g_n is the incoming gradient of row n's loss (for reduction="mean" divided by the number of
kept rows, for "sum" the same for every row).  A row whose target is ``ignore_index`` has loss 0
and gradient 0.  This is ``F.cross_entropy(F.linear(x, W, b).float(), t, ...)`` (its loss in
float32, float64 for float64 inputs), with no class weights.

The (N, V) logits are never held: the rows go in chunks (plan.py says how many rows), and for each
chunk the logits are computed into one reused buffer (a cuBLAS GEMM through torch, in x's dtype
with float32 accumulation, as F.linear computes them), one Triton kernel reads each row twice (its
max and sum online, then its gradient, written over the logits), and two more GEMMs turn the
chunk's dz into its rows of grad_x and its share of grad_W, summed in grad_W itself (float32
accumulation within each GEMM).  The memory a call holds beyond its inputs and results is one
chunk's logits, N floats of row losses, and for a vocabulary that is not a whole number of 16-byte
runs (GPT-2's 50257) a copy of the weight padded to one (plan.py: Tuning.pad_weight).

For "mean" and "sum" the gradients are computed in the forward, for g_n = 1, and the backward
multiplies them by the incoming gradient (a scalar): three GEMMs in all.  For "none" the gradient
of each row needs its own incoming gradient, so the forward computes the losses only and the
backward computes each chunk's logits again: four GEMMs.

    torch.ops.tk.linear_cross_entropy            the user-facing op: x (..., H) and target (...);
                                                 a composite over the forward op, which it asks for
                                                 the gradients its inputs need (none under no_grad)
    torch.ops.tk.linear_cross_entropy_forward    (loss, grad_x, grad_weight, grad_bias) for x (N, H);
                                                 a gradient not asked for is an empty tensor
    torch.ops.tk.linear_cross_entropy_backward   (grad_x, grad_weight, grad_bias) of reduction="none"
                                                 for the incoming per-row gradient

Out-of-range targets (not in [0, V) and not ``ignore_index``): PyTorch raises on the CPU and
asserts on CUDA; an op here cannot read the targets on the host without waiting for the GPU, so
instead the row's loss is NaN (so is a "mean" or "sum" over it) and so is its row of the logits'
gradient, which makes grad_W and grad_b NaN throughout.  No memory outside the logits is read.

Precision: the logits are rounded to x's dtype (as F.linear gives them); every sum, exp and log
after that is float32 (float64 for float64 inputs), and the logits' gradient is rounded to x's
dtype before the gradient GEMMs (as autograd through F.linear rounds it).  ``label_smoothing``
reaches the kernel as a float32 scalar, as every Python float argument of a Triton kernel does.
"""

import torch

from ..cross_entropy.op import check_options
from ..runtime import (
    LOWER_PRECISION,
    NAMESPACE,
    check_same,
    check_tensor,
    device_facts,
    follow_autocast,
    is_traced,
    launching_directly,
    register_op,
    run_direct,
)
from . import vocab_parallel
from .launch import run, scale_in_place, scaled
from .plan import TUNING, Meta, Tuning, choose_plan

# --------------------------------------------------------------------------
# Argument checks.
# --------------------------------------------------------------------------


def check_inputs(op: str, x, weight, target, bias, x_ndims=None, min_classes: int = 1) -> None:
    """x (..., H) float, weight (V, H) and bias (V,) of x's dtype, target (...) int64, one device;
    V at least `min_classes` (0 for one shard of a vocabulary, which may hold no class)."""
    check_tensor(op, "x", x, ndims=x_ndims)
    if x.dim() == 0:
        raise ValueError(f"tk.{op}: x must have at least one dimension (its last is the features), got a 0-D tensor")
    check_tensor(op, "weight", weight, ndims=(2,))
    check_same(op, {"x": x, "weight": weight})
    if weight.shape[1] != x.shape[-1]:
        raise ValueError(
            f"tk.{op}: x has shape {tuple(x.shape)} and weight has shape {tuple(weight.shape)}: weight must be "
            f"(V, {x.shape[-1]}), as nn.Linear keeps it (its features {weight.shape[1]} and x's {x.shape[-1]} differ)"
        )
    if weight.shape[0] < min_classes:
        raise ValueError(f"tk.{op}: weight has shape {tuple(weight.shape)}: there must be at least one class")
    if bias is not None:
        check_tensor(op, "bias", bias, ndims=(1,))
        check_same(op, {"x": x, "bias": bias})
        classes = weight.shape[0]
        if bias.shape[0] != classes:
            raise ValueError(
                f"tk.{op}: bias has shape {tuple(bias.shape)}; a weight of {classes} classes needs ({classes},)"
            )
    if isinstance(target, torch.Tensor) and target.is_floating_point():
        raise TypeError(
            f"tk.{op}: target has dtype {str(target.dtype).replace('torch.', '')}: class-probability targets "
            f"are not supported; pass int64 class indices"
        )
    check_tensor(op, "target", target, dtypes=(torch.int64,))
    if target.device != x.device:
        raise ValueError(f"tk.{op}: x is on {x.device} but target is on {target.device}")
    if tuple(target.shape) != tuple(x.shape[:-1]):
        raise ValueError(
            f"tk.{op}: target has shape {tuple(target.shape)}; x of shape {tuple(x.shape)} needs a target of shape "
            f"{tuple(x.shape[:-1])}"
        )


def describe(x: torch.Tensor, weight: torch.Tensor, reduction: str, label_smoothing: float, **wanted: bool) -> Meta:
    """The Meta of a call on x (N, H) and weight (V, H); `wanted`: Meta's loss, incoming, x_grad,
    weight_grad, bias_grad.  The one place that asks the device and the call context."""
    n_rows, hidden = x.shape
    return Meta(
        n_rows, hidden, weight.shape[0], x.element_size(), device_facts(x.device),
        reduction=reduction, smoothing=label_smoothing > 0, eager=launching_directly(), **wanted,
    )  # fmt: skip


# --------------------------------------------------------------------------
# The ops: checks -> describe -> plan -> launch.
# --------------------------------------------------------------------------


def forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    x_grad: bool = False,
    weight_grad: bool = False,
    bias_grad: bool = False,
    *,
    tuning: Tuning = TUNING,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """tk.linear_cross_entropy_forward planned with `tuning`: (loss, grad_x, grad_weight, grad_bias)
    of x (N, H), for an incoming gradient of 1.  x_grad, weight_grad, bias_grad: which gradients to
    compute ("mean" and "sum" only; "none" computes its gradients in the backward); the others are
    empty tensors.  The op's backward scales these gradients in place when autograd frees the graph
    after it (op.py: _scale_stored): a caller who keeps them past that sees them scaled."""
    op = "linear_cross_entropy_forward"
    check_inputs(op, x, weight, target, bias, x_ndims=(2,))
    check_options(op, reduction, label_smoothing)
    check_bias_grad(op, bias, bias_grad)
    now = reduction != "none"  # the gradients are computed here
    meta = describe(
        x, weight, reduction, label_smoothing,
        loss=True, incoming=False, x_grad=x_grad and now, weight_grad=weight_grad and now, bias_grad=bias_grad and now,
    )  # fmt: skip
    return run(choose_plan(meta, tuning), x, weight, target.contiguous(), bias, None, ignore_index, label_smoothing)


def backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    x_grad: bool = True,
    weight_grad: bool = True,
    bias_grad: bool = False,
    *,
    tuning: Tuning = TUNING,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tk.linear_cross_entropy_backward planned with `tuning`: (grad_x, grad_weight, grad_bias) of
    reduction="none" for the incoming gradient (N,) of the row losses, each chunk's logits computed
    again; a gradient not asked for is an empty tensor."""
    op = "linear_cross_entropy_backward"
    check_inputs(op, x, weight, target, bias, x_ndims=(2,))
    check_options(op, "none", label_smoothing)
    check_bias_grad(op, bias, bias_grad)
    check_tensor(op, "grad", grad, ndims=(1,))
    if grad.shape[0] != x.shape[0]:
        raise ValueError(
            f"tk.{op}: grad has shape {tuple(grad.shape)}; x of shape {tuple(x.shape)} needs ({x.shape[0]},)"
        )
    if grad.device != x.device:
        raise ValueError(f"tk.{op}: x is on {x.device} but grad is on {grad.device}")
    meta = describe(
        x, weight, "none", label_smoothing,
        loss=False, incoming=True, x_grad=x_grad, weight_grad=weight_grad, bias_grad=bias_grad,
    )  # fmt: skip
    _, grad_x, grad_weight, grad_bias = run(
        choose_plan(meta, tuning), x, weight, target.contiguous(), bias, grad, ignore_index, label_smoothing
    )
    return grad_x, grad_weight, grad_bias


def check_bias_grad(op: str, bias, bias_grad: bool) -> None:
    if bias is None and bias_grad:
        raise ValueError(f"tk.{op}: bias_grad=True asks for the gradient of a bias, but bias is None")


# The registered bodies: the entry points with the default tuning (the schema comes from these hints).
def _linear_cross_entropy_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    x_grad: bool,
    weight_grad: bool,
    bias_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return forward(x, weight, target, bias, ignore_index, reduction, label_smoothing, x_grad, weight_grad, bias_grad)


def _linear_cross_entropy_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    ignore_index: int,
    label_smoothing: float,
    x_grad: bool,
    weight_grad: bool,
    bias_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return backward(grad, x, weight, target, bias, ignore_index, label_smoothing, x_grad, weight_grad, bias_grad)


linear_cross_entropy_forward = register_op("linear_cross_entropy_forward", _linear_cross_entropy_forward)
linear_cross_entropy_backward = register_op("linear_cross_entropy_backward", _linear_cross_entropy_backward)


# --------------------------------------------------------------------------
# Autograd: one formula for the registered op and for the tuned Function below.
# --------------------------------------------------------------------------

_X, _WEIGHT, _BIAS = 0, 1, 3  # the differentiable inputs' places among the forward's arguments


def _save(ctx, inputs, output) -> None:
    """What the backward needs: the stored gradients ("mean", "sum"), or the inputs ("none")."""
    x, weight, target, bias, ignore_index, reduction, label_smoothing, x_grad, weight_grad, bias_grad = inputs
    _, grad_x, grad_weight, grad_bias = output
    ctx.reduction, ctx.computed = reduction, (x_grad, weight_grad, bias_grad)
    # The by-products get no gradient: autograd's default would hand the backward zeros the size of
    # each, the weight's gradient among them (525 MB at Llama 3's LM head in bf16, memory.md).
    ctx.set_materialize_grads(False)
    if reduction == "none":
        ctx.save_for_backward(x, weight, target, bias)
        ctx.options = (ignore_index, label_smoothing)
    else:
        ctx.save_for_backward(grad_x, grad_weight, grad_bias)


def _gradients(ctx, grad_loss, backward_none) -> tuple:
    """The gradients of (x, weight, target, bias): the stored ones times the incoming scalar
    (`_scale_stored`), or ("none") `backward_none(grad, x, weight, target, bias, ignore_index,
    label_smoothing, x_grad, weight_grad, bias_grad)`."""
    if grad_loss is None:  # grads are not materialized (_save): no gradient reached the loss
        return None, None, None, None
    needs = [ctx.needs_input_grad[i] for i in (_X, _WEIGHT, _BIAS)]
    if ctx.reduction == "none":
        x, weight, target, bias = ctx.saved_tensors
        grads = backward_none(grad_loss, x, weight, target, bias, *ctx.options, *needs)
    else:
        for name, need, computed in zip(("x", "weight", "bias"), needs, ctx.computed):
            if need and not computed:
                raise RuntimeError(
                    f"tk.linear_cross_entropy_forward: {name} needs a gradient, but the forward was called with "
                    f"{name}_grad=False; call tk.linear_cross_entropy, which asks for the gradients its inputs need"
                )
        grads = _scale_stored([g if need else None for g, need in zip(ctx.saved_tensors, needs)], grad_loss)
    grad_x, grad_weight, grad_bias = (g if need else None for g, need in zip(grads, needs))
    return grad_x, grad_weight, None, grad_bias


_keep_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", lambda: True)


def _scale_stored(stored: list, grad_loss: torch.Tensor) -> list:
    """The stored gradients (None: not needed) times the incoming scalar.

    In place where nothing can read them again: an eager backward after which autograd frees the
    graph (no retain_graph).  The gradient returned is then the buffer the forward wrote, which
    autograd makes the parameter's .grad as it is, so a training step holds the weight's gradient
    once, not twice (V x H elements: 525 MB at Llama 3's LM head in bf16, perf-notes version 49).
    Out of place otherwise: a retained graph reads them again (gradcheck does), create_graph=True
    records the product (grad mode is on in such a backward), and a traced backward leaves the reuse
    of a dead buffer to Inductor.  The forward op's caller who kept its by-products sees them scaled,
    as the forward op's docstring says."""
    if _keep_graph() or torch.is_grad_enabled() or is_traced([*stored, grad_loss]):
        return [None if g is None else scaled(g, grad_loss) for g in stored]
    # Eager by the test above, so launched directly: wrap_triton's eager dispatch costs host time a launch.
    return [None if g is None else run_direct(scale_in_place, (g, grad_loss), {}) for g in stored]


def _setup_context(ctx, inputs, output):
    ctx.mark_non_differentiable(*output[1:])  # the stored gradients: by-products, no gradient flows through them
    _save(ctx, inputs, output)


def _backward(ctx, grad_loss, *_):
    return *_gradients(ctx, grad_loss, torch.ops.tk.linear_cross_entropy_backward), *(None,) * 6


linear_cross_entropy_forward.register_autograd(_backward, setup_context=_setup_context)


# The user-facing op.  A CompositeImplicitAutograd kernel runs *above* autograd: autograd, fake
# tensors and torch.compile all see the forward op it calls, with the gradients it asks for.
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
_LIBRARY.define(
    "linear_cross_entropy(Tensor x, Tensor weight, Tensor target, Tensor? bias=None, int ignore_index=-100, "
    "str reduction='mean', float label_smoothing=0.0) -> Tensor"
)


def linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """``F.cross_entropy(F.linear(x, weight, bias).float(), target, ignore_index=, reduction=,
    label_smoothing=)`` for x (..., H) and target (...), without the logits.  The gradients are
    computed for the inputs that require them, and none under no_grad."""
    op = "linear_cross_entropy"
    check_inputs(op, x, weight, target, bias)
    check_options(op, reduction, label_smoothing)
    if vocab_parallel.applies(weight, bias):  # tensor parallelism's lm_head: the weight stays sharded
        return vocab_parallel.linear_cross_entropy(x, weight, target, bias, ignore_index, reduction, label_smoothing)
    grad = torch.is_grad_enabled()
    wanted = (grad and x.requires_grad, grad and weight.requires_grad, grad and bias is not None and bias.requires_grad)
    loss, _, _, _ = torch.ops.tk.linear_cross_entropy_forward(
        x.reshape(-1, x.shape[-1]), weight, target.reshape(-1), bias, ignore_index, reduction, label_smoothing, *wanted
    )
    return loss.reshape(target.shape) if reduction == "none" else loss


_LIBRARY.impl("linear_cross_entropy", linear_cross_entropy, "CompositeImplicitAutograd")

# Under autocast, F.linear runs in the autocast dtype (x, weight and bias cast, differentiably, so
# float32 parameters get float32 gradients) and cross entropy in float32, as the kernel computes.
follow_autocast("linear_cross_entropy", {"cuda": LOWER_PRECISION, "cpu": LOWER_PRECISION})


# --------------------------------------------------------------------------
# Another tuning, for tests and the harness's curve of chunk sizes.
# --------------------------------------------------------------------------


def linear_cross_entropy_with_tuning(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    *,
    tuning: Tuning,
) -> torch.Tensor:
    """linear_cross_entropy, loss and gradients, planned with `tuning`: a plain autograd.Function
    over forward and backward, with the registered op's formula (torch.compile and the native lane
    see the registered ops only)."""
    check_inputs("linear_cross_entropy", x, weight, target, bias)
    options = (ignore_index, reduction, label_smoothing, tuning)
    loss = _TunedLinearCrossEntropy.apply(x.reshape(-1, x.shape[-1]), weight, target.reshape(-1), bias, *options)
    return loss.reshape(target.shape) if reduction == "none" else loss


class _TunedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, target, bias, ignore_index, reduction, label_smoothing, tuning):
        needs = ctx.needs_input_grad
        wanted = (needs[_X], needs[_WEIGHT], bias is not None and needs[_BIAS])
        inputs = (x, weight, target, bias, ignore_index, reduction, label_smoothing, *wanted)
        output = run_direct(forward, inputs, {"tuning": tuning})  # launched as the registered op's eager calls
        _save(ctx, inputs, output)
        ctx.tuning = tuning
        return output[0]

    @staticmethod
    def backward(ctx, grad_loss):
        def backward_none(*args):
            return run_direct(backward, args, {"tuning": ctx.tuning})

        return *_gradients(ctx, grad_loss, backward_none), None, None, None, None
