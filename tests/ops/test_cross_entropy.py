"""tk.cross_entropy against PyTorch's F.cross_entropy in float64.

Each test runs on the CPU (the Triton kernels through the interpreter, small
sizes) and on CUDA (compiled kernels, vocabulary-sized rows; marked `gpu`).
"""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from reference import (
    DEVICES,
    DTYPES,
    TOLERANCE,
    assert_close,
    assert_raises_clearly,
    error_cases,
    leaf64,
    rel_error,
    strided_versions,
)

import ops
from ops.cross_entropy.launch import run_backward, run_forward
from ops.cross_entropy.op import cross_entropy_with_tuning, describe, forward
from ops.cross_entropy.plan import TUNING, Meta, choose_backward_plan, choose_forward_plan
from ops.runtime import H100, INTERPRETER

REDUCTIONS = ["none", "mean", "sum"]
SMOOTHINGS = [0.0, 0.1]


def pick(device, cpu, cuda):
    return cuda if device == "cuda" else cpu


def as_float32(value: float) -> float:
    """label_smoothing as the kernels see it: every float argument of a Triton kernel is float32."""
    return float(torch.tensor(value, dtype=torch.float32))


def reference(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """PyTorch's answer in float64 (on the same device)."""
    return F.cross_entropy(
        logits.double(), target, ignore_index=ignore_index, reduction=reduction, label_smoothing=as_float32(label_smoothing)
    )


def make_case(n_rows, n_cols, device, dtype, ignore_every=5, scale=3.0):
    """Logits spread like a model's, random targets, every `ignore_every`-th row ignored (from row 1)."""
    logits = (scale * torch.randn(n_rows, n_cols, device=device)).to(dtype)
    target = torch.randint(0, n_cols, (n_rows,), device=device)
    target[1::ignore_every] = -100
    return logits, target


def differentiable_view(t):
    """t's values in t's very layout (strides, offset), as a view of a fresh leaf
    that requires grad: clone() would make a non-dense view contiguous."""
    base = t._base if t._base is not None else t
    leaf = base.detach().clone().requires_grad_()  # base is dense: the clone keeps its strides
    view = leaf.as_strided(t.shape, t.stride(), t.storage_offset() - base.storage_offset())
    assert view.stride() == t.stride()
    torch.testing.assert_close(view.detach(), t, rtol=0, atol=0, equal_nan=True)
    return view


def tk_loss(logits, target, tuning=None, **options):
    """tk's loss: the registered op, or (given a tuning) the same loss planned with that tuning."""
    if tuning is None:
        return torch.ops.tk.cross_entropy(logits, target, **options)
    return cross_entropy_with_tuning(logits, target, **options, tuning=tuning)


def tk_loss_and_grad(logits, target, grad, tuning=None, **options):
    """tk's loss and its gradient w.r.t. the logits (in their layout) for the incoming `grad`
    (planned with `tuning` if given)."""
    x = differentiable_view(logits)
    loss = tk_loss(x, target, tuning, **options)
    (dlogits,) = torch.autograd.grad(loss, x, grad)
    return loss, dlogits


def pytorch_grad(logits, target, grad, reduction, label_smoothing):
    """PyTorch's own gradient in the logits' dtype, for its rounding error."""
    x = logits.detach().clone().requires_grad_()
    loss = F.cross_entropy(x, target, reduction=reduction, label_smoothing=as_float32(label_smoothing))
    loss.backward(grad)
    return x.grad


def reference_loss_and_grad(logits, target, grad, label_smoothing=0.0, **options):
    x64 = leaf64(logits)
    loss = F.cross_entropy(x64, target, label_smoothing=as_float32(label_smoothing), **options)
    loss.backward(grad.double())
    return loss, x64.grad


# -------------------------------------------------------------------- forward


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_loss_matches_float64(device, dtype, reduction):
    # C of one class, one short block, one block with a ragged end, and rows of several chunks.
    shapes = pick(
        device,
        [(5, 1), (7, 7), (33, 1000), (3, 70_001)],
        [(3, 1), (4099, 7), (1000, 50257), (4096, 32000), (256, 128256), (64, 262144)],
    )
    for n_rows, n_cols in shapes:
        logits, target = make_case(n_rows, n_cols, device, dtype)
        for smoothing in SMOOTHINGS:
            out = torch.ops.tk.cross_entropy(logits, target, reduction=reduction, label_smoothing=smoothing)
            ref = reference(logits, target, reduction=reduction, label_smoothing=smoothing)
            assert out.shape == ref.shape, (n_rows, n_cols)
            assert_close(out, ref, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_defaults_are_those_of_pytorch(device):
    logits, target = make_case(9, 33, device, torch.float32)
    assert_close(torch.ops.tk.cross_entropy(logits, target), reference(logits, target), torch.float32)
    assert torch.ops.tk.cross_entropy(logits, target).shape == ()


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide")  # a mean over no row: 0 / 0
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_unbatched_logits(device, reduction):
    logits = 3 * torch.randn(1000, device=device)
    for target in [torch.tensor(17, device=device), torch.tensor(-100, device=device)]:
        loss, grad = tk_loss_and_grad(logits, target, torch.tensor(1.5, device=device), reduction=reduction)
        ref_loss, ref_grad = reference_loss_and_grad(logits, target, torch.tensor(1.5, device=device), reduction=reduction)
        assert loss.shape == ref_loss.shape == ()
        if target == -100 and reduction == "mean":
            # 0 / 0 kept rows: NaN, as PyTorch gives for a batch of ignored rows.  For
            # one unbatched target PyTorch's answer varies (NaN on CPU with torch 2.13,
            # 0 on CUDA with torch 2.11); tk stays NaN, consistent with the batched case.
            assert loss.isnan() and (ref_loss.isnan() or ref_loss == 0)
        else:
            torch.testing.assert_close(loss.double(), ref_loss, equal_nan=True)
        torch.testing.assert_close(grad.double(), ref_grad, rtol=1e-5, atol=1e-7)  # and a zero gradient


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ignore_index", [-100, -1, 3])
def test_ignore_index_anywhere(device, ignore_index):
    """ignore_index may be a valid class too: a row whose target equals it is skipped."""
    logits, _ = make_case(40, 7, device, torch.float32)
    target = torch.randint(0, 7, (40,), device=device)
    target[::4] = ignore_index
    for reduction in REDUCTIONS:
        for smoothing in SMOOTHINGS:
            options = dict(ignore_index=ignore_index, reduction=reduction, label_smoothing=smoothing)
            grad = torch.randn(40 if reduction == "none" else (), device=device)
            loss, dlogits = tk_loss_and_grad(logits, target, grad, **options)
            ref_loss, ref_grad = reference_loss_and_grad(logits, target, grad, **options)
            assert_close(loss, ref_loss, torch.float32)
            assert_close(dlogits, ref_grad, torch.float32)
            assert (dlogits[target == ignore_index] == 0).all()


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide")  # a mean over no row: 0 / 0
@pytest.mark.parametrize("device", DEVICES)
def test_every_row_ignored(device):
    """As PyTorch: loss 0 per row, a sum of 0, a mean of 0/0 = NaN; gradient 0."""
    logits = torch.randn(6, 50, device=device)
    target = torch.full((6,), -100, device=device)
    for reduction in REDUCTIONS:
        for smoothing in SMOOTHINGS:
            grad = torch.ones(6 if reduction == "none" else (), device=device)
            loss, dlogits = tk_loss_and_grad(logits, target, grad, reduction=reduction, label_smoothing=smoothing)
            ref_loss, ref_grad = reference_loss_and_grad(logits, target, grad, reduction=reduction, label_smoothing=smoothing)
            torch.testing.assert_close(loss.double(), ref_loss, equal_nan=True)
            assert torch.equal(dlogits, torch.zeros_like(logits))
            torch.testing.assert_close(dlogits.double(), ref_grad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n_cols", [100, 1000, "long"])
def test_nan_in_ignored_rows_changes_nothing(device, n_cols):
    """NaN and inf logits in ignored rows change nothing: neither direction loads
    them (PyTorch's gradient there is NaN).  Rows stacked into a tile, one chunk a
    row, and several chunks a row."""
    n_cols = pick(device, 20_000, 70_001) if n_cols == "long" else n_cols
    logits, target = make_case(12, n_cols, device, torch.float32, ignore_every=3)
    poisoned = logits.clone()
    poisoned[target == -100] = float("nan")
    poisoned[target == -100, :3] = torch.tensor([float("inf"), -float("inf"), 1e38], device=device)
    for reduction in REDUCTIONS:
        grad = torch.randn(12 if reduction == "none" else (), device=device)
        loss, dlogits = tk_loss_and_grad(poisoned, target, grad, reduction=reduction, label_smoothing=0.1)
        ref_loss, ref_grad = reference_loss_and_grad(logits, target, grad, reduction=reduction, label_smoothing=0.1)
        assert_close(loss, ref_loss, torch.float32)
        assert_close(dlogits, ref_grad, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_range_targets_give_nan(device):
    """PyTorch raises (CPU) or asserts (CUDA); tk cannot read targets on the host,
    so such a row's loss and gradient are NaN, and every other row is unaffected."""
    n_cols = 1000
    logits, target = make_case(10, n_cols, device, torch.float32)
    bad_rows = torch.tensor([0, 3, 7, 8], device=device)
    target[bad_rows] = torch.tensor([n_cols, -1, -2**40, 10 * n_cols], device=device)
    good = torch.ones(10, dtype=torch.bool, device=device)
    good[bad_rows] = False
    for smoothing in SMOOTHINGS:
        options = dict(reduction="none", label_smoothing=smoothing)
        loss, dlogits = tk_loss_and_grad(logits, target, torch.ones(10, device=device), **options)
        assert loss[bad_rows].isnan().all() and not loss[good].isnan().any()
        assert dlogits[bad_rows].isnan().all() and not dlogits[good].isnan().any()
        ones_good = torch.ones(int(good.sum()), device=device)
        ref_loss, ref_grad = reference_loss_and_grad(logits[good], target[good], ones_good, **options)
        assert_close(loss[good], ref_loss, torch.float32)
        assert_close(dlogits[good], ref_grad, torch.float32)
        for reduction in ["mean", "sum"]:
            assert torch.ops.tk.cross_entropy(logits, target, reduction=reduction, label_smoothing=smoothing).isnan()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy sees the infinities
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n_cols", [100, 70_001])  # one chunk, and several
def test_numerically_stable(device, n_cols):
    check_numerically_stable(device, n_cols)


def check_numerically_stable(device, n_cols, tuning=None):
    """Extreme logits in each row, tk's loss (planned with `tuning` if given) against PyTorch's."""
    x = torch.randn(7, n_cols, device=device)
    target = torch.randint(0, n_cols, (7,), device=device)
    x[0, : n_cols // 2] = -float("inf")  # -inf first: the online sum must not turn NaN
    target[0] = n_cols - 1
    x[1] = x[1] * 1e30  # huge values: no overflow
    x[2, 7] = 1e38  # one value dominates
    x[3] = x[3].clamp(-1, 1) * 3e38  # near the float32 limit; its target is the maximum
    target[1:4] = x[1:4].argmax(-1)
    x[4] = -float("inf")  # every logit -inf: NaN, as in PyTorch
    x[5] = x[5] - 1e4  # far from 0
    x[6, target[6]] = -float("inf")  # the target's logit is -inf: an infinite loss
    for smoothing in SMOOTHINGS:  # with smoothing, a -inf logit anywhere makes the loss infinite
        out = tk_loss(x, target, tuning, reduction="none", label_smoothing=smoothing)
        ref = reference(x, target, reduction="none", label_smoothing=smoothing)
        rows = [0, 1, 2, 3, 4, 5, 6] if smoothing == 0 else [0, 1, 2, 4, 5, 6]  # row 3's sum overflows float32
        # A sum over 70001 columns in float32 rounds: allow twice PyTorch's own
        # float32 error on these rows (and no less than assert_close's default).
        ours = F.cross_entropy(x, target, reduction="none", label_smoothing=smoothing)[rows].double()
        finite = ref[rows].isfinite() & ours.isfinite()
        torch_rtol = ((ours - ref[rows]).abs() / ref[rows].abs().clamp_min(1e-30))[finite].max().item()
        rtol = max(1.3e-6, 2 * torch_rtol)
        torch.testing.assert_close(out[rows], ref[rows].float(), equal_nan=True, rtol=rtol, atol=1e-5)
        assert out[4].isnan() and out[6] == float("inf")
    big = (torch.randn(3, n_cols, device=device) * 1e4).to(torch.bfloat16)
    target = torch.randint(0, n_cols, (3,), device=device)
    out = tk_loss(big, target, tuning, reduction="none")
    assert_close(out, reference(big, target, reduction="none"), torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_non_contiguous_inputs(device, dtype):
    n_rows, n_cols = pick(device, (9, 1000), (1024, 32000))
    logits, target = make_case(n_rows, n_cols, device, dtype)
    padded = torch.randn(n_rows, n_cols + 64, device=device).to(dtype)
    padded[:, :n_cols] = logits
    views = [*strided_versions(logits), ("padded-vocabulary", padded[:, :n_cols])]
    spread_target = torch.empty(2 * n_rows, dtype=torch.int64, device=device)
    spread_target[::2] = target
    for i, (layout, view) in enumerate(views):
        assert view.is_contiguous() == (layout == "contiguous")
        t = target if i % 2 == 0 else spread_target[::2]  # every other case: a strided target too
        for reduction in REDUCTIONS:
            grad = torch.randn(n_rows if reduction == "none" else (), device=device).to(dtype)
            loss, dlogits = tk_loss_and_grad(view, t, grad, reduction=reduction, label_smoothing=0.1)
            ref_loss, ref_grad = reference_loss_and_grad(logits, target, grad, reduction=reduction, label_smoothing=0.1)
            assert_close(loss, ref_loss, dtype)
            assert_close(dlogits, ref_grad, dtype, scale=2)
            assert dlogits.shape == view.shape, layout


@pytest.mark.parametrize("device", DEVICES)
def test_expanded_incoming_gradient(device):
    """loss.sum().backward() hands reduction="none" a gradient of stride 0."""
    logits, target = make_case(33, 1000, device, torch.float32)
    x = logits.clone().requires_grad_()
    torch.ops.tk.cross_entropy(x, target, reduction="none").sum().backward()
    x64 = leaf64(logits)
    F.cross_entropy(x64, target, reduction="none").sum().backward()
    assert_close(x.grad, x64.grad, torch.float32)


# Chunks of 4 rows in the interpreter: the sums over the rows in many parts, as on a GPU.
SMALL_PARTS = TUNING.with_cpu(reduce_chunk=4)


def parts_of_the_rows(meta, tuning=TUNING):
    """(programs, rows a program) of the forward's sum over the rows and of the backward's count
    for "mean", which are the same."""
    meta = replace(meta, reduction="mean")
    sums, counts = choose_forward_plan(meta, tuning).sums, choose_backward_plan(meta, tuning).counts
    assert sums == counts
    return sums.programs, sums.rows_per_part


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide")  # a mean over no row: 0 / 0
@pytest.mark.parametrize("n_rows", [1, 5, 9, 512, 600, 2000])  # one part; 2, 3, 128 of 4 rows; 75 of 8; 125 of 16
@pytest.mark.parametrize("ignored", ["some", "all"])
def test_the_reductions_over_the_rows_in_parts(n_rows, ignored):
    """The sum over the row losses and the count of kept rows ("mean", both ways) are taken in
    parts, at most Tuning.max_parts, each a whole number of chunks of rows: chunks of 4 rows here,
    so that rows past a chunk, a part or the last row are all reached.  The forward's last program
    adds the partials up."""
    logits, target = make_case(n_rows, 3, "cpu", torch.float32, ignore_every=3)
    assert parts_of_the_rows(describe(logits, "mean", 0.0), SMALL_PARTS) == {
        1: (1, 4), 5: (2, 4), 9: (3, 4), 512: (128, 4), 600: (75, 8), 2000: (125, 16)}[n_rows]  # fmt: skip
    if ignored == "all":
        target[:] = -100
    for reduction in ("mean", "sum"):
        grad = torch.tensor(2.0)
        loss, dlogits = tk_loss_and_grad(logits, target, grad, SMALL_PARTS, reduction=reduction)
        ref_loss, ref_grad = reference_loss_and_grad(logits, target, grad, reduction=reduction)
        if ignored == "all":  # a sum of 0, a mean of 0 / 0; no gradient
            torch.testing.assert_close(loss.double(), ref_loss, equal_nan=True)
            assert torch.equal(dlogits, torch.zeros_like(dlogits))
        else:
            assert_close(loss, ref_loss, torch.float32)
            assert_close(dlogits, ref_grad, torch.float32)


# The GPU's parts of the rows: one; two; 128 of one chunk; 65 and 98 of two and three chunks, the last part short.
GPU_PARTS = {1: (1, 1024), 1025: (2, 1024), 131072: (128, 1024), 131073: (65, 2048), 300001: (98, 3072)}


def test_the_gpu_parts_of_the_rows():
    assert {n: parts_of_the_rows(Meta(n, 10, 10, 4, H100)) for n in GPU_PARTS} == GPU_PARTS


def test_the_last_program_reads_the_other_programs_partials_after_its_ticket():
    """In the PTX for an H100 (compiled here, no GPU needed): the ticket is an acquire-release
    atomic at GPU scope, taken by the thread that stored the partials, after a barrier; the last
    program reads the partials from L2 (.cg).  A relaxed ticket or loads from L1 could add up
    partials not yet written, a race that a test run would rarely show."""
    from test_alignment import _ptx

    from ops.cross_entropy import kernels as module

    pointers = {"row_loss_ptr": "fp32", "target_ptr": "i64", "part_sum_ptr": "fp32", "part_kept_ptr": "i32"}
    pointers.update(ticket_ptr="i32", out_ptr="fp32")
    ptx = _ptx(module.cross_entropy_reduce_kernel, pointers, {"MEAN": True, "BLOCK_SIZE": 1024, "MAX_PARTS": 128}, 4)
    lines = [line.strip() for line in ptx.splitlines()]
    (ticket,) = [k for k, line in enumerate(lines) if "atom." in line]
    assert "atom.global.gpu.acq_rel.add" in lines[ticket]
    stores = [k for k, line in enumerate(lines[:ticket]) if line.startswith("@") and "st.global" in line]
    assert len(stores) == 2 and all(lines[k].split()[0] == lines[ticket].split()[0] for k in stores)  # one predicate
    assert any(line.startswith("bar.sync") for line in lines[stores[-1] : ticket])
    loads_after = [line for line in lines[ticket:] if "ld.global" in line]
    assert len(loads_after) == 2 and all("ld.global.cg" in line for line in loads_after)


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide")  # a mean over no row: 0 / 0
@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch(device):
    for n_cols in [1, 1000]:
        logits = torch.randn(0, n_cols, device=device, requires_grad=True)
        target = torch.empty(0, dtype=torch.int64, device=device)
        for reduction in REDUCTIONS:
            out = torch.ops.tk.cross_entropy(logits, target, reduction=reduction)
            ref = F.cross_entropy(logits.detach(), target, reduction=reduction)
            assert out.shape == ref.shape
            torch.testing.assert_close(out, ref, equal_nan=True)  # a mean of nothing is NaN, a sum 0
        (dlogits,) = torch.autograd.grad(torch.ops.tk.cross_entropy(logits, target, reduction="sum"), logits)
        assert dlogits.shape == (0, n_cols)


# ------------------------------------------------------------------- backward


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gradients_match_float64(device, dtype, reduction):
    shapes = pick(device, [(7, 7), (9, 1000), (3, 70_001)], [(4099, 7), (1000, 50257), (512, 128256)])
    for n_rows, n_cols in shapes:
        logits, target = make_case(n_rows, n_cols, device, dtype)
        for smoothing in SMOOTHINGS:
            grad = torch.randn(n_rows if reduction == "none" else (), device=device).to(dtype)
            _, dlogits = tk_loss_and_grad(logits, target, grad, reduction=reduction, label_smoothing=smoothing)
            _, ref_grad = reference_loss_and_grad(logits, target, grad, reduction=reduction, label_smoothing=smoothing)
            assert dlogits.dtype == dtype and dlogits.shape == logits.shape
            # With mean over many rows most gradients are below float16's smallest
            # normal (p / N ~ 1e-8): PyTorch's own float16 gradient has that error too.
            torch_err = rel_error(pytorch_grad(logits, target, grad, reduction, smoothing), ref_grad)
            assert_close(dlogits, ref_grad, dtype, scale=max(2, 2 * torch_err / TOLERANCE[dtype]))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("smoothing", [0.0, 0.25])
def test_gradcheck(reduction, smoothing):
    x = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([3, -100, 0, 6, 6])

    def loss(t):
        return torch.ops.tk.cross_entropy(t, target, reduction=reduction, label_smoothing=smoothing)

    assert torch.autograd.gradcheck(loss, (x,), fast_mode=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_a_float32_loss_of_16bit_logits_is_that_of_float32_logits(device, dtype, reduction):
    """dtype=torch.float32 (what autocast asks for): the loss of the 16-bit logits as they are,
    to float32 accuracy, as F.cross_entropy of a float32 copy gives it; the gradient in their dtype."""
    for n_rows, n_cols in pick(device, [(7, 7), (3, 70_001)], [(4099, 7), (512, 128256)]):
        logits, target = make_case(n_rows, n_cols, device, dtype)
        for smoothing in SMOOTHINGS:
            options = {"reduction": reduction, "label_smoothing": smoothing}
            grad = torch.randn(n_rows if reduction == "none" else (), device=device)
            loss, dlogits = tk_loss_and_grad(logits, target, grad, dtype=torch.float32, **options)
            ref_loss, ref_grad = reference_loss_and_grad(logits, target, grad, **options)
            assert_close(loss, ref_loss, torch.float32, scale=2)
            # As PyTorch's gradient through a float32 copy, rounded back to the logits' dtype
            # (float16 gradients of a mean over many rows are subnormal: see test_gradients_match_float64).
            torch_err = rel_error(pytorch_grad(logits.float(), target, grad, reduction, smoothing).to(dtype), ref_grad)
            assert_close(dlogits, ref_grad, dtype, scale=max(2, 2 * torch_err / TOLERANCE[dtype]))
            unasked = torch.ops.tk.cross_entropy(logits, target, **options)  # the logits' dtype
            assert unasked.dtype == dtype and rel_error(loss, ref_loss) < rel_error(unasked, ref_loss) + 1e-7


@pytest.mark.parametrize("device", DEVICES)
def test_the_loss_dtype_of_float32_and_float64_logits(device):
    logits, target = make_case(9, 33, device, torch.float64)
    loss = torch.ops.tk.cross_entropy(logits, target, dtype=torch.float32)  # computed in float64, delivered in float32
    assert loss.dtype == torch.float32 and abs(loss.double() - reference(logits, target)) <= 1e-7 * abs(loss)
    assert torch.ops.tk.cross_entropy(logits.float(), target, dtype=torch.float32).dtype == torch.float32


def test_second_derivative_is_refused():
    """The backward op has no backward of its own: a clear error, not a wrong answer."""
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    loss = torch.ops.tk.cross_entropy(x, torch.tensor([0, 1, 2]))
    (dx,) = torch.autograd.grad(loss, x, create_graph=True)
    with pytest.raises(RuntimeError, match="no autograd formula was registered"):
        torch.autograd.grad(dx.sum(), x)


def test_backward_op_matches_the_formula():
    """tk.cross_entropy_backward on its own: (softmax - (1-s) onehot - s/C) * g per row."""
    logits, target = make_case(6, 11, "cpu", torch.float64)
    _, lse = torch.ops.tk.cross_entropy_forward(logits, target, -100, "none", 0.25)
    torch.testing.assert_close(lse[target != -100], torch.logsumexp(logits, -1)[target != -100])
    grad = torch.randn(6, dtype=torch.float64)
    dlogits = torch.ops.tk.cross_entropy_backward(grad, logits, target, lse, -100, "none", 0.25)
    onehot = F.one_hot(target.clamp_min(0), 11).double()
    expected = (torch.softmax(logits, -1) - 0.75 * onehot - 0.25 / 11) * grad[:, None]
    expected[target == -100] = 0
    torch.testing.assert_close(dlogits, expected)


def test_lse_is_not_differentiable():
    x = torch.randn(3, 5, requires_grad=True)
    loss, lse = torch.ops.tk.cross_entropy_forward(x, torch.tensor([0, 1, 2]), -100, "sum", 0.0)
    assert loss.requires_grad and not lse.requires_grad


# --------------------------------------------------- opcheck, errors, compile


def opcheck_cases(device):
    def logits(*shape, grad=True, dtype=torch.float32):
        return torch.randn(shape, device=device, dtype=dtype, requires_grad=grad)

    target = torch.tensor([3, -100, 0, 6, 1], device=device)
    target_ignoring_0 = torch.tensor([3, 0, 0, 6, 1], device=device)  # for ignore_index=0 (-100 would be out of range)
    lse = torch.randn(5, device=device)
    backward = torch.ops.tk.cross_entropy_backward.default
    grad_none, grad_scalar = torch.randn(5, device=device), torch.randn((), device=device)
    return [
        (torch.ops.tk.cross_entropy.default, (logits(5, 7), target), {}),
        (torch.ops.tk.cross_entropy.default, (logits(5, 7), target, -100, "none", 0.1), {}),
        (torch.ops.tk.cross_entropy.default, (logits(7), target[0]), {"reduction": "sum"}),
        (torch.ops.tk.cross_entropy.default, (logits(5, 7, dtype=torch.bfloat16), target), {"dtype": torch.float32}),
        (torch.ops.tk.cross_entropy_forward.default, (logits(5, 7, dtype=torch.float16), target, -100, "none", 0.1, torch.float32), {}),
        (torch.ops.tk.cross_entropy_forward.default, (logits(5, 7), target, -100, "mean", 0.0), {}),
        (torch.ops.tk.cross_entropy_forward.default, (logits(5, 7, dtype=torch.bfloat16), target_ignoring_0, 0, "none", 0.2), {}),
        (torch.ops.tk.cross_entropy_forward.default, (logits(7, 5).t(), target, -100, "sum", 0.1), {}),
        (backward, (grad_none, logits(5, 7, grad=False), target, lse, -100, "none", 0.1), {}),
        (backward, (grad_scalar, logits(5, 7, grad=False), target, lse, -100, "mean", 0.0), {}),
        (backward, (grad_scalar, logits(5, 7, grad=False), target_ignoring_0, lse, 0, "sum", 0.0), {}),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for op, args, kwargs in opcheck_cases(device):
        torch.library.opcheck(op, args, kwargs)


def ones(*shape, dtype=torch.float32, device="cpu"):
    return torch.ones(shape, dtype=dtype, device=device)


def labels(*shape, dtype=torch.int64, device="cpu"):
    return torch.zeros(shape, dtype=dtype, device=device)


ce = torch.ops.tk.cross_entropy
ERROR_CASES = [
    ("int logits", lambda: ce(labels(3, 4), labels(3)), TypeError, "logits has dtype int64"),
    ("float target", lambda: ce(ones(3, 4), ones(3, 4)), TypeError, "class-probability targets are not supported"),
    ("int32 target", lambda: ce(ones(3, 4), labels(3, dtype=torch.int32)), TypeError, "target has dtype int32; supported: int64"),
    ("3-D logits", lambda: ce(ones(2, 3, 4), labels(2, 3)), ValueError, r"flatten \(B, T, C\) logits to \(B\*T, C\)"),
    ("0-D logits", lambda: ce(torch.tensor(1.0), labels()), ValueError, r"logits must be \(C,\) or \(N, C\)"),
    ("target shape", lambda: ce(ones(3, 4), labels(4)), ValueError, r"target has shape \(4,\); logits of shape \(3, 4\) need"),
    ("no classes", lambda: ce(ones(3, 0), labels(3)), ValueError, "at least one class"),
    ("int loss dtype", lambda: ce(ones(3, 4), labels(3), dtype=torch.int64), TypeError, "dtype int64 is not a floating dtype"),
    ("reduction", lambda: ce(ones(3, 4), labels(3), reduction="avg"), ValueError, "reduction must be 'none', 'mean' or 'sum'"),
    ("smoothing > 1", lambda: ce(ones(3, 4), labels(3), label_smoothing=1.5), ValueError, "label_smoothing must be between"),
    ("smoothing < 0", lambda: ce(ones(3, 4), labels(3), label_smoothing=-0.1), ValueError, "label_smoothing must be between"),
    ("devices", lambda: ce(ones(3, 4), labels(3, device="meta")), ValueError, "logits is on cpu but target is on meta"),
    (
        "forward 1-D",
        lambda: torch.ops.tk.cross_entropy_forward(ones(4), labels(), -100, "mean", 0.0),
        ValueError,
        r"logits must be \(N, C\)",
    ),
    (
        "backward grad shape",
        lambda: torch.ops.tk.cross_entropy_backward(ones(3), ones(3, 4), labels(3), ones(3), -100, "mean", 0.0),
        ValueError,
        r"grad has shape \(3,\); reduction='mean' needs \(\)",
    ),
    (
        "backward lse shape",
        lambda: torch.ops.tk.cross_entropy_backward(ones(3), ones(3, 4), labels(3), ones(4), -100, "none", 0.0),
        ValueError,
        r"lse has shape \(4,\), expected \(3,\)",
    ),
    (
        "backward lse dtype",
        lambda: torch.ops.tk.cross_entropy_backward(ones(3), ones(3, 4), labels(3), ones(3).half(), -100, "none", 0.0),
        TypeError,
        "lse has dtype float16; supported: float32",
    ),
]


@error_cases(ERROR_CASES)
def test_bad_input_raises_a_clear_error(case):
    assert_raises_clearly(case)


@pytest.mark.gpu
def test_device_mismatch_on_cuda():
    with pytest.raises(ValueError, match="logits is on cuda:0 but target is on cpu"):
        ce(ones(3, 4, device="cuda"), labels(3))


def classifier_loss(x, w, target):
    """A tiny classifier head, as a user would write it."""
    return torch.ops.tk.cross_entropy(x @ w, target, label_smoothing=0.1)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_matches_eager_and_pytorch(device):
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    x = torch.randn(37, 48, device=device)
    w = torch.randn(48, 1000, device=device) / 48**0.5
    target = torch.randint(0, 1000, (37,), device=device)
    target[::5] = -100
    compiled = torch.compile(classifier_loss, fullgraph=True)  # fullgraph: any graph break is an error

    def loss_and_grad(fn):
        w_ = w.clone().requires_grad_()
        loss = fn(x, w_, target)
        loss.backward()
        return loss, w_.grad

    (compiled_loss, compiled_grad), code = run_and_get_code(lambda: loss_and_grad(compiled))
    eager_loss, eager_grad = loss_and_grad(classifier_loss)
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compiled_grad, eager_grad, rtol=1e-5, atol=1e-6)
    ref_loss, ref_grad = loss_and_grad(lambda x, w, t: F.cross_entropy(x @ w, t, label_smoothing=0.1))
    assert_close(eager_loss, ref_loss.double(), torch.float32, scale=10)
    assert_close(eager_grad, ref_grad.double(), torch.float32, scale=10)

    source = "\n".join(code)
    if device == "cuda":  # Inductor's output code launches tk's own kernels
        names = ["cross_entropy_forward_kernel", "cross_entropy_reduce_kernel", "cross_entropy_backward_kernel"]
    else:  # the compiled CPU graph calls tk's opaque CPU ops (the kernels, interpreted)
        names = ["tk.cross_entropy_forward_cpu", "tk.cross_entropy_backward_cpu"]
    for name in names:
        assert name in source, f"{name} missing from the compiled code"


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_with_dynamic_shapes(device):
    """dynamic=True: the row count is symbolic while Inductor traces the CUDA body; the launch rules
    (row tiles, the parts of the sums over the rows) still give each batch its right loss and
    gradient: 1, 5 and 69 parts of the rows on the GPU."""
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda x, t: torch.ops.tk.cross_entropy(x, t, label_smoothing=0.1), fullgraph=True, dynamic=True
    )  # its backward is compiled too, by AOTAutograd

    def loss_and_grad(x, t):
        x = x.detach().requires_grad_()
        loss = compiled(x, t)
        loss.backward()
        return loss, x.grad

    for n_rows in pick(device, [3, 40, 200], [3, 5000, 70000]):
        logits, target = make_case(n_rows, 100, device, torch.float32)
        loss, grad = loss_and_grad(logits, target)
        one = torch.tensor(1.0, device=device)
        ref_loss, ref_grad = reference_loss_and_grad(logits, target, one, label_smoothing=0.1)
        assert_close(loss, ref_loss, torch.float32)
        assert_close(grad, ref_grad, torch.float32)


# ------------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("n_rows", list(GPU_PARTS))
def test_the_reductions_over_the_rows_in_parts_on_the_gpu(n_rows):
    """The GPU's parts of the rows (GPU_PARTS), as this GPU plans them, give the right loss and gradient."""
    logits, target = make_case(n_rows, 10, "cuda", torch.float32, ignore_every=3)
    assert parts_of_the_rows(describe(logits, "mean", 0.0)) == GPU_PARTS[n_rows]
    for reduction in ("mean", "sum"):
        grad = torch.tensor(2.0, device="cuda")
        loss, dlogits = tk_loss_and_grad(logits, target, grad, reduction=reduction)
        ref_loss, ref_grad = reference_loss_and_grad(logits, target, grad, reduction=reduction)
        assert_close(loss, ref_loss, torch.float32)
        assert_close(dlogits, ref_grad, torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_softmax_is_never_materialized(dtype):
    """The forward allocates O(N) besides its input; the backward only dlogits."""
    n_rows, n_cols = 4096, 32000
    logits, target = make_case(n_rows, n_cols, "cuda", dtype)
    logits.requires_grad_()
    small = 64 * n_rows * 8  # the per-row loss and logsumexp, with room to spare
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    loss = torch.ops.tk.cross_entropy(logits, target)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before < small
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    (dlogits,) = torch.autograd.grad(loss, logits)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before < dlogits.numel() * dlogits.element_size() + small


# ------------------------------------------------------------ harness spec


def test_spec():
    spec = ops.get_spec("cross_entropy")
    assert set(spec.tolerance) >= set(spec.dtypes)
    assert (8192, 128256) in spec.shapes["cuda"] and spec.shapes["cpu"]
    n_rows, n_cols = spec.shapes["cpu"][0]
    assert spec.bytes_moved((n_rows, n_cols), torch.bfloat16) == 2 * n_rows * n_cols + 8 * n_rows + 2
    for dtype in spec.dtypes:
        logits, target = spec.make_inputs((n_rows, n_cols), dtype, torch.device("cpu"))
        assert logits.dtype == dtype and target.dtype == torch.int64 and 0 <= target.min() <= target.max() < n_cols
        assert_close(spec.tk(logits, target), spec.reference(logits.double(), target), dtype)


def element_size(dtype):
    return torch.empty((), dtype=dtype).element_size()


def test_numerically_stable_with_the_gpu_chunk():
    """The CUDA chunk (4096 columns) on CPU: with one logit of 1e38 among 70001,
    the smoothing term's sum overflowed float32 there and the loss was inf."""
    gpu_chunk = TUNING.with_cpu(max_chunk=TUNING.max_chunk.cuda)
    meta = Meta(7, 70_001, 70_001, 4, INTERPRETER, reduction="none", smoothing=True)
    assert choose_forward_plan(meta, gpu_chunk).tile.block == 4096
    check_numerically_stable("cpu", 70_001, gpu_chunk)


def test_the_gpu_row_tiles():
    """The forward's chunks: 32 elements a thread for rows of one or two chunks and for long
    16-bit rows, 16 for long float32 rows and for float64; the backward's 16 for rows of one or
    two chunks, 8 for longer ones (see Tuning).  Rows of at most 256 columns are stacked into
    2048-element tiles."""

    def tiles(n_rows, n_cols, dtype, forward):
        meta = Meta(n_rows, n_cols, n_cols, element_size(dtype), H100)
        tile = (choose_forward_plan if forward else choose_backward_plan)(meta).tile
        return tile.rows, tile.block, tile.warps

    widths = (4096, 8192, 1000, 50257)
    assert [tiles(16384, c, torch.bfloat16, True) for c in widths] == [
        (1, 4096, 4), (1, 4096, 4), (1, 1024, 1), (1, 4096, 4)]  # fmt: skip
    assert [tiles(16384, c, torch.float32, True) for c in widths] == [
        (1, 4096, 4), (1, 4096, 4), (1, 1024, 1), (1, 4096, 8)]  # fmt: skip
    assert tiles(16384, 4096, torch.float64, True) == (1, 4096, 8)
    for dtype in (torch.bfloat16, torch.float32):
        assert [tiles(16384, c, dtype, False) for c in widths] == [
            (1, 4096, 8), (1, 4096, 8), (1, 1024, 2), (1, 4096, 16)]  # fmt: skip
        assert tiles(16384, 8192, dtype, False) == (1, 4096, 8)  # two chunks
        assert tiles(16384, 8193, dtype, False) == (1, 4096, 16)  # a third chunk of one column
    assert tiles(65536, 100, torch.bfloat16, True) == tiles(65536, 100, torch.float32, False) == (16, 128, 8)
    assert tiles(3, 100, torch.bfloat16, True) == (4, 128, 2)  # no more rows than there are, rounded up


def test_the_gpu_peels_rows_off_a_16_byte_boundary():
    """PEEL on an H100: the elements in 16 bytes for contiguous rows of one a program whose length
    is not a multiple of them (4096x50257), 0 for aligned, strided or stacked rows."""

    def peel(n_cols, dtype, row_stride=None, n_rows=4096):
        meta = Meta(n_rows, n_cols, row_stride or n_cols, element_size(dtype), H100)
        forward, backward = choose_forward_plan(meta).tile.peel, choose_backward_plan(meta).tile.peel
        assert forward == backward
        return forward

    assert [peel(50257, dtype) for dtype in (torch.bfloat16, torch.float32, torch.float64)] == [8, 4, 2]
    assert peel(32000, torch.bfloat16) == peel(50264, torch.bfloat16) == 0  # every row on a boundary
    assert peel(50257, torch.bfloat16, row_stride=50304) == 0  # a padded vocabulary: not contiguous
    assert peel(250, torch.bfloat16) == 0  # stacked rows


def test_a_loss_with_another_tuning_is_planned_with_it(monkeypatch):
    """cross_entropy_with_tuning plans both directions with the tuning it is given: the tests that
    take a design through it (SMALL_PARTS, the GPU chunk) rely on that."""
    from ops.cross_entropy import op as module

    planned = []
    for name in ("choose_forward_plan", "choose_backward_plan"):

        def spy(meta, tuning, choose=getattr(module, name), name=name):
            planned.append((name, tuning))
            return choose(meta, tuning)

        monkeypatch.setattr(module, name, spy)
    logits, target = make_case(5, 40, "cpu", torch.float32)
    loss, dlogits = tk_loss_and_grad(logits, target, torch.tensor(1.0), SMALL_PARTS, label_smoothing=0.1)
    assert planned == [("choose_forward_plan", SMALL_PARTS), ("choose_backward_plan", SMALL_PARTS)]
    ref_loss, ref_grad = reference_loss_and_grad(logits, target, torch.tensor(1.0), label_smoothing=0.1)
    assert_close(loss, ref_loss, torch.float32)
    assert_close(dlogits, ref_grad, torch.float32)


# Tiles of 4 rows (rows of at most 16 columns stacked, 64 elements a tile) swept in chunks of 16
# columns, both ways; rows of more than 8 columns one a program, so that 12-50 columns are peeled.
PEELING = TUNING.with_cpu(max_chunk=16, row_tile=64, stacked_row=8)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy sees the infinities
@pytest.mark.parametrize("n_cols", [6, 12, 33, 50])  # tiles of 8 rows of one chunk; rows of 1, 3 and 4 chunks
@pytest.mark.parametrize("strided", [False, True])  # a column slice of wider logits
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_backward_tiles_and_chunks(n_cols, strided, dtype, reduction):
    """Each element's gradient uses its own row's lse, target and incoming gradient: tiles of
    several rows (the last past the last row), rows of several chunks, contiguous rows that start
    off a 16-byte boundary (33 and 50 columns: swept from the boundary before them); ignored rows
    (NaN there) come out 0; an out-of-range target makes a NaN row."""
    logits, target = make_case(13, n_cols, "cpu", dtype, ignore_every=3)
    target[8] = n_cols
    poisoned = torch.full((13, n_cols + 5 * strided), float("nan"), dtype=dtype)[:, :n_cols]
    poisoned.copy_(logits)
    poisoned[target == -100] = float("nan")
    grad = torch.randn(13 if reduction == "none" else ()).to(dtype)
    for smoothing in SMOOTHINGS:
        options = (-100, reduction, smoothing)
        _, lse = forward(logits, target, *options, tuning=PEELING)
        plan = choose_backward_plan(describe(poisoned, reduction, smoothing), PEELING)
        assert plan.tile.peel == _expected_peel(n_cols, strided, dtype)
        dlogits = run_backward(plan, grad, poisoned, target, lse, -100, smoothing)
        kept = (target != -100) & (target != n_cols)
        # The reference sees row 8's target clamped (a row "mean" counts, as tk does); tk's row 8 is NaN.
        ref_target = target.clamp(max=n_cols - 1)
        _, ref = reference_loss_and_grad(logits, ref_target, grad, reduction=reduction, label_smoothing=smoothing)
        assert_close(dlogits[kept], ref[kept], dtype)
        assert (dlogits[target == -100] == 0).all() and dlogits[8].isnan().all()


def _expected_peel(n_cols, strided, dtype):
    """With PEELING's tiles: one row a program, contiguous, not all rows aligned, two runs long."""
    vector = 16 // element_size(dtype)
    return vector if n_cols > 8 and not strided and (n_cols & -n_cols) < vector and n_cols >= 2 * vector else 0


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy sees the infinities
@pytest.mark.parametrize("n_cols", [33, 50, 64])  # rows off a 16-byte boundary; 64: all on one
@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_of_rows_off_a_16_byte_boundary(n_cols, strided, dtype):
    """The forward's peeled sweep: each row's max, sum, smoothing mean and x_t, with the row's first
    and last partial runs taken apart from the body; ignored rows (NaN) and an out-of-range target,
    a row of -inf, a row whose only large logit sits in its first run and one with it in its last."""
    logits, target = make_case(13, n_cols, "cpu", dtype, ignore_every=3)
    logits[2] = -float("inf")
    logits[4, 0] = logits[5, -1] = 30.0
    target[8] = n_cols
    poisoned = torch.full((13, n_cols + 5 * strided), float("nan"), dtype=dtype)[:, :n_cols]
    poisoned.copy_(logits)
    poisoned[target == -100] = float("nan")
    kept = (target != -100) & (target != n_cols)
    kept[2] = False  # all -inf: NaN, checked below
    for smoothing in SMOOTHINGS:
        plan = choose_forward_plan(describe(poisoned, "none", smoothing), PEELING)
        assert plan.tile.peel == _expected_peel(n_cols, strided, dtype)
        loss, _ = run_forward(plan, poisoned, target, -100, smoothing, dtype)
        ref = reference(logits, target.clamp(max=n_cols - 1), reduction="none", label_smoothing=smoothing)
        assert_close(loss[kept], ref[kept], dtype)
        assert (loss[target == -100] == 0).all() and loss[8].isnan() and loss[2].isnan()


@pytest.mark.parametrize("device", DEVICES)
def test_backward_spec(device):
    """The harness's backward: its eager kernels and its float64 reference are F.cross_entropy's gradient."""
    spec = ops.get_spec("cross_entropy_backward")
    n_rows, n_cols = pick(device, spec.shapes["cpu"][0], (4096, 32000))
    assert spec.bytes_moved((n_rows, n_cols), torch.bfloat16) == 4 * n_rows * n_cols + 12 * n_rows + 2
    for dtype in spec.dtypes:
        inputs = spec.make_inputs((n_rows, n_cols), dtype, torch.device(device))
        grad, logits, target = inputs[:3]
        expected = pytorch_grad(logits, target, grad, "mean", 0.0)
        assert torch.equal(spec.reference(*inputs), expected)  # what eager autograd runs, kernel for kernel
        ref64 = spec.reference64(*(t.double() if t.is_floating_point() else t for t in inputs))
        _, want = reference_loss_and_grad(logits, target, grad)
        torch.testing.assert_close(ref64, want, rtol=0, atol=0)
        # float16 gradients of a mean over many rows are subnormal: see test_gradients_match_float64.
        assert_close(spec.tk(*inputs), ref64, dtype, scale=max(2, 2 * rel_error(expected, ref64) / TOLERANCE[dtype]))
