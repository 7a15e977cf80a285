"""tk.linear_cross_entropy against F.linear + F.cross_entropy in float64.

Each test runs on the CPU (the row kernel through Triton's interpreter, the GEMMs through torch.mm,
small sizes) and, marked `gpu`, on CUDA at language-model sizes.  Tests that want several chunks of
rows pass a Tuning with tiny chunks to the Python entry point ``linear_cross_entropy_with_tuning``.
"""

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from reference import DEVICES, TOLERANCE, assert_raises_clearly, error_cases, rel_error
from torch.utils._python_dispatch import TorchDispatchMode

import ops
from ops.linear_cross_entropy.kernels import linear_cross_entropy_kernel
from ops.linear_cross_entropy.op import describe, linear_cross_entropy_with_tuning
from ops.linear_cross_entropy.plan import (
    FLOAT32,
    FLOAT32_TRACED,
    IN_OUTPUT,
    TK_GEMM,
    TORCH_GEMM,
    TUNING,
    WIDENED,
    Meta,
    choose_plan,
)
from ops.matmul import launch as matmul_launch
from ops.matmul import plan as matmul_plan
from ops.matmul.kernels import matmul_kernel, matmul_tma_kernel
from ops.runtime import H100, INTERPRETER, launcher

tk = torch.ops.tk
REDUCTIONS = ["none", "mean", "sum"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]

# Chunks of 8 rows (37 rows: four of 8 and a ragged one of 5), rows swept 16 columns at a time.
SMALL_CHUNKS = replace(TUNING, chunk_rows=8).with_cpu(max_block=16)
FLOAT32_SUM = replace(TUNING, float32_weight_sum=True)  # 16-bit weight gradients summed in float32, rounded once
# The same, each row one program (rows of more than 8 columns are not stacked into tiles).
ONE_ROW_A_PROGRAM = SMALL_CHUNKS.with_cpu(stacked_row=8)


def pick(device, cpu, cuda):
    return cuda if device == "cuda" else cpu


def as_float32(value: float) -> float:
    """label_smoothing as the kernel sees it: every float argument of a Triton kernel is float32."""
    return float(torch.tensor(value, dtype=torch.float32))


def make_case(n_rows, hidden, vocab, device, dtype, bias=True, ignore_every=5, leading=()):
    """x (*leading, N, H), a weight giving logits of spread about 3, targets with every
    `ignore_every`-th row (from row 1) ignored, a bias or None."""
    x = torch.randn(*leading, n_rows, hidden, device=device).to(dtype)
    weight = (3 * torch.randn(vocab, hidden, device=device) / hidden**0.5).to(dtype)
    target = torch.randint(0, vocab, (*leading, n_rows), device=device)
    if ignore_every:
        target[..., 1::ignore_every] = -100
    b = torch.randn(vocab, device=device).to(dtype) if bias else None
    return x, weight, target, b


def _inputs(x, weight, bias):
    return [t for t in (x, weight, bias) if t is not None]


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def tk_loss_and_grads(x, weight, target, bias, grad, tuning=None, **options):
    """tk's loss and the gradients of (x, weight[, bias]) for the incoming `grad`: the registered op,
    or (given a tuning) the same loss planned with it."""
    leaves = _leaves(*_inputs(x, weight, bias))
    args = (*leaves[:2], target, leaves[2] if bias is not None else None)
    if tuning is None:
        loss = tk.linear_cross_entropy(*args, **options)
    else:
        loss = linear_cross_entropy_with_tuning(*args, **options, tuning=tuning)
    return loss, torch.autograd.grad(loss, leaves, grad)


def torch_loss_and_grads(x, weight, target, bias, grad, label_smoothing=0.0, **options):
    """PyTorch's F.cross_entropy(F.linear(...).float()) and its gradients: in float64 for float64
    inputs (the exact answer), else in the inputs' dtype (PyTorch's own rounding)."""
    leaves = _leaves(*_inputs(x, weight, bias))
    logits = F.linear(leaves[0], leaves[1], leaves[2] if bias is not None else None)
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    loss = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), target.reshape(-1), label_smoothing=as_float32(label_smoothing), **options
    )
    loss = loss.reshape(target.shape) if options.get("reduction") == "none" else loss
    return loss, torch.autograd.grad(loss, leaves, grad.to(loss.dtype))


def reference(x, weight, target, bias, grad, **options):
    to64 = [t.double() if t is not None else None for t in (x, weight, bias)]
    return torch_loss_and_grads(to64[0], to64[1], target, to64[2], grad.double(), **options)


def check(what, got, want, dtype, scale=1.0):
    err, bound = rel_error(got, want), TOLERANCE[dtype] * scale
    assert err <= bound, f"{what}: relative error {err:.3e} > {bound:.1e} ({dtype})"


def check_against_float64(x, weight, target, bias, tuning=None, **options):
    """tk's loss and gradients against float64, each within the dtype's tolerance (twice, and no
    closer than PyTorch's own error allows, for the gradients: see below)."""
    dtype = x.dtype
    shape = target.shape if options.get("reduction") == "none" else ()
    grad = torch.randn(shape, device=x.device)
    loss, grads = tk_loss_and_grads(x, weight, target, bias, grad, tuning, **options)
    ref_loss, ref_grads = reference(x, weight, target, bias, grad, **options)
    assert loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32) and loss.shape == ref_loss.shape
    check("loss", loss, ref_loss, dtype)
    _, torch_grads = torch_loss_and_grads(x, weight, target, bias, grad, **options)
    for name, g, want, theirs in zip(("grad_x", "grad_weight", "grad_bias"), grads, ref_grads, torch_grads):
        assert g.dtype == dtype and g.shape == want.shape, name
        # float16 gradients of a mean are small (p / N): PyTorch's own carry that rounding too.
        check(name, g, want, dtype, scale=max(2, 2 * rel_error(theirs, want) / TOLERANCE[dtype]))


# ------------------------------------------------------------------ against float64


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_loss_and_gradients_match_float64(device, dtype, reduction):
    """One chunk, a bias or none, label smoothing or none; rows of one and of several column blocks."""
    shapes = pick(
        device, [(37, 16, 100, True), (5, 8, 1001, False)], [(4095, 768, 50257, False), (700, 2048, 32001, True)]
    )
    for n_rows, hidden, vocab, bias in shapes:
        x, weight, target, b = make_case(n_rows, hidden, vocab, device, dtype, bias)
        for smoothing in (0.0, 0.1):
            check_against_float64(x, weight, target, b, reduction=reduction, label_smoothing=smoothing)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("tuning", [SMALL_CHUNKS, ONE_ROW_A_PROGRAM], ids=["tiles", "one-row-a-program"])
def test_several_chunks_with_a_ragged_last_one(dtype, reduction, tuning):
    """37 rows in chunks of 8 (the last of 5), each row swept in column blocks of 16 (V = 37 padded
    to 40 columns: the last block part padding), its weight gradient summed over the chunks in the
    gradient itself.  (float64 rows are padded to 38 columns: 16 bytes are 2 of them.)"""
    x, weight, target, bias = make_case(37, 16, 37, "cpu", dtype)
    plan = choose_plan(describe(x, weight, reduction, 0.1, x_grad=True, weight_grad=True, bias_grad=True), tuning)
    stride = 38 if dtype == torch.float64 else 40
    assert (plan.chunk_rows, plan.chunks, plan.logits_stride, plan.tile.block) == (8, 5, stride, 16)
    assert plan.tile.rows == (1 if tuning is ONE_ROW_A_PROGRAM else 8)
    assert plan.weight_sum == IN_OUTPUT
    for smoothing in (0.0, 0.1):
        check_against_float64(x, weight, target, bias, tuning, reduction=reduction, label_smoothing=smoothing)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16bit_weight_gradient_summed_in_float32_when_asked(dtype):
    """float32_weight_sum=True: the 16-bit weight gradient summed over the chunks in float32, from float32
    copies (the interpreter's way), and rounded once."""
    tuning = replace(SMALL_CHUNKS, float32_weight_sum=True)
    x, weight, target, bias = make_case(37, 16, 37, "cpu", dtype)
    assert choose_plan(describe(x, weight, "mean", 0.0, weight_grad=True), tuning).weight_sum == WIDENED
    check_against_float64(x, weight, target, bias, tuning, reduction="mean")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_the_weight_gradient_summed_by_tk_s_matmul(monkeypatch, dtype, reduction):
    """tk_weight_gemm on the interpreter: each chunk's dlogits^T @ x_c written, then added, into the
    gradient by tk's matmul (ops.matmul.op.product_into) in its epilogue; planned as a GPU with TMA
    descriptors would, 16-bit operands take the TMA kernel (V = 300, H = 136: 15 tiles of 64 x 64), the
    others the pointer kernel.  Every gradient against float64."""
    seen, launcher_ = [], matmul_launch.launcher

    def recording(kernel, like):
        launch = launcher_(kernel, like)

        class Recorded:
            def __getitem__(self, grid):
                def run(*args, **flags):
                    if "ACCUMULATE" in flags:  # the GEMMs (not a copy of an operand: matmul's Plan.realign_b)
                        seen.append((kernel, flags["ACCUMULATE"]))
                    return launch[grid](*args, **flags)

                return run

        return Recorded()

    monkeypatch.setattr(matmul_launch, "launcher", recording)
    monkeypatch.setattr(matmul_plan, "tma_available", lambda device: True)
    tuning = SMALL_CHUNKS.with_cpu(tk_weight_gemm=True)
    x, weight, target, bias = make_case(37, 136, 300, "cpu", dtype)
    plan = choose_plan(describe(x, weight, reduction, 0.0, x_grad=True, weight_grad=True), tuning)
    assert (plan.chunks, plan.weight_sum, plan.weight_gemm) == (5, IN_OUTPUT, TK_GEMM)
    check_against_float64(x, weight, target, bias, tuning, reduction=reduction)
    kernel = matmul_tma_kernel if dtype in (torch.float16, torch.bfloat16) else matmul_kernel
    assert seen == [(kernel, False)] + [(kernel, True)] * 4, seen  # one GEMM a chunk: the first writes


class _GemmShapes(TorchDispatchMode):
    """The operands' shapes of every mm and addmm under the mode."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.mm.out, torch.ops.aten.addmm.default, torch.ops.aten.addmm.out):
            self.shapes.append([tuple(a.shape) for a in args if isinstance(a, torch.Tensor)])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_odd_vocabulary_reaches_the_gemms_padded_to_16_bytes(dtype):
    """V = 37 (rows of 74 or 148 bytes): the GEMMs read the weight and write the logits padded to 40 classes
    (cuBLAS's fast kernels need whole 16-byte runs), the padded classes add nothing, and the gradients have
    V rows; unpadded (Tuning.pad_weight=False) the same numbers."""
    x, weight, target, bias = make_case(37, 16, 37, "cpu", dtype)
    meta = describe(x, weight, "mean", 0.1, x_grad=True, weight_grad=True, bias_grad=True)
    assert choose_plan(meta, SMALL_CHUNKS).pad_weight and not choose_plan(meta, replace(SMALL_CHUNKS, pad_weight=False)).pad_weight
    assert not plan_for(8191, 2048, 128256).pad_weight and plan_for(4095, 768, 50257).pad_weight  # Llama 3's, GPT-2's
    assert not plan_for(100, 768, 50257).pad_weight  # a few rows: the copy would cost more than it saves
    leaves = [t.detach().requires_grad_() for t in (x, weight, bias)]
    with _GemmShapes() as gemms:
        loss = linear_cross_entropy_with_tuning(leaves[0], leaves[1], target, leaves[2], label_smoothing=0.1,
                                                tuning=SMALL_CHUNKS)  # fmt: skip
    dims = {d for shapes in gemms.shapes for shape in shapes for d in shape}
    assert gemms.shapes and 40 in dims and 37 not in dims, gemms.shapes
    grads = torch.autograd.grad(loss, leaves)
    assert [tuple(g.shape) for g in grads] == [(37, 16), (37, 16), (37,)]
    for tuning in (SMALL_CHUNKS, replace(SMALL_CHUNKS, pad_weight=False)):
        check_against_float64(x, weight, target, bias, tuning, reduction="mean", label_smoothing=0.1)


@pytest.mark.parametrize("device", DEVICES)
def test_x_of_three_dims_and_unbatched(device):
    """x (B, T, H) with target (B, T), and x (H,) with a 0-d target, as F.cross_entropy takes them."""
    x, weight, target, bias = make_case(7, 16, 50, device, torch.float32, leading=(3,))
    for reduction in REDUCTIONS:
        check_against_float64(x, weight, target, bias, reduction=reduction)
        check_against_float64(x, weight, target, bias, SMALL_CHUNKS, reduction=reduction)
        check_against_float64(x[0, 2], weight, target[0, 0], bias, reduction=reduction)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ignore_index", [-100, 3])
def test_ignored_rows(device, ignore_index):
    """ignore_index may be a valid class too; an ignored row's gradient is 0 (its x row gets none)."""
    x, weight, target, bias = make_case(40, 16, 7, device, torch.float32, ignore_every=0)
    target[::4] = ignore_index
    for reduction in REDUCTIONS:
        options = dict(ignore_index=ignore_index, reduction=reduction, label_smoothing=0.1)
        check_against_float64(x, weight, target, bias, **options)
        grad = torch.ones(40 if reduction == "none" else (), device=device)
        _, (grad_x, _, _) = tk_loss_and_grads(x, weight, target, bias, grad, SMALL_CHUNKS, **options)
        assert (grad_x[target == ignore_index] == 0).all()


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide")  # a mean over no row: 0 / 0
@pytest.mark.parametrize("device", DEVICES)
def test_every_row_ignored(device):
    """As PyTorch: each row's loss 0, a sum of 0, a mean of 0 / 0 = NaN; every gradient 0."""
    x, weight, _, bias = make_case(13, 16, 30, device, torch.float32)
    target = torch.full((13,), -100, device=device)
    for reduction in REDUCTIONS:
        for tuning in (None, SMALL_CHUNKS):
            grad = torch.ones(13 if reduction == "none" else (), device=device)
            loss, grads = tk_loss_and_grads(
                x, weight, target, bias, grad, tuning, reduction=reduction, label_smoothing=0.1
            )
            ref_loss, _ = reference(x, weight, target, bias, grad, reduction=reduction, label_smoothing=0.1)
            torch.testing.assert_close(loss.double(), ref_loss, equal_nan=True)
            assert all(torch.equal(g, torch.zeros_like(g)) for g in grads)


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide")  # a mean over no row: 0 / 0
@pytest.mark.parametrize("device", DEVICES)
def test_no_rows(device):
    """N = 0: the loss F.cross_entropy gives (mean NaN, sum 0, none empty), gradients of zeros."""
    x, weight, target, bias = make_case(0, 16, 30, device, torch.float32)
    for reduction in REDUCTIONS:
        grad = torch.ones(0 if reduction == "none" else (), device=device)
        loss, (grad_x, grad_weight, grad_bias) = tk_loss_and_grads(x, weight, target, bias, grad, reduction=reduction)
        ref_loss, _ = reference(x, weight, target, bias, grad, reduction=reduction)
        assert loss.shape == ref_loss.shape
        torch.testing.assert_close(loss.double(), ref_loss, equal_nan=True)
        assert grad_x.shape == (0, 16) and torch.equal(grad_weight, torch.zeros_like(weight))
        assert torch.equal(grad_bias, torch.zeros_like(bias))


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_range_targets_give_nan(device):
    """PyTorch raises (CPU) or asserts (CUDA); tk cannot read the targets on the host, so such a
    row's loss is NaN, and so are its row of grad_x and the whole weight gradient; other rows' losses
    and grad_x rows are right."""
    x, weight, target, bias = make_case(10, 16, 30, device, torch.float32, ignore_every=0)
    bad = torch.tensor([0, 3, 7], device=device)
    target[bad] = torch.tensor([30, -1, -(2**40)], device=device)
    good = torch.ones(10, dtype=torch.bool, device=device)
    good[bad] = False
    loss, (grad_x, grad_weight, _) = tk_loss_and_grads(
        x, weight, target, bias, torch.ones(10, device=device), reduction="none"
    )
    assert loss[bad].isnan().all() and not loss[good].isnan().any()
    assert grad_x[bad].isnan().all() and not grad_x[good].isnan().any() and grad_weight.isnan().all()
    ref_loss, (ref_grad_x, _, _) = reference(
        x[good], weight, target[good], bias, torch.ones(7, device=device), reduction="none"
    )
    check("loss", loss[good], ref_loss, torch.float32)
    check("grad_x", grad_x[good], ref_grad_x, torch.float32)
    for reduction in ("mean", "sum"):
        assert tk.linear_cross_entropy(x, weight, target, bias, reduction=reduction).isnan()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy sees the infinities
@pytest.mark.parametrize("device", DEVICES)
def test_extreme_logits(device):
    """Huge logits, one dominant logit, and a row of -inf logits (NaN, as in PyTorch), through a
    weight that makes them: the online sum must neither overflow nor turn NaN."""
    hidden, vocab = 4, 40
    weight = torch.zeros(vocab, hidden, device=device)
    weight[:, 0] = torch.linspace(-1, 1, vocab)
    weight[7, 1] = 1.0
    x = torch.zeros(5, hidden, device=device)
    x[0, 0] = 1e30  # logits of 1e30 spread
    x[1, 1] = 1e38  # one logit of 1e38, the others 0
    x[2, 0] = 3.0  # ordinary
    x[3, 0] = -float("inf")  # -inf and +inf logits: NaN, as in PyTorch
    x[4, 0] = 1e4
    target = torch.tensor([vocab - 1, 7, 3, 5, 0], device=device)
    loss = tk.linear_cross_entropy(x, weight, target, reduction="none")
    ref = F.cross_entropy((x.double() @ weight.double().t()).float(), target, reduction="none").double()
    torch.testing.assert_close(loss, ref.float(), equal_nan=True, rtol=1e-5, atol=1e-5)
    assert loss[3].isnan() and loss[:3].isfinite().all()


# ------------------------------------------------------------------ autograd and the ops


class _Outputs(TorchDispatchMode):
    """The results of every call of tk.linear_cross_entropy_forward under the mode."""

    def __init__(self):
        super().__init__()
        self.results = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.tk.linear_cross_entropy_forward.default:
            self.results.append(out)
        return out


@pytest.mark.parametrize("device", DEVICES)
def test_the_gradients_computed_are_those_asked_for(device):
    """The forward op computes the gradients of the inputs that require them, and none under
    no_grad: its results for the others are empty tensors (not just unused)."""
    x, weight, target, bias = make_case(9, 16, 30, device, torch.float32)

    def results(requires, context):
        leaves = [t.detach().requires_grad_(r) for t, r in zip((x, weight, bias), requires)]
        with _Outputs() as outputs, context():
            tk.linear_cross_entropy(leaves[0], leaves[1], target, leaves[2])
        (result,) = outputs.results
        return [t.numel() > 0 for t in result[1:]]

    assert results((True, True, True), torch.enable_grad) == [True, True, True]
    assert results((True, False, False), torch.enable_grad) == [True, False, False]  # a frozen head
    assert results((False, True, True), torch.enable_grad) == [False, True, True]
    assert results((True, True, True), torch.no_grad) == [False, False, False]
    with torch.no_grad():
        assert not tk.linear_cross_entropy(x.requires_grad_(), weight, target).requires_grad


def test_the_forward_op_refuses_a_gradient_it_was_not_asked_for():
    x, weight, target, _ = make_case(5, 8, 11, "cpu", torch.float32)
    x = x.requires_grad_()
    loss, *_ = tk.linear_cross_entropy_forward(x, weight, target, None, -100, "mean", 0.0, False, False, False)
    with pytest.raises(RuntimeError, match="x needs a gradient, but the forward was called with x_grad=False"):
        loss.backward()


# ------------------------------------------------------------------ what the backward holds


def _forward_with_byproducts(x, weight, target):
    """The forward op called directly, as the user-facing op calls it: (leaves, loss, grad_x, grad_weight)."""
    leaves = _leaves(x, weight)
    loss, grad_x, grad_weight, _ = tk.linear_cross_entropy_forward(*leaves, target, None, -100, "mean", 0.0, True, True, False)
    return leaves, loss, grad_x, grad_weight


@pytest.mark.parametrize("device", DEVICES)
def test_the_backward_returns_the_stored_gradients_scaled_in_place(device):
    """With the graph freed after it, the backward hands back the very buffers the forward wrote,
    scaled: a step holds the weight's gradient once.  Against float64, for an incoming gradient of 3."""
    x, weight, target, _ = make_case(37, 16, 30, device, torch.float32)
    leaves, loss, grad_x, grad_weight = _forward_with_byproducts(x, weight, target)
    got = torch.autograd.grad(3 * loss, leaves)
    assert [g.data_ptr() for g in got] == [grad_x.data_ptr(), grad_weight.data_ptr()]
    _, want = reference(x, weight, target, None, torch.tensor(3.0, device=device), reduction="mean")
    for name, g, w in zip(("grad_x", "grad_weight"), got, want):
        check(name, g, w, torch.float32)


def test_the_backward_launches_its_scaling_directly(monkeypatch):
    """The in-place scaling runs eagerly by construction: its kernel is launched directly, as the op's
    own eager calls are, not through wrap_triton's dispatch (host time on every step)."""
    import ops.linear_cross_entropy.op as op_module

    seen = []

    def recording(t, scale):
        seen.append(op_module.launching_directly())
        return scale_in_place(t, scale)

    scale_in_place = op_module.scale_in_place
    monkeypatch.setattr(op_module, "scale_in_place", recording)
    x, weight, target, _ = make_case(9, 8, 20, "cpu", torch.float32)
    leaves = _leaves(x, weight)
    tk.linear_cross_entropy(*leaves, target).backward()
    assert seen == [True, True]


@pytest.mark.parametrize("device", DEVICES)
def test_a_retained_graph_keeps_its_stored_gradients(device):
    """backward(retain_graph=True) then backward again: each pass scales the stored gradients afresh
    (out of place), so the sums are 2 + 3 times the gradient, not 2 + 6."""
    x, weight, target, _ = make_case(37, 16, 30, device, torch.float32)
    leaves = _leaves(x, weight)
    loss = tk.linear_cross_entropy(*leaves, target)
    (2 * loss).backward(retain_graph=True)
    (3 * loss).backward()
    _, want = reference(x, weight, target, None, torch.tensor(5.0, device=device), reduction="mean")
    for name, leaf, w in zip(("grad_x", "grad_weight"), leaves, want):
        check(name, leaf.grad, w, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_create_graph_records_the_scaling(device):
    """create_graph=True without retain_graph: the gradients stay functions of the incoming one, so
    d(sum grad_x)/ds for the loss s * L is sum grad_x of L (against float64)."""
    x, weight, target, _ = make_case(37, 16, 30, device, torch.float32)
    leaves = _leaves(x, weight)
    s = torch.tensor(1.5, device=device, requires_grad=True)
    loss = s * tk.linear_cross_entropy(*leaves, target)
    (grad_x,) = torch.autograd.grad(loss, leaves[0], create_graph=True, retain_graph=False)
    assert grad_x.grad_fn is not None
    (d_s,) = torch.autograd.grad(grad_x.sum(), s)
    _, (want, _) = reference(x, weight, target, None, torch.tensor(1.0, device=device), reduction="mean")
    check("d(sum grad_x)/ds", d_s.reshape(1), want.sum().reshape(1), torch.float32)


class _Allocations(TorchDispatchMode):
    """The shapes of the tensors each aten op creates."""

    def __init__(self):
        super().__init__()
        self.created = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self.created.append((str(func), tuple(out.shape)))
        return out


def test_the_backward_gets_no_zeros_for_the_stored_gradients():
    """The forward's by-products get no gradient; autograd must not materialize zeros the size of each
    (the weight's gradient among them) for the backward to ignore."""
    x, weight, target, _ = make_case(37, 16, 30, "cpu", torch.float32)
    leaves, loss, *_ = _forward_with_byproducts(x, weight, target)
    with _Allocations() as allocations:
        torch.autograd.grad(loss, leaves)
    zeros = [(name, shape) for name, shape in allocations.created if "zeros" in name]
    assert zeros == [], f"zeros made for the backward: {zeros}"


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("tuning", [None, SMALL_CHUNKS], ids=["one-chunk", "chunks"])
def test_gradcheck(reduction, tuning):
    x, weight, target, bias = make_case(11, 5, 7, "cpu", torch.float64)
    target[2] = 6

    def loss(x, weight, bias):
        if tuning is None:
            return tk.linear_cross_entropy(x, weight, target, bias, reduction=reduction, label_smoothing=0.25)
        return linear_cross_entropy_with_tuning(
            x, weight, target, bias, reduction=reduction, label_smoothing=0.25, tuning=tuning
        )

    assert torch.autograd.gradcheck(loss, _leaves(x, weight, bias), fast_mode=True)


def test_second_derivative_is_refused():
    """The stored gradients are not differentiable, the backward op has no formula: a clear error."""
    x, weight, target, _ = make_case(3, 4, 5, "cpu", torch.float64)
    x = x.requires_grad_()
    (dx,) = torch.autograd.grad(
        tk.linear_cross_entropy(x, weight, target, reduction="none").sum(), x, create_graph=True
    )
    with pytest.raises(RuntimeError, match="no autograd formula|does not require grad"):
        torch.autograd.grad(dx.sum(), x)


@pytest.mark.parametrize("device", DEVICES)
def test_an_expanded_incoming_gradient(device):
    """loss.sum().backward() hands reduction="none" a gradient of stride 0."""
    x, weight, target, bias = make_case(20, 16, 30, device, torch.float32)
    leaves = _leaves(x, weight)
    tk.linear_cross_entropy(*leaves, target, reduction="none").sum().backward()
    _, (ref_x, ref_weight) = reference(x, weight, target, None, torch.ones(20, device=device), reduction="none")
    check("grad_x", leaves[0].grad, ref_x, torch.float32)
    check("grad_weight", leaves[1].grad, ref_weight, torch.float32)


def test_autocast_casts_as_for_f_linear():
    """Under autocast the inputs are cast as F.linear's are; the loss is float32 and float32 leaves get
    float32 gradients, the answer that of the cast inputs."""
    x, weight, target, bias = make_case(9, 16, 30, "cpu", torch.float32)
    leaves = _leaves(x, weight, bias)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = tk.linear_cross_entropy(leaves[0], leaves[1], target, leaves[2])
    grads = torch.autograd.grad(loss, leaves)
    assert loss.dtype == torch.float32 and all(g.dtype == torch.float32 for g in grads)
    cast = [t.bfloat16() for t in (x, weight, bias)]
    ref_loss, ref_grads = reference(cast[0], cast[1], target, cast[2], torch.tensor(1.0))
    check("loss", loss, ref_loss, torch.bfloat16)
    for name, g, want in zip(("grad_x", "grad_weight", "grad_bias"), grads, ref_grads):
        check(name, g, want, torch.bfloat16, scale=2)


def opcheck_cases(device):
    x, weight, target, bias = make_case(6, 5, 7, device, torch.float32)
    x16, weight16, _, bias16 = make_case(6, 5, 7, device, torch.bfloat16)
    x, weight, bias, x16, weight16 = (t.requires_grad_() for t in (x, weight, bias, x16, weight16))
    forward, backward = tk.linear_cross_entropy_forward.default, tk.linear_cross_entropy_backward.default
    grad = torch.randn(6, device=device)
    partly_ignored = torch.tensor([3, 4, 5, 6, 3, 0], device=device)
    return [
        (tk.linear_cross_entropy.default, (x, weight, target, bias), {}),
        (tk.linear_cross_entropy.default, (x, weight, target), {"reduction": "none", "label_smoothing": 0.1}),
        (tk.linear_cross_entropy.default, (x16.reshape(2, 3, 5), weight16, target.reshape(2, 3)), {"reduction": "sum"}),
        *[(forward, (x, weight, target, bias, -100, r, 0.1, True, True, True), {}) for r in REDUCTIONS],
        # ignore_index 3, a valid class, and a frozen head.  The targets are spelled out: random ones
        # could all be ignored (on CUDA's generator they were), and a mean over no rows is NaN.
        (forward, (x16, weight16.detach(), partly_ignored, bias16, 3, "mean", 0.0, True, False, False), {}),
        (backward, (grad, x.detach(), weight.detach(), target, bias.detach(), -100, 0.1, True, True, True), {}),
        (backward, (grad, x.detach(), weight.detach(), target, None, -100, 0.0, False, True, False), {}),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for op, args, kwargs in opcheck_cases(device):
        torch.library.opcheck(op, args, kwargs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_compiled_matches_eager(device, reduction):
    """torch.compile(fullgraph=True) of a head with its loss, forward and backward: the composite is
    traced into the forward op; "none" brings the backward op into the backward graph."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    x, weight, target, bias = make_case(37, 16, 101, device, torch.float32)  # V odd: padded (on a CPU)

    def head_loss(x, weight, bias):
        loss = tk.linear_cross_entropy(torch.tanh(x), weight, target, bias, reduction=reduction, label_smoothing=0.1)
        return loss.sum()

    def loss_and_grads(fn):
        leaves = _leaves(x, weight, bias)
        loss = fn(*leaves)
        return loss, torch.autograd.grad(loss, leaves)

    (compiled_loss, compiled_grads), code = run_and_get_code(
        lambda: loss_and_grads(torch.compile(head_loss, fullgraph=True))
    )
    eager_loss, eager_grads = loss_and_grads(head_loss)
    torch.testing.assert_close(compiled_loss, eager_loss)
    for got, want in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(got, want)
    source = "\n".join(code)
    if device == "cuda":  # Inductor's output code launches tk's own kernel
        names = ["linear_cross_entropy_kernel"]
    else:  # the compiled CPU graph calls tk's opaque CPU ops
        names = ["tk.linear_cross_entropy_forward_cpu"] + (
            ["tk.linear_cross_entropy_backward_cpu"] if reduction == "none" else []
        )
    for name in names:
        assert name in source, f"{name} missing from the compiled code"


@pytest.mark.gpu
def test_compiled_16bit_weight_gradient_over_several_chunks():
    """Traced for Inductor, a bfloat16 weight gradient over several chunks is summed in place, one rounding a
    chunk: the compiled step's loss and gradients are those of float64, as the eager step's are.  (With
    float32_weight_sum, traced, the sum is mm(..., out_dtype=float32) and an add: Inductor cannot lower
    addmm with out_dtype.)"""
    torch._dynamo.reset()
    x, weight, target, _ = make_case(2100, 64, 1001, "cuda", torch.bfloat16)  # V odd: the weight padded, traced
    assert plan_for(2100, 64, 1001, eager=False).weight_sum == IN_OUTPUT and plan_for(2100, 64, 1001).pad_weight
    assert plan_for(2100, 64, 1001, eager=False, tuning=FLOAT32_SUM).weight_sum == FLOAT32_TRACED

    def step(x, weight):
        return tk.linear_cross_entropy(x, weight, target, label_smoothing=0.1)

    compiled = torch.compile(step, fullgraph=True)
    leaves = _leaves(x, weight)
    loss = compiled(*leaves)
    grads = torch.autograd.grad(loss, leaves)
    ref_loss, ref_grads = reference(x, weight, target, None, torch.tensor(1.0, device="cuda"), label_smoothing=0.1)
    check("loss", loss, ref_loss, torch.bfloat16)
    for name, g, want in zip(("grad_x", "grad_weight"), grads, ref_grads):
        check(name, g, want, torch.bfloat16, scale=2)


# ------------------------------------------------------------------ errors


def ones(*shape, dtype=torch.float32, device="cpu"):
    return torch.ones(shape, dtype=dtype, device=device)


def labels(*shape, dtype=torch.int64, device="cpu"):
    return torch.zeros(shape, dtype=dtype, device=device)


def lce(x=(3, 4), weight=(5, 4), target=(3,), *args, **kwargs):
    """tk.linear_cross_entropy of the given tensors, or of ones and zeros of the given shapes."""
    x, weight = (ones(*t) if isinstance(t, tuple) else t for t in (x, weight))
    target = labels(*target) if isinstance(target, tuple) else target
    return tk.linear_cross_entropy(x, weight, target, *args, **kwargs)


def lce_forward(x, weight, target, bias, *wanted):
    return tk.linear_cross_entropy_forward(x, weight, target, bias, -100, "mean", 0.0, *wanted)


def lce_backward(grad, x, weight, target):
    return tk.linear_cross_entropy_backward(grad, x, weight, target, None, -100, 0.0, True, True, False)


F16, BF16, I32 = torch.float16, torch.bfloat16, torch.int32
ERROR_CASES = [
    ("int x", lambda: lce(labels(3, 4)), TypeError, "tk.linear_cross_entropy: x has dtype int64"),
    ("0-D x", lambda: lce(torch.tensor(1.0), (5, 1), ()), ValueError, "x must have at least one dimension"),
    ("1-D weight", lambda: lce(weight=(4,)), ValueError, "weight must be 2-D"),
    ("features differ", lambda: lce(weight=(5, 6)), ValueError, r"weight must be \(V, 4\), as nn.Linear keeps it"),
    ("weight (H, V)", lambda: lce(weight=(4, 5)), ValueError, r"weight has shape \(4, 5\): weight must be \(V, 4\)"),
    ("no classes", lambda: lce(weight=(0, 4)), ValueError, "at least one class"),
    ("dtypes differ", lambda: lce(weight=ones(5, 4, dtype=BF16)), TypeError,
     "x has dtype torch.float32 but weight has dtype torch.bfloat16"),
    ("bias dtype", lambda: lce((3, 4), (5, 4), (3,), ones(5, dtype=F16)), TypeError,
     "x has dtype torch.float32 but bias has dtype torch.float16"),
    ("bias shape", lambda: lce((3, 4), (5, 4), (3,), ones(6)), ValueError, r"bias has shape \(6,\); a weight of 5"),
    ("bias 2-D", lambda: lce((3, 4), (5, 4), (3,), ones(1, 5)), ValueError, "bias must be 1-D"),
    ("float target", lambda: lce(target=ones(3)), TypeError, "class-probability targets are not supported"),
    ("int32 target", lambda: lce(target=labels(3, dtype=I32)), TypeError, "target has dtype int32; supported: int64"),
    ("target shape", lambda: lce((2, 3, 4), (5, 4), (6,)), ValueError, r"target has shape \(6,\); x of shape \(2, 3"),
    ("reduction", lambda: lce(reduction="avg"), ValueError, "reduction must be 'none', 'mean' or 'sum'"),
    ("smoothing > 1", lambda: lce(label_smoothing=1.5), ValueError, "label_smoothing must be between"),
    ("weight on meta", lambda: lce(weight=ones(5, 4, device="meta")), ValueError, "x is on cpu but weight is on meta"),
    ("target on meta", lambda: lce(target=labels(3, device="meta")), ValueError, "x is on cpu but target is on meta"),
    ("forward 3-D x", lambda: lce_forward(ones(2, 3, 4), ones(5, 4), labels(2, 3), None, True, True, False), ValueError,
     "x must be 2-D"),
    ("forward bias_grad without a bias", lambda: lce_forward(ones(3, 4), ones(5, 4), labels(3), None, True, True, True),
     ValueError, "bias_grad=True asks for the gradient of a bias, but bias is None"),
    ("backward grad shape", lambda: lce_backward(ones(4), ones(3, 4), ones(5, 4), labels(3)), ValueError,
     r"grad has shape \(4,\); x of shape"),
]  # fmt: skip


@error_cases(ERROR_CASES)
def test_bad_input_raises_a_clear_error(case):
    assert_raises_clearly(case)


@pytest.mark.gpu
def test_device_mismatch_on_cuda():
    with pytest.raises(ValueError, match="x is on cuda:0 but weight is on cpu"):
        lce(ones(3, 4, device="cuda"), (5, 4), labels(3, device="cuda"))


# ------------------------------------------------------------------ the plan and the kernel


def plan_for(n_rows, hidden, vocab, dtype=torch.bfloat16, facts=H100, tuning=TUNING, **fields):
    """The plan of an eager call that wants grad_x and grad_weight, unless `fields` (Meta's) say otherwise."""
    fields = {"x_grad": True, "weight_grad": True, **fields}
    meta = Meta(n_rows, hidden, vocab, torch.empty((), dtype=dtype).element_size(), facts, **fields)
    return choose_plan(meta, tuning)


# (N, H, V) -> (rows a chunk, chunks) on an H100: a chunk of at most max(1024, H / 2 to the nearest
# power of two) rows, the chunks
# evened out and rounded up to 128 rows.
GPU_CHUNKS = {
    (4095, 768, 50257): (1024, 4),  # GPT-2: 1024 rows at least
    (8191, 768, 50257): (1024, 8),
    (8191, 2048, 128256): (1024, 8),  # Llama 3.2 1B: H / 2 = 1024
    (16383, 2048, 128256): (1024, 16),
    (8191, 4096, 128256): (2048, 4),  # Llama 3 8B
    (8191, 3584, 152064): (2048, 4),  # Qwen2 7B: H / 2 = 1792, nearest power of two 2048
    (4097, 4096, 32768): (1408, 3),  # a ragged split evened out: 1366 rows, rounded up to 1408
    (8191, 2560, 51200): (1024, 8),  # Phi-2: H / 2 = 1280, nearest power of two 1024
    (1000, 4096, 128256): (1000, 1),  # one chunk of every row
}


def test_the_chunk_rule_on_an_h100():
    """Chunks of max(1024, H / 2 to the nearest power of two) rows at most: the chunk's logits never
    hold more elements than 0.71 of the weight, or than 1024 rows; bf16 weight gradients of several
    chunks summed in float32."""
    for (n_rows, hidden, vocab), expected in GPU_CHUNKS.items():
        plan = plan_for(n_rows, hidden, vocab)
        assert (plan.chunk_rows, plan.chunks) == expected, (n_rows, hidden, vocab)
        assert plan.chunk_rows <= max(1024, 0.71 * hidden) and (plan.chunks - 1) * plan.chunk_rows < n_rows
        assert (plan.weight_sum, plan.weight_gemm) == (IN_OUTPUT, TORCH_GEMM)  # cuBLAS's addmm: measured faster
        assert plan_for(n_rows, hidden, vocab, tuning=FLOAT32_SUM).weight_sum == (FLOAT32 if plan.chunks > 1 else IN_OUTPUT)
        assert (plan.tile.rows, plan.tile.block, plan.tile.warps) == (1, 4096, 16)
    # tk's GEMM for the weight gradient, where asked: 16-bit weights summed in themselves, eagerly, on Hopper.
    tk_gemm = replace(TUNING, tk_weight_gemm=replace(TUNING.tk_weight_gemm, cuda=True))
    assert plan_for(8191, 4096, 128256, tuning=tk_gemm).weight_gemm == TK_GEMM
    assert plan_for(8191, 4096, 128256, torch.float32, tuning=tk_gemm).weight_gemm == TORCH_GEMM
    assert plan_for(8191, 4096, 128256, eager=False, tuning=tk_gemm).weight_gemm == TORCH_GEMM
    assert plan_for(8191, 4096, 128256, facts=replace(H100, capability=(8, 0)), tuning=tk_gemm).weight_gemm == TORCH_GEMM
    assert plan_for(8191, 4096, 128256, facts=INTERPRETER, tuning=tk_gemm).weight_gemm == TORCH_GEMM
    assert plan_for(8191, 4096, 128256, tuning=replace(tk_gemm, float32_weight_sum=True)).weight_gemm == TORCH_GEMM
    assert plan_for(8191, 4096, 128256, torch.float32, tuning=FLOAT32_SUM).weight_sum == IN_OUTPUT  # float32 weights
    assert plan_for(8191, 4096, 128256, facts=INTERPRETER, tuning=FLOAT32_SUM).weight_sum == WIDENED
    assert plan_for(8191, 4096, 128256, eager=False, tuning=FLOAT32_SUM).weight_sum == FLOAT32_TRACED  # for Inductor
    assert plan_for(8191, 4096, 128256, tuning=replace(TUNING, chunk_rows=512)).chunks == 16
    assert plan_for(0, 4096, 128256).chunks == 0
    with pytest.raises(ValueError, match="chunk_rows must be at least 1"):
        replace(TUNING, chunk_rows=0)


def test_the_logits_rows_are_padded_to_16_bytes():
    """V = 50257: rows of 50264 bfloat16 (8 x 6283), 50260 float32, 50258 float64 columns."""
    for dtype, stride, multiple in ((torch.bfloat16, 50264, 8), (torch.float32, 50260, 4), (torch.float64, 50258, 2)):
        plan = plan_for(4095, 768, 50257, dtype)
        assert (plan.logits_stride, plan.tile.row_multiple) == (stride, multiple)
    assert plan_for(4095, 768, 32768).logits_stride == 32768


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the NaN padding, seen by the interpreter's numpy
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_kernel_masks_the_padding_and_overwrites_the_logits(smoothing):
    """The row kernel on a chunk whose rows are padded with NaN (whatever memory held): the losses and
    the gradient written over the logits are those of the V columns; the padding comes out 0."""
    vocab, n_rows = 37, 6
    logits = 3 * torch.randn(n_rows, vocab)
    target = torch.tensor([0, 36, -100, 5, 17, 3])
    plan = plan_for(n_rows, 4, vocab, torch.float32, INTERPRETER, tuning=SMALL_CHUNKS, reduction="sum", x_grad=True)
    buffer = torch.full((n_rows, plan.logits_stride), float("nan"))
    buffer[:, :vocab] = logits
    row_loss = torch.empty(n_rows)
    tile = plan.tile
    launcher(linear_cross_entropy_kernel, buffer)[(n_rows // tile.rows + 1,)](
        buffer, target, row_loss, buffer, buffer, n_rows, vocab, plan.logits_stride, 0, -100, smoothing,
        LOSS=True, GRAD=True, INCOMING=False, MEAN=False, SMOOTHING=smoothing > 0,
        BLOCK_M=tile.rows, BLOCK_SIZE=tile.block, ROW_MULTIPLE=tile.row_multiple,
    )  # fmt: skip
    leaf = logits.double().requires_grad_()
    ref = F.cross_entropy(leaf, target, reduction="none", label_smoothing=as_float32(smoothing))
    (ref_grad,) = torch.autograd.grad(ref.sum(), leaf)
    torch.testing.assert_close(row_loss.double(), ref.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(buffer[:, :vocab].double(), ref_grad, rtol=1e-5, atol=1e-7)
    assert torch.equal(buffer[:, vocab:], torch.zeros(n_rows, plan.logits_stride - vocab))


def test_16bit_rows_off_a_16_byte_boundary_move_16_bytes_an_access():
    """In the PTX for an H100 (compiled here, no GPU needed), at V = 50257 bfloat16: with the padded
    row stride (ROW_MULTIPLE = 8) every load and store of the logits is 16 bytes wide; only the
    target's logit is one element.  Without it (ROW_MULTIPLE = 1) every access is 2 bytes."""
    blocks = str(Path(__file__).parents[1] / "blocks")
    if blocks not in sys.path:
        sys.path.insert(0, blocks)
    from test_alignment import _global_accesses, _ptx

    pointers = {
        "logits_ptr": "bf16",
        "target_ptr": "i64",
        "loss_ptr": "fp32",
        "scale_ptr": "fp32",
        "kept_count_ptr": "i64",
    }
    constexprs = dict(LOSS=True, GRAD=True, INCOMING=False, MEAN=True, SMOOTHING=True, BLOCK_M=1, BLOCK_SIZE=4096)

    def accesses(multiple):
        ptx = _ptx(linear_cross_entropy_kernel, pointers, {**constexprs, "ROW_MULTIPLE": multiple}, 16)
        return _global_accesses(ptx)

    padded = accesses(8)
    assert sorted(set(padded)) == [
        "ld.global.b16",
        "ld.global.b64",
        "ld.global.v4.b32",
        "st.global.b32",
        "st.global.v4.b32",
    ]
    assert padded.count("ld.global.b16") == 1  # the target's logit
    assert "ld.global.v4.b32" not in accesses(1)


# ------------------------------------------------------------------ harness spec


def test_spec():
    spec = ops.get_spec("linear_cross_entropy")
    assert set(spec.tolerance) >= set(spec.dtypes) and spec.bound == "compute"
    assert (8191, 4096, 128256) in spec.shapes["cuda"] and all(n % 128 for n, _, _ in spec.shapes["cuda"])
    n_rows, hidden, vocab = shape = spec.shapes["cpu"][0]
    assert spec.flops(shape, torch.bfloat16) == 6 * n_rows * hidden * vocab
    assert spec.bytes_moved(shape, torch.bfloat16) == 4 * (n_rows + vocab) * hidden + 8 * n_rows + 4
    for dtype in spec.dtypes:
        inputs = spec.make_inputs(shape, dtype, torch.device("cpu"))
        assert [t.dtype for t in inputs] == [dtype, dtype, torch.int64]
        expected = spec.reference(*(t.double() if t.is_floating_point() else t for t in inputs))
        assert expected[0].dtype == torch.float64  # the float64 answer stays float64
        for name, fn in {"tk": spec.tk, **spec.unfused}.items():
            got = fn(*inputs)
            assert len(got) == 3 and got[0].dtype == torch.float32, name
            err = rel_error(torch.cat([g.flatten().double() for g in got]), torch.cat([e.flatten() for e in expected]))
            assert err <= spec.tolerance[dtype], f"{name}: relative error {err:.2e} ({dtype})"


# ------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16bit_weight_gradient_summed_in_float32_on_the_gpu(dtype):
    """Several chunks of 16-bit weights: the weight gradient summed by GEMMs with a float32 output."""
    x, weight, target, bias = make_case(3000, 512, 32001, "cuda", dtype)
    meta = replace(describe(x, weight, "mean", 0.0, weight_grad=True), eager=True)  # as an eager call plans it
    assert choose_plan(meta, FLOAT32_SUM).weight_sum == FLOAT32
    check_against_float64(x, weight, target, bias, FLOAT32_SUM, reduction="mean", label_smoothing=0.1)


@pytest.mark.gpu
def test_memory_is_one_chunk_beyond_the_results():
    """A training step of bfloat16 N=4095, H=1024 (chunks of 1024 rows) at two vocabularies: beyond
    its inputs, what it holds at its peak is its results (grad_x, grad_weight: once, the backward
    scales them in place and gets no zeros for them) and one chunk's logits; never the (N, V) logits."""
    n_rows, hidden = 4095, 1024
    for vocab in (32768, 131072):
        x, weight, target, _ = make_case(n_rows, hidden, vocab, "cuda", torch.bfloat16)
        x, weight = x.requires_grad_(), weight.requires_grad_()
        meta = replace(describe(x, weight, "mean", 0.0, x_grad=True, weight_grad=True), eager=True)
        plan = choose_plan(meta, TUNING)
        assert (plan.chunk_rows, plan.weight_sum) == (1024, IN_OUTPUT)
        chunk = plan.chunk_rows * plan.logits_stride * 2
        results = (n_rows + vocab) * hidden * 2
        torch.autograd.grad(tk.linear_cross_entropy(x, weight, target), (x, weight))  # compiles, sets up cuBLAS
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        grads = torch.autograd.grad(tk.linear_cross_entropy(x, weight, target), (x, weight))
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        bound = results + chunk + (64 << 20)  # 64 MB for cuBLAS's workspaces
        assert peak <= bound, f"V={vocab}: {peak / 2**20:.0f} MB at the peak, more than {bound / 2**20:.0f}"
        logits = n_rows * vocab * 2
        assert peak < logits + results, f"V={vocab}: {peak / 2**20:.0f} MB, the logits alone {logits / 2**20:.0f}"
        del x, weight, grads
        torch.cuda.empty_cache()


@pytest.mark.gpu
def test_chunk_sizes_agree_on_the_gpu():
    """The curve's chunk sizes give the same answer, within bfloat16's rounding."""
    x, weight, target, _ = make_case(4095, 768, 50257, "cuda", torch.bfloat16)
    for rows in (256, 1024, 4096, 1 << 62):
        check_against_float64(x, weight, target, None, replace(TUNING, chunk_rows=rows), reduction="mean")


def test_the_kernel_gets_the_padded_rows_it_addresses(monkeypatch):
    """The row kernel reads and writes each chunk's rows up to the padded stride (the padding is
    written 0), so the tensor it is handed must span them: under tracing, its argument's functional
    copy covers that tensor's extent and no more (a view of V columns would leave the last row's
    padding outside, an access past the copy)."""
    from ops.linear_cross_entropy import launch

    seen = []

    def recording(kernel, like):
        launch_of = launcher(kernel, like)

        def grid(g):
            def call(logits, *args, **kwargs):
                n_rows, n_cols, row_stride = args[4], args[5], args[6]
                seen.append((logits.numel(), n_rows, n_cols, row_stride))
                return launch_of[g](logits, *args, **kwargs)

            return call

        return type("Recorded", (), {"__getitem__": lambda self, g: grid(g)})()

    monkeypatch.setattr(launch, "launcher", recording)
    x, weight, target, bias = make_case(37, 16, 7, "cpu", torch.float32)  # 7 classes: rows padded to 8
    tuning = replace(TUNING, chunk_rows=16)  # chunks of 16, 16 and 5 rows
    linear_cross_entropy_with_tuning(x, weight, target, bias, tuning=tuning)
    assert [s[1] for s in seen] == [16, 16, 5]
    for numel, n_rows, n_cols, row_stride in seen:
        assert (n_cols, row_stride) == (7, 8)
        assert numel >= n_rows * row_stride, (numel, n_rows, row_stride)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_scale_in_place_of_one_and_of_the_next_value_above_one(device, dtype):
    """A scale of exactly 1 leaves the tensor as it was (the kernel skips the pass); the next value
    above 1 in the scale's dtype is not taken for 1: its product, rounded once, is what the tensor
    holds (for float32 and float64 tensors most elements change)."""
    from ops.linear_cross_entropy.launch import scale_in_place

    compute = torch.float64 if dtype == torch.float64 else torch.float32
    t = torch.randn(1000 + 7, device=device).to(dtype)
    before = t.clone()
    assert torch.equal(scale_in_place(t, torch.tensor(1.0, dtype=compute, device=device)), before)
    above_one = torch.nextafter(torch.tensor(1.0, dtype=compute), torch.tensor(2.0, dtype=compute)).to(device)
    want = (before.to(compute) * above_one).to(dtype)
    assert torch.equal(scale_in_place(t, above_one), want)
    if dtype in (torch.float32, torch.float64):
        assert (t != before).float().mean() > 0.4, "a scale just above 1 was skipped"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_scale_in_place_against_float64(device, dtype):
    """The backward's scaling kernel: whole blocks and a ragged tail, each dtype, the product rounded
    once (not torch's CUDA mul, which rounds the scale to the dtype first); more blocks than programs (a
    program takes every num_programs-th block: 10 blocks of 2**16 on the interpreter's 8 programs, 1537 of
    2048 on a GPU's 8 an SM); an empty tensor, and a non-contiguous one (scaled by torch instead)."""
    from ops.linear_cross_entropy.launch import scale_in_place

    scale = torch.tensor(-2.7, dtype=torch.float64 if dtype == torch.float64 else torch.float32, device=device)
    for n in (1, 1000 + 7, pick(device, 9 * 2**16 + 5, 3 * 2**20 + 5)):
        t = torch.randn(n, device=device).to(dtype)
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        rounded_once, want = (t.to(compute) * scale).to(dtype), t.double() * scale.double()
        assert scale_in_place(t, scale) is t
        check(f"n={n}", t, want, dtype)
        assert torch.equal(t, rounded_once), f"n={n}: not the float32 product rounded once"
    assert scale_in_place(torch.empty(0, dtype=dtype, device=device), scale).numel() == 0
    strided = torch.randn(40, 30, device=device).to(dtype).t()
    want = strided.double() * scale.double()
    check("transposed", scale_in_place(strided, scale), want, dtype)
