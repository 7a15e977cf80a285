"""Every sharding rule of every tk op (ops/sharding/), proved on two CPU processes (gloo) against one process.

For each op, forward and backward, and each of a few calls of it (odd sizes, so shards are uneven):
every strategy its rule names is run with inputs placed exactly so, and must give DTensors with the
rule's placements, the numbers one process gives on the whole tensors, and no communication
(CommDebugMode): a tk op gathers nothing its placements do not need.  Then the ops with a gradient
go through autograd from each strategy (the backward ops meet the gradients' placements as a model
gives them), and a few calls outside every strategy show what DTensor redistributes, with the right
numbers.  The ranks are started once for the module (tests/distributed/ranks.py).
"""

from __future__ import annotations

import pytest
import torch

if not torch.distributed.is_available():  # a torch built without it: no DTensor, no rules
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from ranks import ranks_fixture
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

import ops
from ops.sharding.install import strategies
from ops.sharding.rules import RULES

WORLD = 2
IGNORE = -100


ranks = ranks_fixture(WORLD)


# --------------------------------------------------------------------------
# The calls each op is checked on: full tensors, the same on every rank (seeded).
# --------------------------------------------------------------------------


def _target(rows: int, classes: int) -> torch.Tensor:
    """Class indices with an ignored row or two, so the kept rows differ between shards."""
    target = torch.randint(0, classes, (rows,))
    target[1::3] = IGNORE
    return target


def _rope_tables(batch: int, seq: int, head_dim: int):
    return torch.randn(batch, seq, head_dim), torch.randn(batch, seq, head_dim)


def calls(name: str) -> list[tuple]:
    """The calls of torch.ops.tk.<name> to check (built after seeding, on every rank alike)."""
    x, y = torch.randn(5, 6), torch.randn(5, 6)
    x3 = torch.randn(4, 5, 6)
    logits, target = torch.randn(7, 10), _target(7, 10)
    lse = torch.logsumexp(logits, -1)
    h, weight, bias = torch.randn(7, 4), torch.randn(10, 4), torch.randn(10)
    table = {
        "copy": [(x,)],
        "square": [(x,)],
        "square_backward": [(y, x)],
        "add": [(x, y)],
        "gelu": [(x, "none"), (x3, "tanh")],
        "gelu_backward": [(y, x, "none")],
        "swiglu": [(x3, torch.randn(4, 5, 6))],
        "swiglu_backward": [(y, x, torch.randn(5, 6))],
        "geglu": [(x, y, "tanh")],
        "geglu_backward": [(x3, torch.randn(4, 5, 6), torch.randn(4, 5, 6), "none")],
        "rgb_to_grayscale": [(torch.randn(2, 3, 4, 5),), (torch.randint(0, 256, (3, 4, 4), dtype=torch.uint8),)],
        "rgb_to_grayscale_backward": [(torch.randn(2, 4, 5),)],
        "softmax": [(x3, -1), (x3, 1)],
        "softmax_backward": [(torch.randn(4, 5, 6), torch.softmax(x3, 0), 0)],
        "rms_norm": [(x3, torch.randn(6), 1e-6), (x, None, 1e-5, torch.float32)],
        "rms_norm_backward": [(torch.randn(4, 5, 6), x3, torch.randn(6), 1e-6, True), (y, x, None, None, False)],
        "layer_norm": [(x3, [6], torch.randn(6), torch.randn(6), 1e-5), (x3, [5, 6], None, None, 1e-3)],
        "layer_norm_backward": [
            (torch.randn(4, 5, 6), x3, [6], torch.randn(6), 1e-5, True, True),
            (torch.randn(4, 5, 6), x3, [5, 6], torch.randn(5, 6), 1e-5, False, False),
        ],
        "rope": [
            (torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), *_rope_tables(2, 5, 8), 1),
            (torch.randn(3, 5, 4, 8), torch.randn(3, 5, 2, 8), *_rope_tables(1, 5, 8), 2),  # cos broadcast on batch
        ],
        "rope_backward": [(torch.randn(2, 5, 4, 8), torch.randn(2, 5, 2, 8), *_rope_tables(2, 5, 8), 2)],
        "matmul": [
            (torch.randn(5, 6), torch.randn(6, 3)),
            (torch.randn(2, 5, 6), torch.randn(6, 3)),
            (torch.randn(5, 6), torch.randn(2, 6, 3)),
            (torch.randn(2, 5, 6), torch.randn(2, 6, 3)),
        ],
        "matmul_backward": [
            (torch.randn(5, 3), torch.randn(5, 6), torch.randn(6, 3), True, True),
            (torch.randn(2, 5, 3), torch.randn(2, 5, 6), torch.randn(6, 3), True, True),
            (torch.randn(2, 5, 3), torch.randn(5, 6), torch.randn(2, 6, 3), True, False),
            (torch.randn(2, 5, 3), torch.randn(2, 5, 6), torch.randn(2, 6, 3), False, True),
        ],
        "cross_entropy_forward": [
            (logits, target, IGNORE, reduction, smoothing)
            for reduction in ("none", "sum", "mean")
            for smoothing in (0.0, 0.1)
        ],
        "cross_entropy_backward": [
            (torch.randn(7), logits, target, lse, IGNORE, "none", 0.1),
            (torch.tensor(0.7), logits, target, lse, IGNORE, "sum", 0.0),
            (torch.tensor(0.7), logits, target, lse, IGNORE, "mean", 0.0),
        ],
        "linear_cross_entropy_forward": [
            (h, weight, target, bias, IGNORE, "sum", 0.1, True, True, True),
            (h, weight, target, None, IGNORE, "none", 0.0, False, False, False),
            (h, weight, target, None, IGNORE, "mean", 0.0, True, True, False),
        ],
        "linear_cross_entropy_backward": [
            (torch.randn(7), h, weight, target, bias, IGNORE, 0.0, True, True, True),
            (torch.randn(7), h, weight, target, None, IGNORE, 0.1, True, False, False),
        ],
        "linear_cross_entropy_shard_stats": [
            (h, weight[3:8], target, bias[3:8], 3, IGNORE, 0.1),
            (h, weight[:4], target, None, 0, IGNORE, 0.0),
        ],
        "linear_cross_entropy_shard_backward": [
            (torch.randn(7), torch.randn(7) + 3, h, weight[3:8], target, bias[3:8], 3, 10, IGNORE, 0.1, True, True, True),
            (torch.randn(7), torch.randn(7) + 3, h, weight[:4], target, None, 0, 10, IGNORE, 0.0, True, False, False),
        ],
    }
    return table[name]


# The ops whose gradient autograd computes through a backward op, and the arguments that get one.
DIFFERENTIABLE = {
    "copy": ("x",),
    "add": ("a", "b"),
    "square": ("x",),
    "gelu": ("x",),
    "swiglu": ("gate", "up"),
    "geglu": ("gate", "up"),
    "rgb_to_grayscale": ("img",),
    "softmax": ("x",),
    "rms_norm": ("x", "weight"),
    "layer_norm": ("x", "weight", "bias"),
    "rope": ("q", "k"),
    "matmul": ("a", "b"),
    "cross_entropy_forward": ("logits",),
    "linear_cross_entropy_forward": ("x", "weight", "bias"),
}


# --------------------------------------------------------------------------
# What runs on each rank.
# --------------------------------------------------------------------------


def _names(name: str) -> list[str]:
    return [a.name for a in getattr(torch.ops.tk, name).default._schema.arguments]


def _placed(t: torch.Tensor, placement, rank):
    """The DTensor of full tensor `t` with `placement` on the mesh (a Partial one split at random)."""
    if not isinstance(placement, Partial):
        return distribute_tensor(t, rank.mesh, [placement])
    shares = [torch.randn_like(t) for _ in range(rank.size - 1)]  # the same on every rank (seeded)
    local = (t - sum(shares)) if rank.index == 0 else shares[rank.index - 1]
    if placement.reduce_op == "avg":
        local = local * rank.size
    return DTensor.from_local(local, rank.mesh, [placement], run_check=False, shape=t.shape, stride=t.stride())


def _shardable(args, placements, size: int) -> bool:
    """Whether every sharded dim has a row for every rank (DTensor drops the strategies that do not)."""
    return all(
        not isinstance(p, Shard) or t.shape[p.dim] >= size
        for t, p in zip(args, placements)
        if isinstance(t, torch.Tensor)
    )


def _as_tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _assert_same(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    if expected.is_floating_point():
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5, msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(actual, expected), what


def check_rules_of(rank, name: str) -> dict:
    """Every strategy of `name`'s rule on every call of calls(name): placements, numbers, no communication."""
    op = getattr(torch.ops.tk, name).default
    checked = skipped = sharded = 0
    for i in range(len(calls(name))):
        torch.manual_seed(i)
        args = calls(name)[i]
        expected = _as_tuple(op(*args))
        for outputs, inputs in strategies(name, *args):
            if not _shardable(args, inputs, rank.size):
                skipped += 1
                continue
            torch.manual_seed(100 + i)
            placed = [a if p is None else _placed(a, p, rank) for a, p in zip(args, inputs)]
            what = f"tk.{name} call {i} with {inputs}"
            with CommDebugMode() as comm:
                got = _as_tuple(op(*placed))
            assert comm.get_total_counts() == 0, f"{what} communicated: {dict(comm.get_comm_counts())}"
            for k, (g, e, p) in enumerate(zip(got, expected, outputs)):
                assert g.placements == (p,), f"{what}: result {k} is {g.placements}, the rule says {p}"
                _assert_same(g.full_tensor(), e, f"{what}: result {k}")
            checked += 1
            sharded += any(p is not None and not p.is_replicate() for p in inputs)
    return {"checked": checked, "skipped": skipped, "sharded": sharded}


def _probes(outputs):
    """A fixed random weight per differentiable result: the loss is sum(result * probe)."""
    return [torch.randn(o.shape) if o.requires_grad else None for o in outputs]


def _loss_of_local(got, probes):
    """This rank's share of sum(result * probe): its shard (Shard), its addend (Partial) or, for a
    replicated result, all of it, with the gradient placed as the result is (Replicate for Partial)."""
    loss = 0
    for g, probe in zip(got, probes):
        if probe is None:
            continue
        placement = g.placements[0]
        grad_placement = Replicate() if isinstance(placement, Partial) else placement
        local_probe = distribute_tensor(probe, g.device_mesh, [grad_placement]).to_local()
        loss = loss + (g.to_local(grad_placements=[grad_placement]) * local_probe).sum()
    return loss


def check_autograd_of(rank, name: str) -> dict:
    """From every strategy without a Partial input: the gradients of sum(result * probe) against one
    process's; the communication the forward and the backward made, by strategy."""
    op = getattr(torch.ops.tk, name).default
    names = _names(name)
    wanted = [n in DIFFERENTIABLE[name] for n in names]
    communicated = {}
    for i in range(len(calls(name))):
        torch.manual_seed(i)
        args = calls(name)[i]
        if not any(w and isinstance(a, torch.Tensor) and a.is_floating_point() for a, w in zip(args, wanted)):
            continue  # a uint8 image has no gradient
        leaves = [a.clone().requires_grad_() if w and isinstance(a, torch.Tensor) else a for a, w in zip(args, wanted)]
        expected = _as_tuple(op(*leaves))
        probes = _probes(expected)
        sum((e * p).sum() for e, p in zip(expected, probes) if p is not None).backward()
        for outputs, inputs in strategies(name, *args):
            if any(isinstance(p, Partial) for p in inputs) or not _shardable(args, inputs, rank.size):
                continue
            placed = [a if p is None else _placed(a, p, rank) for a, p in zip(args, inputs)]
            placed = [t.requires_grad_() if w and p is not None else t for t, w, p in zip(placed, wanted, inputs)]
            with CommDebugMode() as forward:
                got = _as_tuple(op(*placed))
            loss = _loss_of_local(got, probes)
            with CommDebugMode() as backward:
                loss.backward()
            key = f"call {i} {[str(p) for p in inputs if p is not None]}"
            communicated[key] = (forward.get_total_counts(), backward.get_total_counts())
            for arg, leaf, n in zip(placed, leaves, names):
                if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
                    _assert_same(arg.grad.full_tensor(), leaf.grad, f"tk.{name} {key}: the gradient of {n}")
    return communicated


# --------------------------------------------------------------------------
# The tests.
# --------------------------------------------------------------------------


def _tk_ops() -> set[str]:
    """Every op in the tk namespace but the CPU twins ``<name>_cpu`` (torch.compile's opaque op on the
    CPU, which DTensor never sees: it runs on the local tensors)."""
    names = {n.split("::")[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("tk::")}
    return {n.split(".")[0] for n in names if not n.split(".")[0].endswith("_cpu")}


# Composite ops: DTensor sees the op they call (cross_entropy_forward, ...), never them.
COMPOSITES = {"cross_entropy", "linear_cross_entropy"}


def test_every_tk_op_has_a_rule():
    assert _tk_ops() - COMPOSITES == set(RULES) == set(ops.sharding.RULED)
    for name in COMPOSITES:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"tk::{name}", "CompositeImplicitAutograd")


def test_the_cache_keys_on_every_argument_but_the_tensors():
    """DTensor caches a call's sharding from its static_argnum on: every non-tensor argument."""
    schema_info = DTensor._op_dispatcher.sharding_propagator.op_to_schema_info
    for name in RULES:
        op = getattr(torch.ops.tk, name).default
        tensors = [a for a in op._schema.arguments[: schema_info[op].static_argnum]]
        assert all(str(a.type) in ("Tensor", "Optional[Tensor]") for a in tensors), name


@pytest.mark.parametrize("name", sorted(RULES))
def test_each_strategy_keeps_its_placements_and_the_numbers(ranks, name):
    results = ranks.run(check_rules_of, name)
    assert results[0] == results[1] and results[0]["checked"] > len(calls(name)) and results[0]["sharded"], results[0]


@pytest.mark.parametrize("name", sorted(DIFFERENTIABLE))
def test_gradients_through_every_strategy(ranks, name):
    communicated = ranks.run(check_autograd_of, name)[0]
    assert len(communicated) > len(calls(name))  # more than replicated inputs alone
    assert all(forward == 0 for forward, _ in communicated.values()), communicated
    assert all(backward == 0 for _, backward in communicated.values()), communicated


# --------------------------------------------------------------------------
# Outside the rules: what DTensor redistributes, and the cache.
# --------------------------------------------------------------------------


def _run_placed(rank, name: str, args, placements):
    """tk.<name> on `args` placed as given (None: not a tensor): (results, one process's, comm counts)."""
    op = getattr(torch.ops.tk, name).default
    expected = _as_tuple(op(*args))
    placements = [*placements, *[None] * (len(args) - len(placements))]
    placed = [a if p is None else _placed(a, p, rank) for a, p in zip(args, placements)]
    with CommDebugMode() as comm:
        got = _as_tuple(op(*placed))
    for k, (g, e) in enumerate(zip(got, expected)):
        _assert_same(g.full_tensor(), e, f"tk.{name} with {placements}: result {k}")
    counts = {str(kind).split(".")[-1].split("'")[0]: n for kind, n in comm.get_comm_counts().items()}
    return [g.placements[0] for g in got], counts


def check_redistributions(rank) -> dict:
    """Placements no strategy names: DTensor moves the inputs to the cheapest one that does."""
    R, S = Replicate(), Shard
    torch.manual_seed(0)
    x, logits, target = torch.randn(4, 6), torch.randn(6, 10), _target(6, 10)
    h, weight = torch.randn(6, 4), torch.randn(10, 4)
    found = {}
    found["softmax along its sharded dim"] = _run_placed(rank, "softmax", (x, -1), [S(1), None])
    found["gelu of a Partial"] = _run_placed(rank, "gelu", (x, "none"), [Partial(), None])
    found["rms_norm with its row sharded"] = _run_placed(rank, "rms_norm", (x, torch.randn(6), 1e-6), [S(1), R, None])
    ce = (logits, target, IGNORE, "sum", 0.0)
    found["cross entropy of vocabulary-sharded logits"] = _run_placed(rank, "cross_entropy_forward", ce, [S(1), R])
    mean = (logits, target, IGNORE, "mean", 0.0)
    found["a mean over sharded rows"] = _run_placed(rank, "cross_entropy_forward", mean, [S(0), S(0)])
    lce = (h, weight, target, None, IGNORE, "sum", 0.0, True, True, False)
    vocab = [S(0), S(0), S(0), None]  # x's rows, the weight's vocabulary, the targets' rows
    found["linear cross entropy of a vocabulary-sharded weight"] = _run_placed(
        rank, "linear_cross_entropy_forward", lce, vocab
    )
    return found


def check_flattened_sequence_rows(rank) -> dict:
    """Rows flattened from sequence-sharded (batch, seq, ...) tensors come strided (each rank holds its
    positions of every sequence); the cross entropies keep them so: no communication."""
    torch.manual_seed(0)
    batch, seq, classes, hidden = 2, 6, 10, 4
    logits, hiddens = torch.randn(batch, seq, classes), torch.randn(batch, seq, hidden)
    target = _target(batch * seq, classes).reshape(batch, seq)
    weight = torch.randn(classes, hidden)

    def rows(t):  # sequence-sharded, then flattened to rows
        return distribute_tensor(t, rank.mesh, [Shard(1)]).flatten(0, 1)

    def run(name, args, placed):
        op = getattr(torch.ops.tk, name).default
        expected = _as_tuple(op(*args))
        with CommDebugMode() as comm:
            got = _as_tuple(op(*placed))
        for k, (g, e) in enumerate(zip(got, expected)):
            _assert_same(g.full_tensor(), e, f"tk.{name} of strided rows: result {k}")
        return [repr(g.placements[0]) for g in got], comm.get_total_counts()

    flat = (logits.flatten(0, 1), target.flatten())
    found = {"rows": repr(rows(logits).placements[0])}
    for reduction in ("none", "sum"):
        args = (*flat, IGNORE, reduction, 0.1)
        found[f"cross_entropy_forward {reduction}"] = run(
            "cross_entropy_forward", args, (rows(logits), rows(target), *args[2:])
        )
    lse = torch.logsumexp(flat[0], -1)
    grad = torch.randn(batch, seq)
    args = (grad.flatten(), *flat, lse, IGNORE, "none", 0.1)
    placed = (rows(grad), rows(logits), rows(target), rows(lse.reshape(batch, seq)), *args[4:])
    found["cross_entropy_backward none"] = run("cross_entropy_backward", args, placed)
    w = distribute_tensor(weight, rank.mesh, [Replicate()])
    args = (hiddens.flatten(0, 1), weight, flat[1], None, IGNORE, "sum", 0.0, True, True, False)
    placed = (rows(hiddens), w, rows(target), *args[3:])
    found["linear_cross_entropy_forward sum"] = run("linear_cross_entropy_forward", args, placed)
    args = (grad.flatten(), hiddens.flatten(0, 1), weight, flat[1], None, IGNORE, 0.0, True, True, False)
    placed = (rows(grad), rows(hiddens), w, rows(target), *args[4:])
    found["linear_cross_entropy_backward"] = run("linear_cross_entropy_backward", args, placed)
    return found


def check_the_cache_keys(rank) -> list:
    """The same tensors' specs with other non-tensor arguments: each call gets its own sharding."""
    torch.manual_seed(0)
    x = torch.randn(4, 5, 6)
    found = [_run_placed(rank, "layer_norm", (x, [6]), [Shard(1), None])]  # rows of 6: kept
    found.append(_run_placed(rank, "layer_norm", (x, [5, 6]), [Shard(1), None]))  # dim 1 normalized: moved
    grad, a, b = torch.randn(5, 3), torch.randn(5, 6), torch.randn(6, 3)
    placements = [Shard(0), Shard(0), Replicate(), None, None]
    found.append(_run_placed(rank, "matmul_backward", (grad, a, b, True, True), placements))
    found.append(_run_placed(rank, "matmul_backward", (grad, a, b, False, True), placements))
    return found


def test_what_dtensor_redistributes(ranks):
    found = ranks.run(check_redistributions)[0]
    gathered = "all_gather_into_tensor"
    # Rows whole where the op reduces them: softmax and rms_norm along a sharded dim, and the rows
    # of a "mean" (its denominator counts every rank's kept rows), move; the numbers are right.
    for case in ("softmax along its sharded dim", "rms_norm with its row sharded", "a mean over sharded rows"):
        assert found[case][1], (case, found[case])
    assert found["a mean over sharded rows"][0] == [Replicate(), Replicate()]
    assert found["gelu of a Partial"][1] in ({"all_reduce": 1}, {"reduce_scatter_tensor": 1}), found
    # A vocabulary-sharded weight is gathered, once; x's rows stay sharded, the loss sum is Partial.
    placements, counts = found["linear cross entropy of a vocabulary-sharded weight"]
    assert counts == {gathered: 1} and placements[0] == Partial("sum") and placements[1] == Shard(0), found


def test_rows_flattened_from_a_sharded_sequence_stay_where_they_are(ranks):
    found = ranks.run(check_flattened_sequence_rows)[0]
    strided = found.pop("rows")
    assert strided.startswith("_StridedShard(dim=0"), strided
    for case, (placements, communicated) in found.items():
        assert communicated == 0 and strided in placements, (case, placements, communicated)
    assert found["cross_entropy_forward sum"][0][0] == "Partial(sum)"


def test_the_sharding_cache_keys_on_the_arguments(ranks):
    (kept, kept_comm), (moved, moved_comm), (both, _), (b_only, _) = ranks.run(check_the_cache_keys)[0]
    assert kept == [Shard(1)] and not kept_comm and moved != [Shard(1)] and moved_comm
    assert both == [Shard(0), Partial("sum")] and b_only == [Replicate(), Partial("sum")]


def test_a_traced_call_with_trailing_defaults_gets_its_gradient():
    """A call through torch.library's own autograd (a DTensor's, a dispatch mode's) that leaves its last
    arguments at their defaults: the dispatcher drops them, and needs_input_grad is that much shorter."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x = torch.randn(4, 6, requires_grad=True)
    with Passthrough():
        y = torch.ops.tk.layer_norm(x, [6])
    y.sum().backward()
    assert x.grad is not None
