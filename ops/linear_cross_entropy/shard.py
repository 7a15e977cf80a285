"""One vocabulary shard's part of linear cross entropy, for a loss whose weight is sharded over the vocabulary.

Under tensor parallelism lm_head's weight (V, H) is split over the ranks by rows: rank r holds the
classes ``vocab_start .. vocab_start + V_r``.  Gathering the weight would undo what the split saves,
so each rank computes its shard's part of every row's loss, the parts are exchanged (N numbers a
row-statistic, not V x H), and each rank computes its shard's gradients (Megatron's parallel cross
entropy, without the logits).  vocab_parallel.py does the exchange; this file holds
what one shard computes, as ops, and how the parts combine, as math:

    torch.ops.tk.linear_cross_entropy_shard_stats(x, weight, target, bias, vocab_start, ignore_index,
        label_smoothing) -> stats (4, N): per row, the max of the shard's logits, the log of the sum of
        exp(logit - max) over them, the target's logit where the target is one of the shard's classes
        (else 0), and with label smoothing the max minus the shard's mean logit (else 0)
    vocab_parallel.combine(stats of every shard (P, 4, N), shard sizes, target, ...) -> (row losses, lse)
        lse = M + log(sum_r exp(max_r - M) exp(log_sum_r)), M the largest max;
        loss = (1 - s) (lse - z_t) + s (lse - mean), mean = sum_r V_r mean_r / V, s as float32
    torch.ops.tk.linear_cross_entropy_shard_backward(grad, lse, x, weight, target, bias, vocab_start,
        vocab, ignore_index, label_smoothing, x_grad, weight_grad, bias_grad) -> (grad_x, grad_weight,
        grad_bias) of this shard: its logits' gradient
            dz_c = (exp(z_c - lse) - s / V - (1 - s) [c == t]) * grad
        turned into this shard's share of grad_x (the shards' shares sum to grad_x) and the gradients
        of its weight and bias rows

Each op is one pass of linear cross entropy's chunked loop (launch.py: a chunk's logits by cuBLAS
into one buffer, a row kernel over them, the gradient GEMMs), so the memory a call holds is one
chunk's logits, as for the whole loss.  A shard may hold no class (V < the ranks): its stats say so
(max -inf) and its gradients are zeros.  Targets are checked as the whole loss checks them: one
outside [0, V) and not ignore_index gives a NaN loss and NaN gradients.
"""

import torch

from ..blocks.sizes import cdiv
from ..cross_entropy.op import check_options
from ..runtime import check_tensor, launcher, register_op
from .kernels import vocab_shard_gradient_kernel, vocab_shard_statistics_kernel
from .launch import GradientSums, chunk_logits, compute_dtype, gemm_operands
from .op import check_bias_grad, check_inputs, describe
from .plan import TUNING, Tuning, choose_plan

STATS = ("max", "log_sum", "target_logit", "max_minus_mean")  # the rows of a shard's stats, in order


def _check_shard(op: str, x, weight, target, bias, vocab_start: int) -> None:
    check_inputs(op, x, weight, target, bias, x_ndims=(2,), min_classes=0)
    if vocab_start < 0:
        raise ValueError(f"tk.{op}: vocab_start must be at least 0, got {vocab_start}")


def shard_stats(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    vocab_start: int,
    ignore_index: int,
    label_smoothing: float,
    *,
    tuning: Tuning = TUNING,
) -> torch.Tensor:
    """tk.linear_cross_entropy_shard_stats planned with `tuning`: the (4, N) stats of this shard's
    classes (rows as STATS names them), in float32 (float64 for float64 inputs)."""
    op = "linear_cross_entropy_shard_stats"
    _check_shard(op, x, weight, target, bias, vocab_start)
    check_options(op, "none", label_smoothing)
    stats = torch.zeros((len(STATS), x.shape[0]), dtype=compute_dtype(x.dtype), device=x.device)
    if weight.shape[0] == 0:  # no class here: no logit, an empty sum
        stats[0] = float("-inf")
        return stats
    meta = describe(x, weight, "none", label_smoothing, loss=True, incoming=False)
    plan = choose_plan(meta, tuning)
    target = target.contiguous()
    classes = weight.shape[0]
    for start, end, padded_rows, _ in chunk_logits(plan, x, *gemm_operands(plan, weight, bias)):
        # One view a stat: a traced call's functional copy of a view covers that view only (launch.py).
        launcher(vocab_shard_statistics_kernel, x)[(cdiv(end - start, plan.tile.rows),)](
            padded_rows, target[start:end], *(stat[start:end] for stat in stats),
            end - start, classes, plan.logits_stride, vocab_start, ignore_index,
            SMOOTHING=plan.smoothing, BLOCK_M=plan.tile.rows, BLOCK_SIZE=plan.tile.block,
            ROW_MULTIPLE=plan.tile.row_multiple, num_warps=plan.tile.warps,
        )  # fmt: skip
    return stats


def shard_backward(
    grad: torch.Tensor,
    lse: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    vocab_start: int,
    vocab: int,
    ignore_index: int,
    label_smoothing: float,
    x_grad: bool,
    weight_grad: bool,
    bias_grad: bool,
    *,
    tuning: Tuning = TUNING,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tk.linear_cross_entropy_shard_backward planned with `tuning`: this shard's (grad_x share, grad_weight, grad_bias) for the incoming gradient (N,) of the row
    losses and each row's lse (N,) over the whole vocabulary of `vocab` classes; a gradient not asked
    for is an empty tensor."""
    op = "linear_cross_entropy_shard_backward"
    _check_shard(op, x, weight, target, bias, vocab_start)
    check_options(op, "none", label_smoothing)
    check_bias_grad(op, bias, bias_grad)
    for name, rows in (("grad", grad), ("lse", lse)):
        check_tensor(op, name, rows, ndims=(1,))
        if rows.shape[0] != x.shape[0] or rows.device != x.device:
            raise ValueError(
                f"tk.{op}: {name} has shape {tuple(rows.shape)} on {rows.device}; x of shape {tuple(x.shape)} "
                f"on {x.device} needs ({x.shape[0]},) on {x.device}"
            )
    if vocab < vocab_start + weight.shape[0]:
        raise ValueError(
            f"tk.{op}: a shard of {weight.shape[0]} classes from {vocab_start} does not fit a vocabulary of {vocab}"
        )
    meta = describe(
        x, weight, "none", label_smoothing,
        loss=False, incoming=True, x_grad=x_grad, weight_grad=weight_grad, bias_grad=bias_grad,
    )  # fmt: skip
    plan = choose_plan(meta, tuning)
    classes = weight.shape[0]
    weight, bias = gemm_operands(plan, weight, bias)
    sums = GradientSums(plan, x, weight, bias, classes)
    if classes == 0:  # no class here: this shard adds nothing to grad_x
        if sums.grad_x is not None:
            sums.grad_x.zero_()
        return sums.results()
    target = target.contiguous()
    # An out-of-range target (not ignored) makes its row NaN, as the whole loss's gradient is.
    valid = ((target >= 0) & (target < vocab)) | (target == ignore_index)
    scale = torch.where(valid, grad, float("nan")).contiguous()
    lse = lse.contiguous()
    for start, end, padded_rows, logits in chunk_logits(plan, x, weight, bias):
        launcher(vocab_shard_gradient_kernel, x)[(cdiv(end - start, plan.tile.rows),)](
            padded_rows, target[start:end], lse[start:], scale[start:],
            end - start, classes, plan.logits_stride, vocab_start, vocab, ignore_index, float(label_smoothing),
            BLOCK_M=plan.tile.rows, BLOCK_SIZE=plan.tile.block, ROW_MULTIPLE=plan.tile.row_multiple,
            num_warps=plan.tile.warps,
        )  # fmt: skip
        sums.add(start, end, logits)
    padded_rows = logits = None  # the buffer goes back before the sums are rounded
    return sums.results()


# The registered bodies: the entry points with the default tuning (the schema comes from these hints).
def _linear_cross_entropy_shard_stats(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    vocab_start: int,
    ignore_index: int,
    label_smoothing: float,
) -> torch.Tensor:
    return shard_stats(x, weight, target, bias, vocab_start, ignore_index, label_smoothing)


def _linear_cross_entropy_shard_backward(
    grad: torch.Tensor,
    lse: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    vocab_start: int,
    vocab: int,
    ignore_index: int,
    label_smoothing: float,
    x_grad: bool,
    weight_grad: bool,
    bias_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return shard_backward(
        grad, lse, x, weight, target, bias, vocab_start, vocab, ignore_index, label_smoothing,
        x_grad, weight_grad, bias_grad,
    )  # fmt: skip


linear_cross_entropy_shard_stats = register_op("linear_cross_entropy_shard_stats", _linear_cross_entropy_shard_stats)
linear_cross_entropy_shard_backward = register_op(
    "linear_cross_entropy_shard_backward", _linear_cross_entropy_shard_backward
)

