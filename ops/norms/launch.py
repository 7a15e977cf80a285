"""Running a norm's plan (plan.py): outputs and scratch allocated, kernels launched, nothing decided.

Both ops run the same designs; a plan's `centered` picks layer norm's kernels
or RMS norm's.  Every launch goes through the runtime's ``launcher``.
"""

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from ..blocks.held_rows import held_rows_scratch, register_capped
from ..blocks.sizes import cdiv
from ..runtime import launcher
from .held import layer_norm_backward_held_kernel, rms_norm_backward_held_kernel
from .kernels import (
    _STATS,
    column_sum_kernel,
    layer_norm_backward_columns_kernel,
    layer_norm_backward_kernel,
    layer_norm_backward_stats_kernel,
    layer_norm_forward_framed_kernel,
    layer_norm_forward_kernel,
    layer_norm_forward_long_rows_kernel,
    rms_norm_backward_columns_kernel,
    rms_norm_backward_kernel,
    rms_norm_backward_stats_kernel,
    rms_norm_forward_framed_kernel,
    rms_norm_forward_kernel,
    rms_norm_forward_long_rows_kernel,
)
from .plan import (
    FRAMED_ROWS, HELD_ROWS, LONG_ROWS, NO_ROWS, PIVOT_MEAN, PLAIN_MEAN, SHORT_ROWS, BackwardPlan, ForwardPlan,
)  # fmt: skip


@dataclass(frozen=True)
class NormKernels:
    """One op's kernels, a design each (see plan.py's docstring)."""

    forward: object  # short rows, a tile per program
    forward_framed: object  # short rows off 16-byte boundaries, a tile of rows of one skew per program
    forward_long_rows: object  # a row per program, two sweeps
    backward: object  # short rows, persistent programs, partial dw/db
    backward_stats: object  # long rows, pass 1
    backward_columns: object  # long rows, pass 2
    backward_held: object  # long rows held on chip across programs (CUDA)


LAYER_NORM_KERNELS = NormKernels(
    forward=layer_norm_forward_kernel,
    forward_framed=layer_norm_forward_framed_kernel,
    forward_long_rows=layer_norm_forward_long_rows_kernel,
    backward=layer_norm_backward_kernel,
    backward_stats=layer_norm_backward_stats_kernel,
    backward_columns=layer_norm_backward_columns_kernel,
    backward_held=layer_norm_backward_held_kernel,
)
RMS_NORM_KERNELS = NormKernels(
    forward=rms_norm_forward_kernel,
    forward_framed=rms_norm_forward_framed_kernel,
    forward_long_rows=rms_norm_forward_long_rows_kernel,
    backward=rms_norm_backward_kernel,
    backward_stats=rms_norm_backward_stats_kernel,
    backward_columns=rms_norm_backward_columns_kernel,
    backward_held=rms_norm_backward_held_kernel,
)
KERNELS = {True: LAYER_NORM_KERNELS, False: RMS_NORM_KERNELS}  # by the plan's `centered`


def run_forward(plan: ForwardPlan, x, weight, bias, eps: float, dtype: torch.dtype) -> torch.Tensor:
    """y, of `dtype`, for a contiguous x; weight and bias contiguous, of n_cols elements, or None.
    The kernels load every input into the compute dtype and store y in its own."""
    y = torch.empty_like(x, dtype=dtype, memory_format=torch.contiguous_format)
    if plan.design == NO_ROWS:
        return y
    kernels = KERNELS[plan.centered]
    # An absent weight or bias still takes a pointer argument: x stands in, never read.
    args = (x, x if weight is None else weight, x if bias is None else bias, y, plan.n_rows, plan.n_cols, eps)
    flags = {"HAS_WEIGHT": weight is not None, "HAS_BIAS": bias is not None}
    if plan.design == SHORT_ROWS:
        launcher(kernels.forward, x)[plan.grid](
            *args, **flags, COL_MULTIPLE=plan.col_multiple, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
            AFFINE_FIRST=plan.affine_first, PIVOTED=plan.mean == PIVOT_MEAN, PLAIN=plan.mean == PLAIN_MEAN,
            num_warps=plan.warps,
        )  # fmt: skip
    elif plan.design == FRAMED_ROWS:  # the frame, not COL_MULTIPLE, tells the kernel its runs
        launcher(kernels.forward_framed, x)[plan.grid](
            *args, **flags, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, AFFINE_FIRST=plan.affine_first,
            PIVOTED=plan.mean == PIVOT_MEAN, FRAME=plan.frame, SKEWS=plan.skews, num_warps=plan.warps,
        )  # fmt: skip
    else:
        launcher(kernels.forward_long_rows, x)[plan.grid](
            *args, **flags, COL_MULTIPLE=plan.col_multiple, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
            FRAME=plan.frame, num_warps=plan.warps,
        )  # fmt: skip
    return y


def run_backward(
    plan: BackwardPlan, grad, x, weight, eps: float, weight_grad: bool, bias_grad: bool, param_shape
) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(dx, dw, db) for contiguous grad and x; dw/db of param_shape and the weight's dtype (x's
    without one) when asked for, None otherwise."""
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    allocate = torch.zeros if plan.design == NO_ROWS else torch.empty  # a sum over no rows is 0
    param_dtype = x.dtype if weight is None else weight.dtype
    dw = allocate(param_shape, dtype=param_dtype, device=x.device) if weight_grad else None
    db = allocate(param_shape, dtype=param_dtype, device=x.device) if bias_grad else None
    if plan.design == NO_ROWS:
        return dx, dw, db
    w = x if weight is None else weight
    flags = {"HAS_WEIGHT": weight is not None, "WEIGHT_GRAD": weight_grad, "BIAS_GRAD": bias_grad}
    flags["COL_MULTIPLE"] = plan.col_multiple
    launch_design = _BACKWARDS[plan.design]
    dw_partial, db_partial = launch_design(plan, KERNELS[plan.centered], grad, x, w, dx, eps, flags)
    _column_sums(plan, [(p, t) for p, t in ((dw_partial, dw), (db_partial, db)) if t is not None])
    return dx, dw, db


def _short_rows_backward(plan: BackwardPlan, kernels: NormKernels, grad, x, w, dx, eps, flags):
    dw_partial, db_partial = _partials(plan, x, dx, flags)
    launcher(kernels.backward, grad)[plan.grid](
        grad, x, w, dx, dw_partial, db_partial, plan.n_rows, plan.n_cols, eps,
        **flags, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, LOAD_AHEAD=plan.load_ahead,
        PLAIN=plan.mean == PLAIN_MEAN, ONE_REDUCTION=plan.one_reduction, num_warps=plan.warps,
    )  # fmt: skip
    return dw_partial, db_partial


def _held_rows_backward(plan: BackwardPlan, kernels: NormKernels, grad, x, w, dx, eps, flags):
    held = plan.held
    dw_partial, db_partial = _partials(plan, x, dx, flags)
    words, overlap = held_rows_scratch(x, plan.n_rows, held.words, overlapped=held.overlap_fill)
    kernel = register_capped(kernels.backward_held, held.setup.warps, held.setup.registers)
    launcher(kernel, grad)[plan.grid](
        grad, x, w, dx, dw_partial, db_partial, words, plan.n_rows, plan.n_cols, eps,
        held.n_segments, held.rows_at_once, held.max_spins, **flags, **overlap, **held.constexprs(),
    )  # fmt: skip
    return dw_partial, db_partial


def _long_rows_backward(plan: BackwardPlan, kernels: NormKernels, grad, x, w, dx, eps, flags):
    stats = torch.empty(plan.n_rows, _STATS, dtype=_compute_dtype(x), device=x.device)
    w_stride = 0
    if plan.frame and flags["HAS_WEIGHT"]:  # (w stands in for an absent weight: x, never read then)
        w, w_stride = shifted_weights(w, plan.frame)
    sweep = plan.statistics
    launcher(kernels.backward_stats, grad)[(plan.n_rows,)](
        grad, x, w, stats, plan.n_cols, eps, w_stride, HAS_WEIGHT=flags["HAS_WEIGHT"], BLOCK_N=sweep.block_n,
        COL_MULTIPLE=plan.col_multiple, FRAME=plan.frame, num_warps=sweep.warps,
    )  # fmt: skip
    dw_partial, db_partial = _partials(plan, x, dx, flags)
    launcher(kernels.backward_columns, grad)[plan.grid](
        grad, x, w, stats, dx, dw_partial, db_partial, plan.n_rows, plan.n_cols, w_stride,
        **flags, BLOCK_N=plan.block_n, FRAME=plan.frame, num_warps=plan.warps,
    )  # fmt: skip
    return dw_partial, db_partial


def shifted_weights(w: torch.Tensor, frame: int) -> tuple[torch.Tensor, int]:
    """(copies, row stride): w shifted by each skew a framed row can have, for loads as aligned as x's.  Row j
    holds w[p + j + 1 - frame] at place p (0 off w's ends), so the row frame - 1 - skew holds column p - skew,
    as a row of that skew's frame does (kernels.py, _shifted_w).  Rows are whole runs: every row starts on a
    16-byte boundary.  frame copies of w, made by one pad and one stack (w is a row's size: small next to x)."""
    n = w.numel()
    places = cdiv(n + frame, frame) * frame  # a framed row's places end before n + frame
    padded = F.pad(w.reshape(n), (frame, places + frame - n))  # padded[i] = w[i - frame]; w of any normalized shape
    # (slices stacked, not an as_strided view copied: a fake CUDA tensor's as_strided fails on a CPU build)
    return torch.stack([padded[j + 1 : j + 1 + places] for j in range(frame)]), places


_BACKWARDS = {SHORT_ROWS: _short_rows_backward, HELD_ROWS: _held_rows_backward, LONG_ROWS: _long_rows_backward}


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _partials(plan: BackwardPlan, x, dx, flags):
    """The (partial_rows, n_cols) scratches of the first reduction stage; dx stands in for one
    not asked for (its pointer is never written)."""

    def scratch(wanted):
        return torch.empty(plan.partial_rows, plan.n_cols, dtype=_compute_dtype(x), device=x.device) if wanted else dx

    return scratch(flags["WEIGHT_GRAD"]), scratch(flags["BIAS_GRAD"])


def _column_sums(plan: BackwardPlan, sums: list) -> None:
    """For each (partial, out) of `sums` (one or two), out = the column sums of partial, in one launch.

    With one, the kernel gets it in both slots and TWO_SUMS off, so that it stores to one
    pointer only: under torch.compile a tensor passed to two pointers that a kernel may
    store to is cloned for each, and only one clone's writes are kept."""
    if not sums:
        return
    (first_partial, first_out), (second_partial, second_out) = sums[0], sums[-1]
    column_sum = plan.column_sum
    launcher(column_sum_kernel, first_partial)[(column_sum.blocks, len(sums))](
        first_partial, second_partial, first_out, second_out, first_partial.shape[0], plan.n_cols,
        TWO_SUMS=len(sums) == 2, BLOCK_P=column_sum.block_p, BLOCK_N=column_sum.block_n,
        COL_MULTIPLE=plan.col_multiple, num_warps=column_sum.warps,
    )  # fmt: skip
