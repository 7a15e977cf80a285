"""add: the third stop of the tour (see ops/tour/copy.py): a second input.

    out = a + b
    da = dout, db = dout                   its backward

Two inputs are read at the same offsets, so they must list their elements
in the same order: both dense with equal strides (any layout), or else both
are copied once to the standard layout (see ``walk_in_one_order``).

a and b must have the same shape, dtype and device.  There is no implicit
broadcasting: a broadcast operand is a view with stride 0, whose elements
repeat and cannot be walked as one flat array.  Broadcast explicitly:
``torch.ops.tk.add(*torch.broadcast_tensors(a, b))`` (the expanded views are
materialized once, and autograd sums the gradient back to each operand's
shape through the expand).
"""

import torch
import triton
import triton.language as tl

from ..blocks.elementwise import (
    elements_per_thread,
    elementwise_config,
    elementwise_grid,
    to_compute_dtype,
    walk_in_one_order,
)
from ..runtime import GRAD, check_same, check_tensor, launcher, register_formula, register_op
from ..spec import ELEMENTWISE_SHAPES, ROUNDING_TOLERANCE, OpSpec, describe_numel, element_size, register_spec


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    # One block of the flat arrays per program, as in copy_kernel: int64
    # offsets (tensors may pass 2**31 elements), and one mask that guards all
    # three pointers, since they share the offsets.
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    a = to_compute_dtype(tl.load(a_ptr + offsets, mask=mask))
    b = to_compute_dtype(tl.load(b_ptr + offsets, mask=mask))
    tl.store(out_ptr + offsets, (a + b).to(out_ptr.dtype.element_ty), mask=mask)


def _add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    check_tensor("add", "a", a)
    check_tensor("add", "b", b)
    check_same("add", {"a": a, "b": b})
    if a.shape != b.shape:
        raise ValueError(
            f"tk.add: a has shape {tuple(a.shape)} but b has {tuple(b.shape)}; tk.add does not broadcast, "
            "call torch.ops.tk.add(*torch.broadcast_tensors(a, b))"
        )
    a, b = walk_in_one_order(a, b)
    out = torch.empty_like(a)
    n = a.numel()
    if n == 0:
        return out
    block, warps = elementwise_config(n, a.device, elements_per_thread(a, inputs=2))
    launcher(add_kernel, a)[elementwise_grid(n, block)](a, b, out, n, BLOCK_SIZE=block, num_warps=warps)
    return out


add = register_op("add", _add)


# d(a + b)/da and d(a + b)/db are identities: both inputs get the incoming
# gradient itself, as with PyTorch's own add; no kernel to run.
register_formula(add, gradients={"a": GRAD, "b": GRAD})


# --------------------------------------------------------------------------
# What the comparison harness reads.
# --------------------------------------------------------------------------


def _make_inputs(shape, dtype, device):
    return torch.randn(shape, dtype=dtype, device=device), torch.randn(shape, dtype=dtype, device=device)


register_spec(
    OpSpec(
        name="add",
        tk=lambda a, b: torch.ops.tk.add(a, b),
        reference=torch.add,
        make_inputs=_make_inputs,
        bytes_moved=lambda shape, dtype: 3 * shape[0] * element_size(dtype),  # read a and b, write out
        flops=lambda shape, dtype: shape[0],
        tolerance=ROUNDING_TOLERANCE,
        shapes=ELEMENTWISE_SHAPES,
        describe=describe_numel,
    )
)
