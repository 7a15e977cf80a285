"""tk.linear_cross_entropy with a vocabulary-sharded weight on two CPU processes (gloo): exact, the weight never gathered.

The weight is a DTensor Shard(0) (tensor parallelism's lm_head) of an odd vocabulary (uneven shards),
x replicated or row-sharded (as sequence parallelism leaves it); the loss and every gradient must
match float64 on the whole tensors, the weight's gradient stay Shard(0), and the communication be
what ops/linear_cross_entropy/vocab_parallel.py says: an all-gather of the rows' stats (and of x's
and the targets' rows where they come sharded) and an all-reduce of grad_x, never the weight.
"""

from __future__ import annotations

import pytest
import torch

if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import torch.nn.functional as F
from ranks import ranks_fixture
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

import ops  # noqa: F401  (registers the tk ops)

WORLD = 2
ROWS, HIDDEN, VOCAB = 13, 8, 37  # 37 classes over two ranks: shards of 19 and 18


ranks = ranks_fixture(WORLD)


def _case(dtype):
    torch.manual_seed(0)
    x = torch.randn(ROWS, HIDDEN).to(dtype)
    weight = (3 * torch.randn(VOCAB, HIDDEN) / HIDDEN**0.5).to(dtype)
    bias = torch.randn(VOCAB).to(dtype)
    target = torch.randint(0, VOCAB, (ROWS,))
    target[1::4] = -100
    target[2] = VOCAB - 1  # the last class, on the last shard
    return x, weight, bias, target


def _reference(x, weight, bias, target, reduction, smoothing, grad):
    """Loss and gradients in float64, from logits rounded to x's dtype as the GEMM gives them."""
    leaves = [t.double().clone().requires_grad_() for t in (x, weight, bias)]
    logits = F.linear(*leaves)
    logits = logits + (F.linear(x, weight, bias).double() - logits).detach()
    loss = F.cross_entropy(logits, target, reduction=reduction, label_smoothing=smoothing)
    (loss * grad.double()).sum().backward()
    return loss.detach(), *(t.grad for t in leaves)


def check_vocab_parallel(rank, dtype: str, reduction: str, smoothing: float, rows_sharded: bool) -> dict:
    dtype = getattr(torch, dtype)
    x, weight, bias, target = _case(dtype)
    grad = torch.rand(ROWS) if reduction == "none" else torch.tensor(0.7)
    expected = _reference(x, weight, bias, target, reduction, smoothing, grad)

    rows = [Shard(0)] if rows_sharded else [Replicate()]
    xd = distribute_tensor(x, rank.mesh, rows).requires_grad_()
    wd = distribute_tensor(weight, rank.mesh, [Shard(0)]).requires_grad_()
    bd = distribute_tensor(bias, rank.mesh, [Shard(0)]).requires_grad_()
    td = distribute_tensor(target, rank.mesh, rows)
    with CommDebugMode() as forward:
        loss = torch.ops.tk.linear_cross_entropy(xd, wd, td, bd, -100, reduction, smoothing)
    incoming = distribute_tensor(grad, rank.mesh, [Replicate()])
    with CommDebugMode() as backward:
        (loss * incoming).sum().backward()

    tolerance = {torch.float32: 2e-5, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(loss.full_tensor().double(), expected[0], rtol=tolerance, atol=tolerance)
    for name, got, want in zip(("x", "weight", "bias"), (xd.grad, wd.grad, bd.grad), expected[1:]):
        assert got.dtype == dtype, name
        torch.testing.assert_close(got.full_tensor().double(), want, rtol=tolerance, atol=tolerance, msg=name)
    return {
        "loss": tuple(loss.placements),
        "grads": [tuple(g.placements) for g in (xd.grad, wd.grad, bd.grad)],
        "forward": {str(k): v for k, v in forward.get_comm_counts().items()},
        "backward": {str(k): v for k, v in backward.get_comm_counts().items()},
    }


@pytest.mark.parametrize("rows_sharded", [False, True], ids=["rows-replicated", "rows-sharded"])
@pytest.mark.parametrize(
    "dtype, reduction, smoothing",
    [("float32", "mean", 0.0), ("float32", "sum", 0.1), ("float32", "none", 0.0), ("bfloat16", "mean", 0.1)],
)
def test_a_vocabulary_sharded_weight_stays_sharded_and_the_loss_is_exact(ranks, dtype, reduction, smoothing, rows_sharded):
    results = ranks.run(check_vocab_parallel, dtype, reduction, smoothing, rows_sharded)
    assert results[0] == results[1]
    found = results[0]
    assert found["loss"] == (Replicate(),)
    rows = (Shard(0),) if rows_sharded else (Replicate(),)
    assert found["grads"] == [rows, (Shard(0),), (Shard(0),)]  # the weight's and bias's gradients stay sharded
    gathers = sum(v for k, v in found["forward"].items() if "gather" in k)
    # The stats, and x's and the targets' rows where they come sharded: never the weight.
    assert gathers == (3 if rows_sharded else 1), found
    assert sum(v for k, v in found["backward"].items() if "allreduce" in k.replace("_", "")) == 1, found  # grad_x's shares
    assert len(found["backward"]) == 1, found  # nothing else: the weight's gradient is not reduce-scattered


def check_weight_split_unevenly(rank) -> str:
    x, weight, bias, target = _case(torch.float32)
    local = weight[:20] if rank.index == 0 else weight[20:]  # 20 + 17 rows, not DTensor's 19 + 18
    wd = DTensor.from_local(local, rank.mesh, [Shard(0)], run_check=False, shape=weight.shape, stride=weight.stride())
    try:
        xd, td = (distribute_tensor(t, rank.mesh, [Replicate()]) for t in (x, target))
        torch.ops.tk.linear_cross_entropy(xd, wd, td)
    except ValueError as error:
        return str(error)
    return "no error"


def test_a_split_other_than_dtensors_is_refused(ranks):
    messages = ranks.run(check_weight_split_unevenly)
    assert "rank 0 holds 20 rows of the weight, a Shard(0) split of 37 rows over 2 ranks gives it 19" in messages[0]


class _Head(torch.nn.Module):
    """lm_head and its loss, as a patched model computes them: the weight a vocabulary-sharded parameter."""

    def __init__(self, weight, mesh):
        super().__init__()
        self.weight = torch.nn.Parameter(distribute_tensor(weight, mesh, [Shard(0)]))

    def forward(self, x, target):
        # The rows replicated, as tensor parallelism's input hooks (PrepareModuleInput) place them.
        mesh = self.weight.device_mesh
        x, target = (DTensor.from_local(t, mesh, [Replicate()], run_check=False) for t in (x, target))
        return torch.ops.tk.linear_cross_entropy(x, self.weight, target)


def check_compiled(rank) -> float:
    # PyTorch's AOTAutograd cache keys a DTensor on its global spec, not its shard: with shards of 19 and 18
    # rows a second run hands one rank the other's graph (plain F.linear too; docs/distributed.md).
    torch._functorch.config.enable_autograd_cache = False
    x, weight, bias, target = _case(torch.float32)
    head = _Head(weight, rank.mesh)
    x_eager, x_compiled = x.clone().requires_grad_(), x.clone().requires_grad_()
    eager = head(x_eager, target)
    eager.backward()
    expected = head.weight.grad.full_tensor()
    head.weight.grad = None
    compiled = torch.compile(head, fullgraph=True)(x_compiled, target)
    compiled.backward()
    torch.testing.assert_close(compiled.full_tensor(), eager.full_tensor())
    torch.testing.assert_close(head.weight.grad.full_tensor(), expected)
    torch.testing.assert_close(x_compiled.grad, x_eager.grad)
    return float(compiled.full_tensor())


def test_compiled_matches_eager(ranks):
    results = ranks.run(check_compiled)
    assert results[0] == results[1]


def check_plain_rows(rank) -> list[str]:
    """A plain x beside a vocabulary-sharded weight: refused, unless under implicit_replication (then replicated)."""
    from torch.distributed.tensor.experimental import implicit_replication

    x, weight, bias, target = _case(torch.float32)
    wd = distribute_tensor(weight, rank.mesh, [Shard(0)])
    found = []
    try:
        torch.ops.tk.linear_cross_entropy(x, wd, target)
    except TypeError as error:
        found.append(str(error))
    with implicit_replication():
        loss = torch.ops.tk.linear_cross_entropy(x, wd, target)
    expected = F.cross_entropy(F.linear(x.double(), weight.double()), target)
    torch.testing.assert_close(loss.full_tensor().double(), expected, rtol=2e-5, atol=2e-5)
    return found


def test_plain_rows_beside_a_sharded_weight_are_refused_unless_implicitly_replicated(ranks):
    (message,) = ranks.run(check_plain_rows)[0]
    assert "the weight is a DTensor sharded over the vocabulary but x is a plain tensor" in message
