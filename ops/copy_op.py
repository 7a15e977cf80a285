"""copy: the smallest Triton kernel, and the first stop of the tour.

    y = x                                  (a fresh tensor, like x.clone())

The tour of the elementwise ops, each adding one idea to the one before:

1. ``copy`` (this file): a grid of programs, offsets, a mask; one load, one store.
2. ``square`` (ops/square.py): math, in float32 whatever the storage dtype
   (float64 stays float64).
3. ``add`` (ops/add.py): a second input, which must be walked in the same order.
4. ``rgb_to_grayscale`` (ops/rgb_to_grayscale.py): strides, and integer math.
5. ``swiglu`` and ``geglu`` (ops/swiglu.py): a fused gate, and a backward
   kernel that writes two gradients in one pass.

The launch plumbing shared by all of them (the block size rule, the grid,
walking several tensors in one order) is defined here and reused by the
others.

copy does no math, so it also moves integer tensors (uint8 to int64): every
element type loads and stores alike.
"""

import math

import torch
import triton
import triton.language as tl

from ._launch import cdiv, next_power_of_2
from ._registry import (
    FLOAT_DTYPES,
    GRAD,
    OpSpec,
    check_tensor,
    is_dense,
    launcher,
    register_formula,
    register_op,
    register_spec,
)

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
# Launch plumbing, shared by every elementwise op of the tour.
# --------------------------------------------------------------------------


def many_inputs_per_thread(t: torch.Tensor) -> int:
    """Elements a thread for a kernel that reads two or more tensors like t
    (add, the backwards, swiglu): 8 bytes of each, 4 of a 16-bit dtype and
    2 of float32.  See elementwise_config."""
    return max(8 // t.element_size(), 1)


def elementwise_config(n: int, device: torch.device, per_thread: int = 8) -> tuple[int, int]:
    """(BLOCK_SIZE, num_warps) for a kernel over n elements.

    GPU: programs of 8 warps (256 threads), each thread taking ``per_thread``
    elements, or fewer where that would leave fewer than _MIN_PROGRAMS
    programs: one element a thread below 2**18 elements, two below 2**19,
    four below 2**20, and ``per_thread`` from 2**20 on (or earlier, when it
    asks for fewer).

    * Large tensors: once every SM is full (2048 threads), more bytes in
      flight a thread buy nothing, and shorter programs measured faster, as
      long as each load stays 8 bytes or wider.  On an H100 (perf notes,
      versions 35 and 35b), with the same grid rule at each count: one input
      (copy, square, GELU) takes 8 a thread, one 16-byte load of a 16-bit
      dtype (16 was 0.3-1 point of copy slower; 4 was level in float32 and
      5-6 points slower in bfloat16); two or three inputs take 8 bytes of
      each (``many_inputs_per_thread``): at 16 elements, 4 and 2, float32 ran
      at 100.2 / 101.6 / 102.3% of copy and bfloat16 at 101.7 / 103.0 / 92.5%
      (2^28 elements, add; a 4-byte load of two bf16 values is too narrow).
    * Small tensors are bound by latency, not bandwidth: what counts is how
      many SMs share the work and how much math each thread does in a row.
      Blocks of 1024 on 4 warps (the rule before version 36) left a float32
      erf GELU backward of 2**16 elements on 64 programs at 0.8x the speed of
      Inductor's kernel; one element a thread on 256 programs runs at 1.0-1.3x
      (CUDA-graph time on an H100; perf notes, version 36).

    Every block is a power of two, as tl.arange requires.

    CPU (Triton's interpreter): every program costs Python time, so one
    program takes as much as it can: the whole tensor up to 2**16 elements.
    """
    if per_thread < 1 or per_thread & (per_thread - 1):
        raise ValueError(f"elementwise_config: per_thread must be a power of two, got {per_thread}")
    if device.type != "cuda":
        return min(next_power_of_2(max(n, 1)), 1 << 16), 1
    # Doubled while the programs stay _MIN_PROGRAMS or more.  Comparisons only: under
    # torch.compile with dynamic shapes n is symbolic, and each one guards a threshold,
    # where arithmetic on n would pin the compiled graph to a narrow range of sizes.
    taken = 1
    while taken < per_thread and n >= 2 * taken * _THREADS * _MIN_PROGRAMS:
        taken *= 2
    return _THREADS * taken, _THREADS // 32


_THREADS = 256  # a program's threads (8 warps) on a GPU
_MIN_PROGRAMS = 512  # about 4 an SM on an H100


def elementwise_grid(n: int, block: int) -> tuple[int]:
    """One program per block, the last one partial: ceil(n / block) programs."""
    return (cdiv(n, block),)


def walk_in_one_order(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors, ready to be read as flat arrays in the same element order.

    An elementwise kernel pairs the i-th value in memory of each tensor, so
    the tensors must lay their elements out alike.  A dense tensor (its
    elements fill one span of memory: contiguous, transposed, channels-last,
    ...) is one flat array; tensors of equal strides list the same elements
    in the same order.  Anything else (a slice with gaps, a broadcast view,
    tensors of different layouts) is copied once to the standard layout.
    """
    first = tensors[0]
    if is_dense(first) and all(t.stride() == first.stride() for t in tensors[1:]):
        return tensors
    return tuple(t.contiguous() for t in tensors)


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
    block, warps = elementwise_config(n, x.device)
    launcher(copy_kernel, x)[elementwise_grid(n, block)](x, y, n, BLOCK_SIZE=block, num_warps=warps)
    return y


copy = register_op("copy", _copy)


# dy/dx is the identity: the incoming gradient is x's gradient as it is
# (PyTorch's own clone() does the same); no kernel to run.
register_formula(copy, gradients={"x": GRAD})


# --------------------------------------------------------------------------
# What the comparison harness reads.
# --------------------------------------------------------------------------


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def describe_numel(shape) -> str:
    (n,) = shape
    return f"n=2^{math.log2(n):.0f}" if n & (n - 1) == 0 else f"n={n}"


# Max relative norm error against float64, per dtype, for ops whose only
# error is the final rounding (and the reference's own roundings).
ROUNDING_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float64: 1e-7}

# Flat sizes from 4096 elements (launch-bound) to 2**28 (0.5 to 1 GiB a tensor).
ELEMENTWISE_SHAPES = {
    "cuda": [(1 << k,) for k in (12, 16, 20, 22, 24, 26, 28)],
    "cpu": [(1000,), (65_537,), (1 << 20,)],
}

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
