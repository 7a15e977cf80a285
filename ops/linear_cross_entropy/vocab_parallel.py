"""tk.linear_cross_entropy with lm_head's weight sharded over the vocabulary: exact, and the weight stays sharded.

Tensor parallelism shards lm_head's weight (V, H) by rows, ``ColwiseParallel``: a DTensor
``Shard(0)`` on a 1-D mesh.  A sharding rule cannot keep that placement (a rule runs one local call
and cannot exchange anything inside it), so without this file DTensor gathers the weight: V x H on
every rank, the memory tensor parallelism was meant to save.  Instead, as Megatron's parallel cross
entropy does, but without the logits:

1. x's rows and the targets are gathered (N x H, where sequence parallelism sharded them; the
   weight is V x H, and V is 32000 to 256000 where N is a batch's tokens);
2. each rank computes its shard's stats of every row (shard.py: the max and log-sum-exp of its
   logits, the target's logit if it holds the target, its mean logit for label smoothing);
3. one all-gather of the stats (4 N numbers a rank) and every rank combines them into the loss;
4. the backward: each rank computes its shard's logits' gradient from the whole vocabulary's lse,
   its weight's (and bias's) gradient rows, which stay sharded as the weight is, and its share of
   grad_x, which one all-reduce sums (in float32 for 16-bit x).

The loss is a replicated DTensor (every rank holds all of it), for every reduction.  Used by the
composite tk.linear_cross_entropy when the weight is a DTensor sharded so and the bias is absent or
sharded as the weight; other placements go through the sharding rules (ops/sharding/).
"""

from __future__ import annotations

import torch

if torch.distributed.is_available():
    import torch.distributed._functional_collectives as funcol


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def applies(weight, bias) -> bool:
    """Whether the weight (and the bias, if any) are DTensors split over the vocabulary on a 1-D mesh."""
    if type(weight) in _PLAIN or not torch.distributed.is_available():  # the common case, before any import
        return False
    from torch.distributed.tensor import DTensor, Shard  # imported by then: DTensor registers its rules at import ops

    def by_vocabulary(t) -> bool:
        return isinstance(t, DTensor) and t.device_mesh.ndim == 1 and tuple(t.placements) == (Shard(0),)

    return by_vocabulary(weight) and (bias is None or (by_vocabulary(bias) and bias.device_mesh == weight.device_mesh))


def shard_sizes(vocab: int, ranks: int) -> list[int]:
    """The classes each rank holds of a Shard(0) split of `vocab` rows, as DTensor splits them (torch.chunk:
    ceil(V / ranks) each, the last ones fewer or none)."""
    size = -(-vocab // ranks)
    return [max(0, min(size, vocab - r * size)) for r in range(ranks)]


def linear_cross_entropy(x, weight, target, bias, ignore_index: int, reduction: str, label_smoothing: float):
    """tk.linear_cross_entropy of a vocabulary-sharded weight (see the module docstring); a replicated DTensor."""
    from torch.distributed.tensor import DTensor, Replicate

    mesh = weight.device_mesh
    sizes = shard_sizes(weight.shape[0], mesh.size())
    rank = mesh.get_local_rank()
    local_weight = weight.to_local()
    if local_weight.shape[0] != sizes[rank]:  # a split other than DTensor's even one (from_local with other sizes)
        raise ValueError(
            f"tk.linear_cross_entropy: rank {rank} holds {local_weight.shape[0]} rows of the weight, "
            f"a Shard(0) split of {weight.shape[0]} rows over {mesh.size()} ranks gives it {sizes[rank]}"
        )
    _check_placed(x, target, mesh)
    hidden = x.shape[-1]
    loss = _VocabParallel.apply(
        _whole(x, mesh).reshape(-1, hidden), local_weight, None if bias is None else bias.to_local(),
        _whole(target, mesh).reshape(-1), mesh, sizes, rank, ignore_index, reduction, label_smoothing,
    )  # fmt: skip
    if reduction == "none":
        loss = loss.reshape(target.shape)
    return DTensor.from_local(loss, mesh, [Replicate()], run_check=False)


def _check_placed(x, target, mesh) -> None:
    """x and target as DTensors on the weight's mesh: a plain tensor would be taken as the same on every rank,
    and where it is not (each rank's own rows, with sequence parallelism's use_local_output) the stats of
    different rows would be combined.  Under DTensor's implicit_replication a plain tensor is taken as
    replicated, as DTensor itself takes it."""
    from torch.distributed.tensor import DTensor

    implicit = getattr(DTensor._op_dispatcher, "_allow_implicit_replication", False)  # the context's flag
    for name, t in (("x", x), ("target", target)):
        if isinstance(t, DTensor):
            if t.device_mesh != mesh:
                raise ValueError(f"tk.linear_cross_entropy: {name} is on another device mesh than the weight")
        elif not implicit:
            raise TypeError(
                f"tk.linear_cross_entropy: the weight is a DTensor sharded over the vocabulary but {name} is a plain "
                f"tensor; pass {name} as a DTensor on the weight's mesh (DTensor.from_local), or call under "
                f"torch.distributed.tensor.experimental.implicit_replication() if it is the same on every rank"
            )


def _whole(t, mesh):
    """A DTensor gathered to every rank, as a plain tensor (gradients flow back to its shards); a plain tensor as it is."""
    from torch.distributed.tensor import DTensor, Replicate

    if not isinstance(t, DTensor):
        return t
    return t.redistribute(mesh, [Replicate()] * mesh.ndim).to_local()


def combine(
    stats: torch.Tensor, shard_sizes: list[int], target: torch.Tensor, ignore_index: int, label_smoothing: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row losses (N,), lse (N,)) from every shard's stats (shard.py) (P, 4, N), shard r holding shard_sizes[r]
    classes.  An ignored row's loss is 0 (its lse is unused); an out-of-range target's is NaN."""
    maxes, log_sums, target_logits, max_minus_means = stats.unbind(1)
    top = maxes.amax(0)
    shift = torch.where(top == float("-inf"), 0.0, top)  # this row ignored, or every logit of it -inf
    log_sum = torch.log(torch.exp(maxes - shift + log_sums).sum(0))
    # (top - z_t) + log_sum rather than lse - z_t, as the whole loss computes it: with logits of 1e9,
    # lse would round log_sum away.
    loss = (top - target_logits.sum(0)) + log_sum
    smoothing = float(torch.tensor(label_smoothing, dtype=torch.float32))  # as the kernels see it
    if smoothing > 0:  # with s = 0 a -inf logit must not turn 0 * -inf into NaN
        # top - mean = sum_r V_r (top - mean_r) / V, each term (top - max_r) + (max_r - mean_r): no term
        # holds a logit's magnitude.  A shard of no class adds nothing; one whose logits are all -inf
        # makes the mean -inf, so the term +inf, as the whole loss's is.
        sizes = torch.tensor(shard_sizes, dtype=stats.dtype, device=stats.device)[:, None]
        term = torch.where(maxes == float("-inf"), float("inf"), (top - maxes) + max_minus_means)
        top_minus_mean = (torch.where(sizes > 0, term, 0.0) * sizes).sum(0) / sum(shard_sizes)
        loss = (1.0 - smoothing) * loss + smoothing * (top_minus_mean + log_sum)
    ignored = target == ignore_index
    in_range = (target >= 0) & (target < sum(shard_sizes))
    loss = torch.where(in_range, loss, float("nan"))
    return torch.where(ignored, 0.0, loss), top + log_sum


def _all_gather(tensor, mesh):
    """Every rank's `tensor` stacked along dim 0: all_gather_single (torch 2.13 deprecates the older name)."""
    gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
    return gather(tensor, 0, mesh)


class _VocabParallel(torch.autograd.Function):
    """The loss of x (N, H) against this rank's shard of the weight, the shards' stats exchanged over `mesh`."""

    @staticmethod
    def forward(ctx, x, weight, bias, target, mesh, sizes, rank, ignore_index, reduction, label_smoothing):
        start = sum(sizes[:rank])
        stats = torch.ops.tk.linear_cross_entropy_shard_stats(x, weight, target, bias, start, ignore_index, label_smoothing)
        # Functional collectives (what DTensor itself uses): torch.compile traces them; c10d's in-place ones
        # it cannot (a ProcessGroup in the graph).
        everyone = _all_gather(stats.contiguous(), mesh)
        row_loss, lse = combine(everyone.view(len(sizes), *stats.shape), sizes, target, ignore_index, label_smoothing)
        kept = (target != ignore_index).sum()
        ctx.save_for_backward(x, weight, bias, target, lse, kept)
        ctx.options = (mesh, start, sum(sizes), ignore_index, reduction, label_smoothing)
        if reduction == "none":
            return row_loss
        total = row_loss.sum()
        return total / kept if reduction == "mean" else total  # no row kept: 0 / 0 = NaN, as in PyTorch

    @staticmethod
    def backward(ctx, grad_loss):
        x, weight, bias, target, lse, kept = ctx.saved_tensors
        mesh, start, vocab, ignore_index, reduction, label_smoothing = ctx.options
        needs = ctx.needs_input_grad[:3]
        if reduction == "mean":
            grad_loss = grad_loss / kept
        rows = grad_loss.to(lse.dtype).expand(x.shape[0]).contiguous()
        grad_x, grad_weight, grad_bias = torch.ops.tk.linear_cross_entropy_shard_backward(
            rows, lse, x, weight, target, bias, start, vocab, ignore_index, label_smoothing, *needs
        )
        if needs[0]:  # each rank holds its shard's share of grad_x: their sum (in x's dtype, as TP layers sum)
            grad_x = funcol.all_reduce(grad_x, "sum", mesh)
        grads = [g if need else None for g, need in zip((grad_x, grad_weight, grad_bias), needs)]
        return *grads, None, None, None, None, None, None, None
