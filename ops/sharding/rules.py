"""The sharding rule of every tk op: which placements of its inputs it runs on, and what its results then are.

A rule is a function of the call: ``rule(a)``, where ``a`` holds the op's arguments by their schema
names (a tensor argument as DTensor's spec of it: ``.ndim``, ``.shape``, ``.placements``; None when
an optional tensor is absent).  It returns the strategies the op accepts on ONE mesh dim, each a pair
``(outputs, inputs)``: a placement per result, and a ``{argument name: placement}`` for every tensor
argument given.  install.py adds the strategy every op has (everything ``Replicate``, last: of
strategies DTensor prices alike it takes the first, and a shard kept is better than a gather),
turns each pair into the lists ``register_sharding`` takes, and DTensor expands them over every
mesh dim.  Inputs placed as no strategy names are redistributed by DTensor to the cheapest one that
is (docs/distributed.md lists what each op then asks for).

The rules, in the words of the math:

* an op that treats every element (or every row, or every position) alike keeps a shard of any dim
  its kernel does not reduce over or mix: a shard of rows gives a shard of the same rows;
* a result that sums over the rows (a norm's weight gradient, a matmul's contracted dim, a summed
  loss) is ``Partial`` where the rows are sharded: each rank holds its rows' share of the sum;
* an op that is linear in an argument (a backward in its incoming gradient, ``copy``, ``add``,
  ``matmul`` in either operand, ``swiglu`` in ``up``) takes that argument ``Partial`` (sum or avg)
  with the others replicated, and gives ``Partial`` results, as PyTorch's own rules for aten.mm do;
* a mean over rows ("mean" reduction of the cross entropies) is not a sum of local means when the
  rows are sharded (each rank's count of kept rows differs), so it has no row strategy: DTensor
  gathers the rows first.  "sum" keeps the rows sharded and gives a ``Partial`` loss.
"""

from __future__ import annotations

from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard  # not a Shard in torch 2.13: named apart

R = Replicate()
LINEAR = (Partial("sum"), Partial("avg"))  # a linear map keeps either partial form


# --------------------------------------------------------------------------
# Shared shapes of rule.
# --------------------------------------------------------------------------


def _along(dims, names, n_outputs=1, **fixed):
    """For each dim d: every named tensor and every result sharded on d, the `fixed` ones as given."""
    return [([Shard(d)] * n_outputs, {**{n: Shard(d) for n in names}, **fixed}) for d in dims]


def _linear_in(names, outputs, replicated=()):
    """Partial in the `names` arguments, the `replicated` ones replicated, gives Partial results, for each
    partial form; `outputs`: per result, True if it is linear in them, False if it does not depend on
    them (an empty result not asked for: replicated)."""
    return [([p if o else R for o in outputs], {**{n: p for n in names}, **{n: R for n in replicated}}) for p in LINEAR]


def _elementwise(names, n_outputs=1, linear=(), others=()):
    """Elementwise over tensors of one shape: the same shard of each; Partial through the `linear` ones."""

    def rule(a):
        ndim = getattr(a, names[0]).ndim
        strategies = _along(range(ndim), names, n_outputs)
        if linear:
            strategies += _linear_in(linear, [True] * n_outputs, others)
        return strategies

    return rule


def _is_float(spec) -> bool:
    """Whether a tensor (DTensor's spec of it, or a plain tensor) holds floating-point numbers."""
    meta = getattr(spec, "tensor_meta", None)
    return (spec.dtype if meta is None else meta.dtype).is_floating_point


# --------------------------------------------------------------------------
# Elementwise ops (and the tour's).
# --------------------------------------------------------------------------

copy = _elementwise(("x",), linear=("x",))
square = _elementwise(("x",))
square_backward = _elementwise(("grad", "x"), linear=("grad",), others=("x",))
add = _elementwise(("a", "b"), linear=("a", "b"))
gelu = _elementwise(("x",))
gelu_backward = _elementwise(("grad", "x"), linear=("grad",), others=("x",))
swiglu = geglu = _elementwise(("gate", "up"), linear=("up",), others=("gate",))
swiglu_backward = geglu_backward = _elementwise(
    ("grad", "gate", "up"), n_outputs=2, linear=("grad",), others=("gate", "up")
)


def rgb_to_grayscale(a):
    """(*, 3, H, W) -> (*, H, W): any dim but the channels' (the weighted sum is over them); linear for
    float images (a uint8 image's result is truncated)."""
    channels = a.img.ndim - 3
    strategies = [
        ([Shard(d if d < channels else d - 1)], {"img": Shard(d)}) for d in range(a.img.ndim) if d != channels
    ]
    if _is_float(a.img):
        strategies += _linear_in(("img",), [True])
    return strategies


def rgb_to_grayscale_backward(a):
    """(*, H, W) -> (*, 3, H, W): the channel dim comes in before H."""
    channels = a.grad.ndim - 2
    strategies = [([Shard(d if d < channels else d + 1)], {"grad": Shard(d)}) for d in range(a.grad.ndim)]
    return strategies + _linear_in(("grad",), [True])


# --------------------------------------------------------------------------
# Row ops: the reduced dim whole, any other dim sharded.
# --------------------------------------------------------------------------


def _other_dims(ndim: int, reduced) -> list[int]:
    return [d for d in range(ndim) if d not in reduced]


def softmax(a):
    if a.x.ndim == 0:
        return []
    return _along(_other_dims(a.x.ndim, {a.dim % a.x.ndim}), ("x",))


def softmax_backward(a):
    """dx = y * (dy - sum(dy * y)) along dim: linear in dy."""
    if a.y.ndim == 0:
        return []
    strategies = _along(_other_dims(a.y.ndim, {a.dim % a.y.ndim}), ("grad", "y"))
    return strategies + _linear_in(("grad",), [True], ("y",))


def _norm(x_ndim: int, n_normalized: int, params: dict):
    """A norm's forward: a shard of any leading dim; the weight and bias (those given) replicated."""
    return _along(range(x_ndim - n_normalized), ("x",), **params)


def _norm_backward(x_ndim: int, n_normalized: int, params: dict, wanted: list[bool]):
    """(dx, dweight[, dbias]): dx follows the rows; dweight and dbias sum over the rows: Partial where they
    are sharded (an empty result not asked for is replicated).  Linear in the incoming gradient."""
    sums = [Partial("sum") if w else R for w in wanted]
    strategies = [
        ([Shard(d), *sums], {"grad": Shard(d), "x": Shard(d), **params}) for d in range(x_ndim - n_normalized)
    ]
    return strategies + _linear_in(("grad",), [True, *wanted], ("x", *params))


def _given(**tensors) -> dict:
    """The optional tensors that were given, replicated."""
    return {name: R for name, t in tensors.items() if t is not None}


def rms_norm(a):
    return _norm(a.x.ndim, 1, _given(weight=a.weight))


def rms_norm_backward(a):
    return _norm_backward(a.x.ndim, 1, _given(weight=a.weight), [a.weight_grad])


def layer_norm(a):
    return _norm(a.x.ndim, len(a.normalized_shape), _given(weight=a.weight, bias=a.bias))


def layer_norm_backward(a):
    return _norm_backward(a.x.ndim, len(a.normalized_shape), _given(weight=a.weight), [a.weight_grad, a.bias_grad])


def _rope(q, k, cos, sin, unsqueeze_dim: int, names: tuple[str, str]):
    """Rotary embedding of (q, k): any dim but head_dim (rotate_half mixes its halves).  q and k are
    (batch, heads, seq, head_dim) for unsqueeze_dim=1, (batch, seq, heads, head_dim) for 2; cos and
    sin (batch, seq, head_dim) follow a shard of batch or seq unless they broadcast there (size 1)."""
    if q.ndim != 4 or k.ndim != 4 or cos.ndim != 3:
        return []
    seq_dim = 2 if unsqueeze_dim == 1 else 1
    heads_dim = 3 - seq_dim
    strategies = []
    for dim, table_dim in ((0, 0), (seq_dim, 1), (heads_dim, None)):
        table = R if table_dim is None or cos.shape[table_dim] != q.shape[dim] else Shard(table_dim)
        strategies.append(([Shard(dim)] * 2, {names[0]: Shard(dim), names[1]: Shard(dim), "cos": table, "sin": table}))
    return strategies + _linear_in(names, [True, True], ("cos", "sin"))


def rope(a):
    return _rope(a.q, a.k, a.cos, a.sin, a.unsqueeze_dim, ("q", "k"))


def rope_backward(a):
    """Linear in (grad_q, grad_k), as the forward in (q, k)."""
    return _rope(a.grad_q, a.grad_k, a.cos, a.sin, a.unsqueeze_dim, ("grad_q", "grad_k"))


# --------------------------------------------------------------------------
# matmul: aten.mm's rules, on the einsum letters of its operands.
# --------------------------------------------------------------------------


def _einsum(inputs: dict[str, str], outputs: list[str | None]):
    """For each letter: every input and result that has it sharded on it, every input without it
    replicated, and every result without it Partial (it was summed over).  `outputs`: each result's
    letters, None for an empty result (not asked for), which is replicated."""
    letters = sorted({letter for word in inputs.values() for letter in word})
    strategies = []
    for letter in letters:
        results = [R if o is None else Shard(o.index(letter)) if letter in o else Partial("sum") for o in outputs]
        placed = {name: Shard(word.index(letter)) if letter in word else R for name, word in inputs.items()}
        strategies.append((results, placed))
    return strategies


def _operand_letters(a_ndim: int, b_ndim: int) -> tuple[str, str, str]:
    """(a, b, a @ b) as einsum letters: a (b)mk, b (b)kn; the product batched if either is."""
    batched = a_ndim == 3 or b_ndim == 3
    return ("bmk" if a_ndim == 3 else "mk"), ("bkn" if b_ndim == 3 else "kn"), ("bmn" if batched else "mn")


def matmul(a):
    """As aten.mm and aten.bmm: m of a, n of b, the batch of both (a shared operand replicated), or k of
    both (a Partial product); Partial in either operand with the other replicated."""
    a_letters, b_letters, c_letters = _operand_letters(a.a.ndim, a.b.ndim)
    strategies = _einsum({"a": a_letters, "b": b_letters}, [c_letters])
    return strategies + _linear_in(("a",), [True], ("b",)) + _linear_in(("b",), [True], ("a",))


def matmul_backward(a):
    """(da, db) = (grad @ b^T, a^T @ grad), summed over the batch of a shared operand: the same letters,
    each result Partial in the letters it sums over; linear in the incoming gradient."""
    a_letters, b_letters, c_letters = _operand_letters(a.a.ndim, a.b.ndim)
    outputs = [a_letters if a.a_grad else None, b_letters if a.b_grad else None]
    strategies = _einsum({"grad": c_letters, "a": a_letters, "b": b_letters}, outputs)
    return strategies + _linear_in(("grad",), [a.a_grad, a.b_grad], ("a", "b"))


# --------------------------------------------------------------------------
# Cross entropies: rows whole-classed; a row shard keeps "none" and "sum", not "mean".
# --------------------------------------------------------------------------


def _rows(*specs) -> list:
    """The placements that keep rows (dim 0) sharded: any strided shard of dim 0 an input comes in, then
    Shard(0).  Flattening sequence-sharded (batch, seq, hidden) activations to (batch*seq, hidden) rows
    gives a strided one (each rank holds its positions of every sequence); a row op does not care which
    rows a rank holds, as long as its targets are the same ones.  The placement an input comes in goes
    first: DTensor (2.13) prices moving a strided shard at nothing, and of strategies that cost alike
    takes the first."""
    found = []
    for spec in specs:
        for p in getattr(spec, "placements", ()):
            if isinstance(p, _StridedShard) and p.dim == 0 and p not in found:
                found.append(p)
    return [*found, Shard(0)]


def _row_loss(reduction: str, rows):
    """The loss of sharded rows: the rows' losses ("none"), or each rank's share of their sum."""
    return rows if reduction == "none" else Partial("sum")


def cross_entropy_forward(a):
    """(loss, lse) of (N, C) logits: a shard of the rows, the classes whole (vocabulary-sharded logits are
    gathered along the classes).  "mean" has no row strategy (see the module docstring)."""
    if a.reduction == "mean":
        return []
    return [([_row_loss(a.reduction, p), p], {"logits": p, "target": p}) for p in _rows(a.logits)]


def cross_entropy_backward(a):
    """dlogits: rows as the forward's (the incoming gradient is per row for "none", a scalar
    otherwise); linear in the incoming gradient, "mean" included."""
    strategies = _linear_in(("grad",), [True], ("logits", "target", "lse"))
    if a.reduction == "mean":
        return strategies
    rows = [
        ([p], {"grad": p if a.reduction == "none" else R, "logits": p, "target": p, "lse": p})
        for p in _rows(a.logits, a.grad)
    ]
    return rows + strategies


def linear_cross_entropy_forward(a):
    """(loss, grad_x, grad_weight, grad_bias) of x (N, H) and weight (V, H): a shard of the rows of x
    and target, the weight and bias replicated (a vocabulary-sharded weight is gathered: see
    docs/distributed.md); grad_x follows the rows, the weight's and bias's gradients sum over them.
    "none" computes no gradient here (empty results); "mean" has no row strategy."""
    if a.reduction == "mean":
        return []
    now = a.reduction != "none"
    strategies = []
    for p in _rows(a.x):
        outputs = [
            _row_loss(a.reduction, p),
            p if now and a.x_grad else R,
            Partial("sum") if now and a.weight_grad else R,
            Partial("sum") if now and a.bias_grad else R,
        ]
        strategies.append((outputs, {"x": p, "target": p, "weight": R, **_given(bias=a.bias)}))
    return strategies


def linear_cross_entropy_backward(a):
    """(grad_x, grad_weight, grad_bias) for reduction="none": the rows as the forward's; linear in the
    incoming gradient."""
    wanted = [a.x_grad, a.weight_grad, a.bias_grad]
    sums = [Partial("sum") if a.weight_grad else R, Partial("sum") if a.bias_grad else R]
    params = {"weight": R, **_given(bias=a.bias)}
    strategies = [
        ([p if a.x_grad else R, *sums], {"grad": p, "x": p, "target": p, **params}) for p in _rows(a.x, a.grad)
    ]
    return strategies + _linear_in(("grad",), wanted, ("x", "target", *params))


def linear_cross_entropy_shard_stats(a):
    """One vocabulary shard's (4, N) stats (ops/linear_cross_entropy/shard.py; vocab_parallel.py calls it on
    local tensors): a shard of the rows of x and target gives the same shard of the stats' columns."""
    return [([Shard(1)], {"x": Shard(0), "target": Shard(0), "weight": R, **_given(bias=a.bias)})]


def linear_cross_entropy_shard_backward(a):
    """One vocabulary shard's gradients: the rows as linear_cross_entropy_backward's; linear in grad."""
    wanted = [a.x_grad, a.weight_grad, a.bias_grad]
    sums = [Partial("sum") if a.weight_grad else R, Partial("sum") if a.bias_grad else R]
    params = {"weight": R, **_given(bias=a.bias)}
    rows = {"grad": Shard(0), "lse": Shard(0), "x": Shard(0), "target": Shard(0)}
    strategies = [([Shard(0) if a.x_grad else R, *sums], {**rows, **params})]
    return strategies + _linear_in(("grad",), wanted, ("lse", "x", "target", *params))


# --------------------------------------------------------------------------
# Every op's rule, by op name (torch.ops.tk.<name>).
# --------------------------------------------------------------------------

RULES = {
    name: globals()[name]
    for name in (
        "add", "copy", "square", "square_backward", "rgb_to_grayscale", "rgb_to_grayscale_backward",
        "gelu", "gelu_backward", "swiglu", "swiglu_backward", "geglu", "geglu_backward",
        "softmax", "softmax_backward", "rms_norm", "rms_norm_backward", "layer_norm", "layer_norm_backward",
        "rope", "rope_backward", "matmul", "matmul_backward",
        "cross_entropy_forward", "cross_entropy_backward", "linear_cross_entropy_forward",
        "linear_cross_entropy_backward", "linear_cross_entropy_shard_stats", "linear_cross_entropy_shard_backward",
    )
}  # fmt: skip
