"""Matrix multiplication C = A @ B, 2-D or batched 3-D, any strides.

Each program computes one BLOCK_M x BLOCK_N tile of C, walking K in
BLOCK_K steps and accumulating in float32 (float64 for float64 inputs).

Grouped ("swizzled") program order: programs are numbered so that GROUP_M
consecutive programs cover a column of tiles before moving right.  Programs
that run at the same time then share the same B tiles and a few A tiles in
L2, instead of each streaming its own row of A and a whole sweep of B.
GROUP_M is the plan's (``Tuning.group_m``); the harness times row-major
order (GROUP_M = 1) beside it as the variant ``tk-row-major``.

Split K: when C has too few tiles to fill the GPU (a handful of rows, as in
decoding, or the small weight gradients of a training step, whose K is the
number of tokens), each tile's K loop is split over SPLIT_K programs, the
grid's third axis.  Each writes its partial sum, in float32, to a slice of a
workspace; a second kernel adds the slices in a fixed order and rounds once.
No atomics: the result is the same bits on every run.

Hopper and newer GPUs: 2-D float16 and bfloat16 problems big enough to fill
the GPU go to a second kernel, ``matmul_tma_kernel``: tiles are copied by the
TMA unit from tensor descriptors instead of pointer arithmetic, and a
persistent grid (one program per SM) walks the tiles, overlapping one tile's
store with the next one's loads.  Everything else, and older GPUs, take the
pointer kernel described first.

Precision: float16 and bfloat16 use the tensor cores with a float32
accumulator.  float32 follows PyTorch's switch: exact IEEE products unless
``torch.backends.cuda.matmul.allow_tf32`` is True, then TF32 (10-bit
mantissa products, much faster).  float64 runs on the CPU only (for
gradcheck): Triton's tl.dot has no float64 path on CUDA.

A call goes one way through the folder: the checks here, then
``describe`` and ``choose_plan`` (plan.py: which kernel, tile, split and
layouts), then ``run`` (launch.py: the launches), then the kernels
(kernels.py).  ``forward`` and ``backward`` take a ``Tuning`` for tests; the
registered ops call them with the default.
"""

import torch

from ..runtime import (
    GRAD,
    LOWER_PRECISION,
    check_same,
    check_tensor,
    follow_autocast,
    is_fake,
    needs_grad,
    on_cuda,
    register_formula,
    register_op,
    run_direct,
)
from .launch import run
from .plan import TUNING, Tuning, choose_plan, describe


def _check_shapes(a: torch.Tensor, b: torch.Tensor) -> int:
    """The batch size; a clear error when the shapes do not multiply."""
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"tk.matmul: a has shape {tuple(a.shape)} and b has shape {tuple(b.shape)}: "
            f"inner dimensions {a.shape[-1]} and {b.shape[-2]} differ"
        )
    batch_a = a.shape[0] if a.dim() == 3 else None
    batch_b = b.shape[0] if b.dim() == 3 else None
    if batch_a is not None and batch_b is not None and batch_a != batch_b:
        raise ValueError(f"tk.matmul: batch sizes differ: a has {batch_a}, b has {batch_b}")
    if batch_a is not None:  # not `batch_a or batch_b`: a batch of 0 matrices is 0, not 1
        return batch_a
    return 1 if batch_b is None else batch_b


def _check_operands(a: torch.Tensor, b: torch.Tensor, ndims: tuple[int, ...]) -> int:
    """The checks of a and b every entry point makes; the batch size."""
    check_tensor("matmul", "a", a, ndims=ndims)
    check_tensor("matmul", "b", b, ndims=ndims)
    check_same("matmul", {"a": a, "b": b})
    batch = _check_shapes(a, b)
    if a.dtype == torch.float64 and on_cuda(a):
        raise TypeError("tk.matmul: float64 is supported on CPU tensors only (Triton's tl.dot has no float64 path on CUDA)")
    return batch


def forward(a: torch.Tensor, b: torch.Tensor, *, tuning: Tuning = TUNING) -> torch.Tensor:
    """C = a @ b: checks, then the plan (plan.py), then its launches (launch.py)."""
    batch = _check_operands(a, b, ndims=(2, 3))
    if on_cuda(a) and batch > 65535:  # the batch is the grid's second axis, at most 65535 programs on CUDA
        raise ValueError(f"tk.matmul: a batch of {batch} matrices is more than a CUDA grid holds (65535); split the batch")
    return run(choose_plan(describe(a, b), tuning), a, b)


def _spans_overlap(t: torch.Tensor, u: torch.Tensor) -> bool:
    """Whether the byte spans t and u cover (first to last element) meet in one storage: a conservative test
    (two interleaved views of one matrix count as overlapping).  Fake tensors, which have no memory: False."""
    if is_fake(t) or is_fake(u) or not t.numel() or not u.numel():
        return False
    if t.untyped_storage().data_ptr() != u.untyped_storage().data_ptr():
        return False

    def span(x: torch.Tensor) -> tuple[int, int]:
        start = x.storage_offset() * x.element_size()
        last = sum((size - 1) * stride for size, stride in zip(x.shape, x.stride()))
        return start, start + (last + 1) * x.element_size()

    (t_start, t_end), (u_start, u_end) = span(t), span(u)
    return t_start < u_end and u_start < t_end


def product_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, accumulate: bool,
                 tuning: Tuning = TUNING) -> torch.Tensor:  # fmt: skip
    """out = a @ b, or out += a @ b (accumulate), in place: ``torch.addmm(out, a, b, beta=1, out=out)``'s
    numbers, out's values added to the float32 product before its one rounding.  For sums over chunks
    without a second pass over the sum (the weight gradient of ops/linear_cross_entropy).  2-D a and b;
    `out` contiguous, of a's dtype and the product's shape.  Not a registered op: it mutates `out`, and
    its caller runs it eagerly.  Returns out."""
    _check_operands(a, b, ndims=(2,))
    check_tensor("matmul", "out", out, ndims=(2,))
    check_same("matmul", {"a": a, "out": out})
    if tuple(out.shape) != (a.shape[0], b.shape[1]) or not out.is_contiguous():
        raise ValueError(
            f"tk.matmul: out must be a contiguous ({a.shape[0]}, {b.shape[1]}) tensor for a of shape "
            f"{tuple(a.shape)} and b of shape {tuple(b.shape)}; got shape {tuple(out.shape)}, strides {out.stride()}"
        )
    for name, t in (("a", a), ("b", b)):  # the kernels read a and b while they write out
        if _spans_overlap(out, t):
            raise ValueError(f"tk.matmul: out's memory overlaps {name}'s; pass a separate output tensor")
    plan = choose_plan(describe(a, b, out), tuning)
    if torch.compiler.is_compiling() or any(is_fake(t) for t in (out, a, b)):  # handed to the tracer (wrap_triton)
        return run(plan, a, b, out=out, accumulate=accumulate)
    # On real tensors, launched as an op's body launches them (ops.runtime.direct): straight through the compiled
    # kernel.  Through wrap_triton outside a trace, on an H100, a call at an LM head's weight gradient took 0.4-0.7 s
    # and the adding launch's result was wrong (perf-notes version 51; not understood).
    return run_direct(run, (plan, a, b), {"out": out, "accumulate": accumulate})


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return forward(a, b)


matmul = register_op("matmul", _matmul)
# Under autocast, as torch.matmul on either device: operands in the autocast dtype.
follow_autocast("matmul", {"cuda": LOWER_PRECISION, "cpu": LOWER_PRECISION})


def backward(
    grad: torch.Tensor, a: torch.Tensor, b: torch.Tensor, a_grad: bool, b_grad: bool, *, tuning: Tuning = TUNING
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dA, dB) = (dC @ B^T, A^T @ dC), summed over the batch where an operand was shared
    by every batch.  dA (dB) is an empty tensor unless a_grad (b_grad): an op cannot
    return None.  Both products are ``forward`` on transposed views."""
    for name, t in (("grad", grad), ("a", a), ("b", b)):
        check_tensor("matmul_backward", name, t, ndims=(2, 3))
    check_same("matmul_backward", {"grad": grad, "a": a, "b": b})
    batch = _check_shapes(a, b)
    batched = a.dim() == 3 or b.dim() == 3
    expected = (batch, a.shape[-2], b.shape[-1]) if batched else (a.shape[-2], b.shape[-1])
    if tuple(grad.shape) != expected:
        raise ValueError(f"tk.matmul_backward: grad has shape {tuple(grad.shape)}, the product's is {expected}")
    grad_a, grad_b = grad.new_empty(0), grad.new_empty(0)
    if a_grad:
        if a.dim() == 2 and b.dim() == 3:  # a was shared by every batch: sum over it
            # (M, B*N) @ (B*N, K), sizes spelled out: reshape cannot infer a -1 beside a 0 (an empty dim)
            n_batch, k, n = b.shape
            grad_t = grad.transpose(0, 1).reshape(grad.shape[1], n_batch * n)
            b_t = b.transpose(1, 2).reshape(n_batch * n, k)
            grad_a = forward(grad_t, b_t, tuning=tuning)
        else:
            grad_a = forward(grad, b.transpose(-1, -2), tuning=tuning)
    if b_grad:
        if b.dim() == 2 and a.dim() == 3:  # b was shared by every batch
            rows = a.shape[0] * a.shape[1]  # (K, B*M) @ (B*M, N)
            grad_b = forward(a.reshape(rows, a.shape[-1]).t(), grad.reshape(rows, grad.shape[-1]), tuning=tuning)
        else:
            grad_b = forward(a.transpose(-1, -2), grad, tuning=tuning)
    return grad_a, grad_b


def _matmul_backward(
    grad: torch.Tensor, a: torch.Tensor, b: torch.Tensor, a_grad: bool, b_grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return backward(grad, a, b, a_grad, b_grad)


matmul_backward = register_op("matmul_backward", _matmul_backward)
register_formula(
    matmul,
    backward=matmul_backward,
    arguments=(GRAD, "a", "b", needs_grad("a"), needs_grad("b")),
    gradients={"a": 0, "b": 1},
)
