"""Linear cross entropy's launches: a plan (plan.py) carried out on tensors that op.py has checked.

``run`` walks the rows in the plan's chunks.  For each chunk: its logits x_c @ W^T (+ b) into one
reused buffer (cuBLAS, through torch), the row kernel over them (its losses, and its gradient in
place), then the gradient GEMMs: grad_x_c = dlogits_c @ W into grad_x's rows, grad_W += dlogits_c^T
@ x_c, grad_b += the column sums of dlogits_c.  It allocates, launches and sums what the plan
says, and decides nothing.
"""

import torch

from ..blocks.sizes import cdiv
from ..runtime import launcher
from .kernels import linear_cross_entropy_kernel
from .plan import FLOAT32, FLOAT32_TRACED, IN_OUTPUT, Plan


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the kernel computes in, and the loss's dtype: float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def run(
    plan: Plan,
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    incoming: torch.Tensor | None,
    ignore_index: int,
    label_smoothing: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, grad_x, grad_weight, grad_bias) of x (N, H), weight (V, H), target (N,) (contiguous)
    and bias (V,) or None.  `incoming`: the per-row gradient (N,) of the backward of "none", else
    None.  The loss is the row losses (N,), their sum or their mean for plan.loss, else empty; a
    gradient the plan does not compute is an empty tensor."""
    n_rows = x.shape[0]
    vocab = weight.shape[0]
    device, compute = x.device, compute_dtype(x.dtype)
    row_loss = torch.empty(n_rows if plan.loss else 0, dtype=compute, device=device)
    kept_count = (target != ignore_index).sum() if plan.reduction == "mean" and (plan.loss or plan.mean) else None

    grad_x = torch.empty_like(x, memory_format=torch.contiguous_format) if plan.x_grad else x.new_empty(0)
    weight_sum = None  # the weight gradient's sum over the chunks: the gradient itself, or a float32 sum
    if plan.weight_grad:
        sum_dtype = weight.dtype if plan.weight_sum == IN_OUTPUT else compute
        weight_sum = (torch.zeros if plan.chunks == 0 else torch.empty)(weight.shape, dtype=sum_dtype, device=device)
    bias_sum = torch.zeros(vocab, dtype=compute, device=device) if plan.bias_grad else None

    if plan.chunks:
        tile = plan.tile
        # One buffer for every chunk's logits, its rows padded to 16 bytes; each chunk uses its first rows.
        buffer = torch.empty((plan.chunk_rows, plan.logits_stride), dtype=x.dtype, device=device)
        for index in range(plan.chunks):
            start = index * plan.chunk_rows
            end = min(start + plan.chunk_rows, n_rows)
            # The kernel reads and writes the padded rows whole (their padding ends 0), so it gets the
            # rows whole: a traced call's functional copy of a tensor covers that tensor's extent only.
            padded_rows = buffer[: end - start]
            x_chunk, logits = x[start:end], padded_rows[:, :vocab]
            if bias is None:
                torch.mm(x_chunk, weight.t(), out=logits)
            else:
                torch.addmm(bias, x_chunk, weight.t(), out=logits)
            # The pointers a launch does not read (the plan's flags leave them out) are the buffer's.
            launcher(linear_cross_entropy_kernel, x)[(cdiv(end - start, tile.rows),)](
                padded_rows, target[start:end], row_loss[start:end] if plan.loss else buffer,
                buffer if incoming is None else incoming[start:], buffer if kept_count is None else kept_count,
                end - start, vocab, plan.logits_stride, 0 if incoming is None else incoming.stride(0),
                ignore_index, float(label_smoothing),
                LOSS=plan.loss, GRAD=plan.grad, INCOMING=incoming is not None, MEAN=plan.mean,
                SMOOTHING=plan.smoothing, BLOCK_M=tile.rows, BLOCK_SIZE=tile.block, ROW_MULTIPLE=tile.row_multiple,
                num_warps=tile.warps,
            )  # fmt: skip
            if plan.x_grad:
                torch.mm(logits, weight, out=grad_x[start:end])
            if plan.weight_grad:
                _add_weight_gradient(plan, weight_sum, logits, x_chunk, first=index == 0)
            if plan.bias_grad:
                bias_sum += logits.sum(0, dtype=compute)
        del buffer, padded_rows, logits

    # A float32 sum rounded once to the weight's dtype, after the buffer is given back; a result the
    # plan does not compute is an empty tensor of its own.
    grad_weight = weight_sum.to(weight.dtype) if weight_sum is not None else x.new_empty(0)
    grad_bias = bias_sum.to(bias.dtype) if bias_sum is not None else x.new_empty(0)
    return _reduce(plan, row_loss, kept_count), grad_x, grad_weight, grad_bias


def _add_weight_gradient(
    plan: Plan, weight_sum: torch.Tensor, dlogits: torch.Tensor, x_chunk: torch.Tensor, first: bool
):
    """weight_sum (+)= dlogits^T @ x_chunk: the first chunk writes the sum (beta = 0: what the
    buffer held is not read), the others add to it, in the way plan.weight_sum names."""
    beta = 0 if first else 1
    if plan.weight_sum == IN_OUTPUT:
        torch.addmm(weight_sum, dlogits.t(), x_chunk, beta=beta, out=weight_sum)
    elif plan.weight_sum == FLOAT32:
        torch.addmm(weight_sum, dlogits.t(), x_chunk, beta=beta, out_dtype=torch.float32, out=weight_sum)
    elif plan.weight_sum == FLOAT32_TRACED:
        product = torch.mm(dlogits.t(), x_chunk, out_dtype=torch.float32)
        if first:
            weight_sum.copy_(product)
        else:
            weight_sum.add_(product)
    else:  # WIDENED
        torch.addmm(weight_sum, dlogits.t().float(), x_chunk.float(), beta=beta, out=weight_sum)


def _reduce(plan: Plan, row_loss: torch.Tensor, kept_count: torch.Tensor | None) -> torch.Tensor:
    """The loss: the row losses, their sum, or their sum over the kept rows' count (0 / 0 = NaN
    when no row is kept, as in PyTorch); empty when no loss is computed."""
    if not plan.loss or plan.reduction == "none":
        return row_loss
    total = row_loss.sum()
    return total / kept_count if plan.reduction == "mean" else total
