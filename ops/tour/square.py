"""square: the second stop of the tour (see ops/tour/copy.py): math in float32.

    y  = x * x
    dx = 2 * x * dy                        its backward

The kernel is copy's, with one line of math between the load and the store.
What is new is the *compute dtype*: float16 and bfloat16 values are widened
to float32 after the load, the math runs in float32, and the result is
rounded once, to the storage dtype, at the store.  float64 stays float64.
"""

import torch
import triton
import triton.language as tl

from ..blocks.elementwise import (  # see ops/blocks/elementwise.py: one rule for every flat kernel
    elements_per_thread,
    elementwise_config,
    elementwise_grid,
    to_compute_dtype,
    walk_in_one_order,
)
from ..runtime import GRAD, check_same, check_tensor, launcher, register_formula, register_op
from ..spec import ELEMENTWISE_SHAPES, ROUNDING_TOLERANCE, OpSpec, describe_numel, element_size, register_spec


@triton.jit
def square_forward_kernel(x_ptr, y_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    # The same program id / offsets / mask pattern as copy_kernel: int64
    # offsets so that tensors past 2**31 elements are addressed correctly, and
    # a mask for the last, partial block.
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = to_compute_dtype(tl.load(x_ptr + offsets, mask=mask))
    y = x * x
    # Round once, to the output's storage dtype (y_ptr's element type).
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def square_backward_kernel(grad_ptr, x_ptr, dx_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    grad = to_compute_dtype(tl.load(grad_ptr + offsets, mask=mask))
    x = to_compute_dtype(tl.load(x_ptr + offsets, mask=mask))
    tl.store(dx_ptr + offsets, (2.0 * x * grad).to(dx_ptr.dtype.element_ty), mask=mask)


def _square(x: torch.Tensor) -> torch.Tensor:
    check_tensor("square", "x", x)
    (x,) = walk_in_one_order(x)
    y = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return y
    block, warps = elementwise_config(n, x.device, elements_per_thread(x))
    launcher(square_forward_kernel, x)[elementwise_grid(n, block)](x, y, n, BLOCK_SIZE=block, num_warps=warps)
    return y


def _square_backward(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    check_tensor("square_backward", "grad", grad)
    check_tensor("square_backward", "x", x)
    check_same("square_backward", {"grad": grad, "x": x})
    if grad.shape != x.shape:
        raise ValueError(f"tk.square_backward: grad has shape {tuple(grad.shape)} but x has {tuple(x.shape)}")
    x, grad = walk_in_one_order(x, grad)
    dx = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return dx
    block, warps = elementwise_config(n, x.device, elements_per_thread(x, inputs=2))
    launcher(square_backward_kernel, x)[elementwise_grid(n, block)](
        grad, x, dx, n, BLOCK_SIZE=block, num_warps=warps
    )
    return dx


square = register_op("square", _square)
square_backward = register_op("square_backward", _square_backward)


register_formula(square, backward=square_backward, arguments=(GRAD, "x"), gradients={"x": 0})


# --------------------------------------------------------------------------
# What the comparison harness reads.
# --------------------------------------------------------------------------

register_spec(
    OpSpec(
        name="square",
        tk=lambda x: torch.ops.tk.square(x),
        reference=torch.square,
        make_inputs=lambda shape, dtype, device: (torch.randn(shape, dtype=dtype, device=device),),
        bytes_moved=lambda shape, dtype: 2 * shape[0] * element_size(dtype),  # read x, write y
        flops=lambda shape, dtype: shape[0],
        tolerance=ROUNDING_TOLERANCE,
        shapes=ELEMENTWISE_SHAPES,
        describe=describe_numel,
        # The lesson's two spellings: eager runs each as one kernel, the same as torch.square.
        unfused={"eager-mul": lambda x: x * x, "eager-pow": lambda x: x**2},
    )
)
