"""copy: the smallest Triton kernel, and the first stop of the tour.

    y = x                                  (a fresh tensor, like x.clone())

The tour of the elementwise ops, each adding one idea to the one before:

1. ``copy`` (this file): a grid of programs, offsets, a mask; one load, one store.
2. ``square`` (ops/tour/square.py): math, in float32 whatever the storage dtype
   (float64 stays float64).
3. ``add`` (ops/tour/add.py): a second input, which must be walked in the same order.
4. ``rgb_to_grayscale`` (ops/tour/rgb_to_grayscale.py): strides, and integer math.
5. ``swiglu`` and ``geglu`` (ops/swiglu.py): a fused gate, and a backward
   kernel that writes two gradients in one pass.

The launch plumbing they share (the block size rule, the grid, walking
several tensors in one order) lives in ops/blocks/elementwise.py, where the
production ops take it from too; this file uses it and says what it does.

copy does no math, so it also moves integer tensors (uint8 to int64): every
element type loads and stores alike.
"""

import torch
import triton
import triton.language as tl

from ..blocks.elementwise import elements_per_thread, elementwise_config, elementwise_grid, walk_in_one_order
from ..runtime import FLOAT_DTYPES, GRAD, check_tensor, launcher, register_formula, register_op
from ..spec import ELEMENTWISE_SHAPES, OpSpec, describe_numel, element_size, register_spec

INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


@triton.jit
def copy_kernel(x_ptr, y_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    # The tensor is seen as one flat run of n_elements values, cut into blocks
    # of BLOCK_SIZE.  The launch starts one *program* per block; all programs
    # run this same code and differ only by their program id: 0, 1, 2, ...
    #
    # Which block is mine?  Its first element is program_id * BLOCK_SIZE.  The
    # id is an int32, and on a tensor of 2**31 elements or more the product
    # would wrap around and point before the tensor: cast to int64 *before*
    # multiplying.
    start = tl.program_id(0).to(tl.int64) * BLOCK_SIZE
    # The offsets of my elements: a block of BLOCK_SIZE consecutive integers.
    # tl.arange needs a power-of-two length known at compile time, which is
    # why BLOCK_SIZE is a tl.constexpr (each value compiles its own kernel).
    offsets = start + tl.arange(0, BLOCK_SIZE)
    # n_elements is rarely a multiple of BLOCK_SIZE, so the last block hangs
    # past the end of the tensor.  The mask switches those lanes off: a masked
    # load reads nothing and a masked store writes nothing.  Without it the
    # last program would read and write memory that is not ours.
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(y_ptr + offsets, x, mask=mask)


# --------------------------------------------------------------------------
# The op.
# --------------------------------------------------------------------------


def _copy(x: torch.Tensor) -> torch.Tensor:
    check_tensor("copy", "x", x, dtypes=FLOAT_DTYPES + INTEGER_DTYPES)
    # A non-dense input (a strided slice, a broadcast view) is gathered by
    # .contiguous() first, since this kernel reads one flat span: two copies
    # where one would do, the price of keeping the first kernel this simple.
    (x,) = walk_in_one_order(x)
    y = torch.empty_like(x)  # same strides as x: both are walked in the same flat order
    n = x.numel()
    if n == 0:
        return y  # a launch of zero programs is an error on some backends: return early
    block, warps = elementwise_config(n, x.device, elements_per_thread(x))
    launcher(copy_kernel, x)[elementwise_grid(n, block)](x, y, n, BLOCK_SIZE=block, num_warps=warps)
    return y


copy = register_op("copy", _copy)


# dy/dx is the identity: the incoming gradient is x's gradient as it is
# (PyTorch's own clone() does the same); no kernel to run.
register_formula(copy, gradients={"x": GRAD})


# --------------------------------------------------------------------------
# What the comparison harness reads.
# --------------------------------------------------------------------------


register_spec(
    OpSpec(
        name="copy",
        tk=lambda x: torch.ops.tk.copy(x),
        reference=lambda x: x.clone(),
        make_inputs=lambda shape, dtype, device: (torch.randn(shape, dtype=dtype, device=device),),
        bytes_moved=lambda shape, dtype: 2 * shape[0] * element_size(dtype),  # read x, write y
        flops=lambda shape, dtype: 0,
        tolerance={dtype: 0.0 for dtype in FLOAT_DTYPES},  # a copy is exact
        shapes=ELEMENTWISE_SHAPES,
        describe=describe_numel,
    )
)
