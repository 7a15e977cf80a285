"""Cross entropy of logits against class indices, forward and backward, fused.

For a row x of C logits, its target class t and label smoothing s:

    lse    = log(sum_c exp(x_c))                      the row's logsumexp
    loss   = (1 - s) * (lse - x_t) + s * (lse - sum_c x_c / C)
    dx_c   = (exp(x_c - lse) - (1 - s) * [c == t] - s / C) * g

where g is the incoming gradient of the row's loss (divided by the number
of kept rows for reduction="mean").  A row whose target is ``ignore_index``
has loss 0 and gradient 0, and is not even read.  This is
``torch.nn.functional.cross_entropy`` for (N, C) logits (or unbatched (C,)
logits) and int64 targets, without class weights.

The softmax is never materialized.  With vocabularies of 128k+ columns a
row is too long for one block, so the forward runs one program per row
that sweeps the row once in chunks, keeping a running maximum m and a
running sum of exp(x - m), rescaled by exp(m_old - m_new) whenever the
maximum grows (the *online* logsumexp).  x_t is a single extra load.  Rows
of a few hundred classes are stacked several to a program instead, in both
directions.  The forward writes each row's loss and its logsumexp; the
backward reads the logits once more and recomputes exp(x - lse) from the
saved logsumexp, so a training step reads the logits twice and writes the
gradient once, the least a backward that cannot keep the logits on chip can
do.  (Its long rows that start off a 16-byte boundary, as every 50257-class
row but one in eight does, are swept from the boundary: see _sweep_peeled.)

    torch.ops.tk.cross_entropy            the user-facing op; a thin composite
                                          over the two ops below, so that
                                          autograd sees the forward op and can
                                          keep its logsumexp
    torch.ops.tk.cross_entropy_forward    (loss, lse); lse is not differentiable
    torch.ops.tk.cross_entropy_backward   dlogits from (grad, logits, target, lse)

Out-of-range targets (not in [0, C) and not ``ignore_index``): PyTorch raises
on the CPU and asserts on CUDA; an op here cannot read the targets on the
host, so instead the row's loss is NaN (so are a "mean" or "sum" over it) and
so is its gradient.  No memory outside the row is read.

Precision: logits are read in their dtype and every sum, exp and log is done
in float32 (float64 for float64 logits).  The saved logsumexp is a float32
number (as in flash attention), so the recomputed softmax carries a relative
error of about |lse| * 6e-8: 1e-6 for logits of magnitude 20.  On a GPU exp
flushes results under 2**-126 to 0 (ops/blocks/fastmath.py): a gradient's probabilities
that small come out 0.
``label_smoothing`` reaches the kernels as a float32 scalar, as every Python
float argument of a Triton kernel does: exact for values such as 0.25,
within 1e-8 for 0.1.
"""

import torch

from ..runtime import (
    FLOAT32_RESULT,
    NAMESPACE,
    check_tensor,
    device_facts,
    follow_autocast,
    register_op,
    result_dtype,
)
from .kernels import REDUCTIONS
from .launch import compute_dtype, run_backward, run_forward
from .plan import TUNING, Meta, Tuning, choose_backward_plan, choose_forward_plan

# --------------------------------------------------------------------------
# Argument checks.
# --------------------------------------------------------------------------


def check_options(op: str, reduction: str, label_smoothing: float) -> None:
    """reduction and label_smoothing as F.cross_entropy takes them (linear_cross_entropy checks its own so too)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"tk.{op}: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:  # NaN fails too
        raise ValueError(f"tk.{op}: label_smoothing must be between 0.0 and 1.0, got {label_smoothing}")


def _check_logits_and_target(op: str, logits, target, logits_ndims=(2,)) -> None:
    """logits (N, C) float, target (N,) int64 class indices, one device."""
    if isinstance(logits, torch.Tensor) and logits.dim() not in logits_ndims:
        shapes = " or ".join({1: "(C,)", 2: "(N, C)"}[n] for n in logits_ndims)
        raise ValueError(
            f"tk.{op}: logits must be {shapes}, got shape {tuple(logits.shape)}; flatten (B, T, C) logits to "
            f"(B*T, C) and their targets to (B*T,) (F.cross_entropy would read dim 1 of a 3-D input as the classes)"
        )
    check_tensor(op, "logits", logits)
    if isinstance(target, torch.Tensor) and target.is_floating_point():
        raise TypeError(
            f"tk.{op}: target has dtype {str(target.dtype).replace('torch.', '')}: class-probability targets "
            f"are not supported; pass int64 class indices"
        )
    check_tensor(op, "target", target, dtypes=(torch.int64,))
    if target.device != logits.device:
        raise ValueError(f"tk.{op}: logits is on {logits.device} but target is on {target.device}")
    if tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"tk.{op}: target has shape {tuple(target.shape)}; logits of shape {tuple(logits.shape)} "
            f"need a target of shape {tuple(logits.shape[:-1])}"
        )
    if logits.shape[-1] == 0:
        raise ValueError(f"tk.{op}: logits has shape {tuple(logits.shape)}: there must be at least one class")


def _rows_view(logits: torch.Tensor) -> torch.Tensor:
    """logits with unit column stride (a row-sliced view, such as a padded
    vocabulary cut to C columns, is kept as it is; other layouts are copied)."""
    return logits if logits.stride(1) == 1 else logits.contiguous()


def describe(logits: torch.Tensor, reduction: str, label_smoothing: float) -> Meta:
    """The Meta of a call on `logits` (already with unit column stride): the one place that asks
    the device."""
    n_rows, n_cols = logits.shape
    return Meta(
        n_rows, n_cols, logits.stride(0), logits.element_size(), device_facts(logits.device),
        reduction=reduction, smoothing=label_smoothing > 0,
    )  # fmt: skip


# --------------------------------------------------------------------------
# The ops: checks -> describe -> plan -> launch.
# --------------------------------------------------------------------------


def forward(
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    dtype: torch.dtype | None = None,
    *,
    tuning: Tuning = TUNING,
) -> tuple[torch.Tensor, torch.Tensor]:
    """tk.cross_entropy_forward planned with `tuning`: (loss, lse) of (N, C) logits.

    ``dtype``: the loss's (the logits' if None).  16-bit logits with dtype float32 give
    what F.cross_entropy of float32 logits gives (the kernels compute in float32 either
    way), without a float32 copy of the logits: what autocast asks for."""
    op = "cross_entropy_forward"
    _check_logits_and_target(op, logits, target)
    check_options(op, reduction, label_smoothing)
    loss_dtype = result_dtype(op, "dtype", dtype, logits.dtype)
    logits, target = _rows_view(logits), target.contiguous()
    plan = choose_forward_plan(describe(logits, reduction, label_smoothing), tuning)
    return run_forward(plan, logits, target, ignore_index, label_smoothing, loss_dtype)


def backward(
    grad: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    lse: torch.Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    *,
    tuning: Tuning = TUNING,
) -> torch.Tensor:
    """tk.cross_entropy_backward planned with `tuning`: dlogits from the incoming gradient of the
    loss (N,) or () and the forward's lse."""
    op = "cross_entropy_backward"
    _check_logits_and_target(op, logits, target)
    check_options(op, reduction, label_smoothing)
    check_tensor(op, "grad", grad)
    check_tensor(op, "lse", lse, dtypes=(compute_dtype(logits.dtype),))
    n_rows = logits.shape[0]
    grad_shape = (n_rows,) if reduction == "none" else ()
    if tuple(grad.shape) != grad_shape:
        raise ValueError(f"tk.{op}: grad has shape {tuple(grad.shape)}; reduction={reduction!r} needs {grad_shape}")
    if tuple(lse.shape) != (n_rows,):
        raise ValueError(f"tk.{op}: lse has shape {tuple(lse.shape)}, expected ({n_rows},)")
    for name, t in (("grad", grad), ("lse", lse)):
        if t.device != logits.device:
            raise ValueError(f"tk.{op}: logits is on {logits.device} but {name} is on {t.device}")
    logits, target, lse = _rows_view(logits), target.contiguous(), lse.contiguous()
    plan = choose_backward_plan(describe(logits, reduction, label_smoothing), tuning)
    return run_backward(plan, grad, logits, target, lse, ignore_index, label_smoothing)


# The registered bodies: the entry points with the default tuning (the schema comes from these hints).
def _cross_entropy_forward(
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return forward(logits, target, ignore_index, reduction, label_smoothing, dtype)


def _cross_entropy_backward(
    grad: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    lse: torch.Tensor,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
) -> torch.Tensor:
    return backward(grad, logits, target, lse, ignore_index, reduction, label_smoothing)


cross_entropy_forward = register_op("cross_entropy_forward", _cross_entropy_forward)
cross_entropy_backward = register_op("cross_entropy_backward", _cross_entropy_backward)


def _setup_context(ctx, inputs, output):
    logits, target, ignore_index, reduction, label_smoothing, _ = inputs
    _, lse = output
    ctx.save_for_backward(logits, target, lse)
    ctx.mark_non_differentiable(lse)  # an internal by-product: no gradient flows through it
    ctx.options = (ignore_index, reduction, label_smoothing)


def _backward(ctx, grad_loss, grad_lse):
    logits, target, lse = ctx.saved_tensors
    dlogits = None
    if ctx.needs_input_grad[0]:
        dlogits = torch.ops.tk.cross_entropy_backward(grad_loss, logits, target, lse, *ctx.options)
    return dlogits, None, None, None, None, None  # an integer target has no gradient


cross_entropy_forward.register_autograd(_backward, setup_context=_setup_context)


# The user-facing op.  A CompositeImplicitAutograd kernel runs *above*
# autograd: autograd, fake tensors and torch.compile all see the
# cross_entropy_forward op it calls, so the logsumexp is saved for the
# backward while the caller gets the loss only.
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
_LIBRARY.define(
    "cross_entropy(Tensor logits, Tensor target, int ignore_index=-100, str reduction='mean', "
    "float label_smoothing=0.0, ScalarType? dtype=None) -> Tensor"
)


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``F.cross_entropy(logits, target, ignore_index=, reduction=, label_smoothing=)``
    for (N, C) logits with (N,) targets, or unbatched (C,) logits with a 0-d target.
    ``dtype``: the loss's (the logits' if None), see forward."""
    _check_logits_and_target("cross_entropy", logits, target, logits_ndims=(1, 2))
    check_options("cross_entropy", reduction, label_smoothing)
    result_dtype("cross_entropy", "dtype", dtype, logits.dtype)
    options = (ignore_index, reduction, label_smoothing, dtype)
    if logits.dim() == 1:  # unbatched: a batch of one row
        loss, _ = torch.ops.tk.cross_entropy_forward(logits.unsqueeze(0), target.unsqueeze(0), *options)
        return loss.squeeze(0) if reduction == "none" else loss
    loss, _ = torch.ops.tk.cross_entropy_forward(logits, target, *options)
    return loss


_LIBRARY.impl("cross_entropy", cross_entropy, "CompositeImplicitAutograd")


# Under autocast, F.cross_entropy casts the logits to float32 on either device.
# tk asks for a float32 loss instead, which gives the same numbers: the kernels
# read 16-bit logits as they are and compute in float32 anyway, so the float32
# copy PyTorch makes (6 bytes an element, 4 of them kept for the backward: 4 GB
# at 8192x128256) is never made, and the gradient comes back in the logits' dtype.
follow_autocast("cross_entropy", {"cuda": FLOAT32_RESULT, "cpu": FLOAT32_RESULT})


def cross_entropy_with_tuning(
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    dtype: torch.dtype | None = None,
    *,
    tuning: Tuning,
) -> torch.Tensor:
    """cross_entropy, loss and gradient, planned with `tuning`: for tests and probes that take
    another design eagerly (a plain autograd.Function over forward and backward; torch.compile
    and the native lane see the registered ops only)."""
    options = (ignore_index, reduction, label_smoothing, dtype, tuning)
    if logits.dim() == 1:  # unbatched: a batch of one row, as in cross_entropy
        loss = _TunedCrossEntropy.apply(logits.unsqueeze(0), target.unsqueeze(0), *options)
        return loss.squeeze(0) if reduction == "none" else loss
    return _TunedCrossEntropy.apply(logits, target, *options)


class _TunedCrossEntropy(torch.autograd.Function):
    """forward, then backward from its saved lse, as the registered ops' autograd formula does."""

    @staticmethod
    def forward(ctx, logits, target, ignore_index, reduction, label_smoothing, dtype, tuning):
        loss, lse = forward(logits, target, ignore_index, reduction, label_smoothing, dtype, tuning=tuning)
        ctx.save_for_backward(logits, target, lse)
        ctx.options, ctx.tuning = (ignore_index, reduction, label_smoothing), tuning
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        logits, target, lse = ctx.saved_tensors
        dlogits = backward(grad_loss, logits, target, lse, *ctx.options, tuning=ctx.tuning)
        return dlogits, None, None, None, None, None, None
