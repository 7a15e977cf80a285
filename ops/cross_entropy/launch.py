"""Cross entropy's launches: a plan (plan.py) carried out on tensors that op.py has checked.

run_forward and run_backward allocate the outputs and the scratch and launch the kernels the plan
names, with its sizes; they decide nothing.  The logits reach them with unit column stride.
"""

import torch

from ..runtime import launcher
from .kernels import (
    cross_entropy_backward_kernel,
    cross_entropy_count_kernel,
    cross_entropy_forward_kernel,
    cross_entropy_reduce_kernel,
)
from .plan import BackwardPlan, ForwardPlan


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the kernels compute in, and the dtype of the logsumexp they save: float64 for float64
    logits, float32 for the others."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def run_forward(
    plan: ForwardPlan,
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int,
    label_smoothing: float,
    loss_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, lse): the row losses (plan.sums None) or their sum or mean, and each row's logsumexp."""
    n_rows, n_cols = logits.shape
    device = logits.device
    compute = compute_dtype(logits.dtype)
    lse = torch.empty(n_rows, dtype=compute, device=device)
    sums = plan.sums
    ticket = None
    if sums is None:
        loss = row_loss = torch.empty(n_rows, dtype=loss_dtype, device=device)
    else:  # row losses kept in the compute dtype, then reduced to one scalar
        loss = torch.empty((), dtype=loss_dtype, device=device)
        row_loss = torch.empty(n_rows, dtype=compute, device=device)
        # each part's sum and kept count, then the ticket (zeroed by the row kernel)
        part_sum = torch.empty(sums.programs, dtype=compute, device=device)
        part_kept = torch.empty(sums.programs + 1, dtype=torch.int32, device=device)
        ticket = part_kept[sums.programs :]
    tile = plan.tile
    if tile is not None:
        launcher(cross_entropy_forward_kernel, logits)[(tile.programs,)](
            logits, target, row_loss, lse, lse if ticket is None else ticket,
            n_rows, n_cols, logits.stride(0), ignore_index, float(label_smoothing),
            SMOOTHING=plan.smoothing, BLOCK_M=tile.rows, BLOCK_SIZE=tile.block, COL_MULTIPLE=tile.col_multiple,
            PEEL=tile.peel, ZERO_TICKET=ticket is not None, num_warps=tile.warps,
        )  # fmt: skip
    if sums is not None:  # N == 0 too (one program, no ticket): a sum of nothing is 0, its mean NaN
        launcher(cross_entropy_reduce_kernel, logits)[(sums.programs,)](
            row_loss, target, part_sum, part_kept, ticket, loss, n_rows, sums.rows_per_part, ignore_index,
            MEAN=plan.mean, BLOCK_SIZE=sums.chunk, MAX_PARTS=sums.max_parts, num_warps=sums.warps,
        )  # fmt: skip
    return loss, lse


def run_backward(
    plan: BackwardPlan,
    grad: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    lse: torch.Tensor,
    ignore_index: int,
    label_smoothing: float,
) -> torch.Tensor:
    """dlogits for the incoming gradient `grad`: (N,) per row, or a scalar for "mean" and "sum"."""
    n_rows, n_cols = logits.shape
    dlogits = torch.empty((n_rows, n_cols), dtype=logits.dtype, device=logits.device)
    tile = plan.tile
    if tile is None:
        return dlogits
    counts = plan.counts
    part_kept, n_parts, mean_parts = lse, 0, 0  # the kept rows' counts, for "mean" only
    if counts is not None:  # grad / kept rows: the row kernel adds the counts of the parts up
        part_kept = torch.empty(counts.programs, dtype=torch.int32, device=logits.device)
        launcher(cross_entropy_count_kernel, logits)[(counts.programs,)](
            target, part_kept, n_rows, counts.rows_per_part, ignore_index, BLOCK_SIZE=counts.chunk,
            num_warps=counts.warps,
        )  # fmt: skip
        n_parts, mean_parts = counts.programs, counts.max_parts
    launcher(cross_entropy_backward_kernel, logits)[(tile.programs,)](
        logits, target, lse, grad, part_kept, dlogits,
        n_rows, n_cols, logits.stride(0), grad.stride(0) if grad.dim() else 0, n_parts, ignore_index,
        float(label_smoothing), BLOCK_M=tile.rows, BLOCK_SIZE=tile.block, COL_MULTIPLE=tile.col_multiple,
        PEEL=tile.peel, MEAN_PARTS=mean_parts, num_warps=tile.warps,
    )  # fmt: skip
    return dlogits
