"""Softmax's Triton kernels that read a row from memory on their own: one block, looped, split.

The math of every design is in ops/softmax/__init__.py; which design runs for
which shape is ops/softmax/plan.py.  The held-rows kernels are in held.py, their
Gluon forwards in gluon.py.
"""


import triton
import triton.language as tl

from ..blocks.alignment import known_multiple
from ..blocks.fastmath import exp, finite_or_zero
from ..blocks.held_rows import (
    partial_at,
)

# --------------------------------------------------------------------------
# Pieces shared by the kernels.
# --------------------------------------------------------------------------


@triton.jit
def _row_start(row, n_cols, inner):
    """Offset of the first element of `row` in an (outer, n_cols, inner) tensor."""
    outer_index = row // inner
    return outer_index * n_cols * inner + (row - outer_index * inner)


@triton.jit
def _offsets(start, cols, inner):
    """Where columns `cols` of the row at `start` lie; int64, as cols * inner may pass 2**31."""
    return start + cols.to(tl.int64) * inner


@triton.jit
def _load_row(ptr, start, cols, end, inner, other):
    """Columns `cols` of a row; those at or past `end` read as `other`."""
    x = tl.load(ptr + _offsets(start, cols, inner), mask=cols < end, other=other)
    if x.dtype != tl.float64:  # resolved at compile time: half and float32 compute in float32
        x = x.to(tl.float32)
    return x


@triton.jit
def _store_row(ptr, start, cols, end, inner, value):
    tl.store(ptr + _offsets(start, cols, inner), value.to(ptr.dtype.element_ty), mask=cols < end)


@triton.jit
def _block_max_exp(x):
    """max(x) and exp(x - max) of one block (-inf lanes give exp(-inf) = 0)."""
    block_max = tl.max(x, axis=0)
    return block_max, exp(x - finite_or_zero(block_max))


@triton.jit
def _block_max_sum(x):
    """max and sum(exp(x - max)) of one block."""
    block_max, numerator = _block_max_exp(x)
    return block_max, tl.sum(numerator, axis=0)


@triton.jit
def _rescale(part_max, row_max, row_sum):
    """What turns a part's exp(x - part max) into the row's softmax: exp(part max
    - row max) / row sum.  A part of -inf only gets exp(-inf - row max) = 0 (its
    numerators, exp(x - 0), are 0 too), unless the whole row is -inf: then
    exp(-inf - -inf) is NaN, and so is the row, as in torch.softmax."""
    return exp(part_max - row_max) / row_sum


@triton.jit
def _combine_partials(part_max, part_sum):
    """A row's max and sum from its parts' (max, sum): each part's sum is
    rescaled from its own max to the row's, as the online sum does.  A part
    of -inf only (and a padding lane) has max -inf and sum 0: exp(-inf - M)
    = 0 keeps it out.  An all -inf row has M = -inf: exp(-inf - -inf) is NaN,
    so the sum and the row are NaN, as in torch.softmax."""
    row_max = tl.max(part_max, axis=0)
    return row_max, tl.sum(part_sum * exp(part_max - row_max), axis=0)


@triton.jit
def _online_max_sum(x_ptr, start, first, end, inner, BLOCK_SIZE: tl.constexpr):
    """max and sum(exp(x - max)) of columns [first, end) of a row, in one sweep."""
    cols = first + tl.arange(0, BLOCK_SIZE)
    # The first chunk starts the running max and sum, so they take the compute
    # dtype (float32, or float64) from the data: Triton on CUDA refuses a loop
    # variable whose type would change from float32 to float64 inside the loop.
    x = _load_row(x_ptr, start, cols, end, inner, -float("inf"))
    run_max, run_sum = _block_max_sum(x)
    for chunk in range(first + BLOCK_SIZE, end, BLOCK_SIZE):
        x = _load_row(x_ptr, start, chunk + tl.arange(0, BLOCK_SIZE), end, inner, -float("inf"))
        new_max = tl.maximum(run_max, tl.max(x, axis=0))
        shift = finite_or_zero(new_max)
        run_sum = run_sum * exp(run_max - shift) + tl.sum(exp(x - shift), axis=0)
        run_max = new_max
    return run_max, run_sum


@triton.jit
def _write_softmax(x_ptr, y_ptr, start, first, end, inner, row_max, row_sum, BLOCK_SIZE: tl.constexpr):
    """y = exp(x - max) / sum over columns [first, end) of a row, chunk by chunk.
    An all -inf row has max -inf: exp(-inf - -inf) is NaN, as in torch.softmax."""
    for chunk in range(first, end, BLOCK_SIZE):
        cols = chunk + tl.arange(0, BLOCK_SIZE)
        x = _load_row(x_ptr, start, cols, end, inner, -float("inf"))
        _store_row(y_ptr, start, cols, end, inner, exp(x - row_max) / row_sum)


@triton.jit
def _dot(dy_ptr, y_ptr, start, first, end, inner, BLOCK_SIZE: tl.constexpr):
    """sum(dy * y) over columns [first, end) of a row."""
    cols = first + tl.arange(0, BLOCK_SIZE)
    dy = _load_row(dy_ptr, start, cols, end, inner, 0.0)
    y = _load_row(y_ptr, start, cols, end, inner, 0.0)
    dot = tl.sum(dy * y, axis=0)  # the first chunk sets the accumulator's dtype
    for chunk in range(first + BLOCK_SIZE, end, BLOCK_SIZE):
        cols = chunk + tl.arange(0, BLOCK_SIZE)
        dy = _load_row(dy_ptr, start, cols, end, inner, 0.0)
        y = _load_row(y_ptr, start, cols, end, inner, 0.0)
        dot += tl.sum(dy * y, axis=0)
    return dot


@triton.jit
def _write_dx(dy_ptr, y_ptr, dx_ptr, start, first, end, inner, dot, BLOCK_SIZE: tl.constexpr):
    """dx = y * (dy - dot) over columns [first, end) of a row, chunk by chunk."""
    for chunk in range(first, end, BLOCK_SIZE):
        cols = chunk + tl.arange(0, BLOCK_SIZE)
        dy = _load_row(dy_ptr, start, cols, end, inner, 0.0)
        y = _load_row(y_ptr, start, cols, end, inner, 0.0)
        _store_row(dx_ptr, start, cols, end, inner, y * (dy - dot))


# --------------------------------------------------------------------------
# One program per row.
# --------------------------------------------------------------------------


@triton.jit
def _tile(n_rows, n_cols, inner, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's tile of BLOCK_M whole rows (BLOCK_N >= n_cols columns):
    its offsets, which lanes to read and which to write.

    The last tile hangs over the last row.  Its rows past the end read the
    last row again (from cache) and are not written: padding rows of -inf
    would compute NaN, which the interpreter reports as a numpy warning."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    cols = tl.arange(0, BLOCK_N)[None, :]
    offsets = _offsets(_row_start(tl.minimum(rows, n_rows - 1), n_cols, inner), cols, inner)
    return offsets, cols < n_cols, (rows < n_rows) & (cols < n_cols)


@triton.jit
def softmax_forward_kernel(
    x_ptr, y_ptr, n_rows, n_cols, inner, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, COL_MULTIPLE: tl.constexpr
):
    """Rows that fit in one block: a tile of BLOCK_M whole rows (one, for long
    rows), each reduced on its own in registers; one read and one write."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    offsets, read, write = _tile(n_rows, n_cols, inner, BLOCK_M, BLOCK_N)
    x = _compute_dtype(tl.load(x_ptr + offsets, mask=read, other=-float("inf")))  # -inf lanes add exp(-inf) = 0
    numerator = exp(x - tl.max(x, axis=1)[:, None])  # subtracting the max keeps exp() from overflowing
    y = numerator / tl.sum(numerator, axis=1)[:, None]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=write)


@triton.jit
def softmax_forward_online_kernel(x_ptr, y_ptr, n_cols, inner, BLOCK_SIZE: tl.constexpr, COL_MULTIPLE: tl.constexpr):
    """A row a program, chunk by chunk: online max and sum, then a second pass to write.  Rows longer
    than a block, and float32 rows of one chunk where a block's registers cost more (plan.py)."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    start = _row_start(tl.program_id(0).to(tl.int64), n_cols, inner)
    row_max, row_sum = _online_max_sum(x_ptr, start, 0, n_cols, inner, BLOCK_SIZE)
    _write_softmax(x_ptr, y_ptr, start, 0, n_cols, inner, row_max, row_sum, BLOCK_SIZE)


@triton.jit
def _compute_dtype(x):
    """x in the compute dtype: float32, or float64 for float64."""
    if x.dtype != tl.float64:  # resolved at compile time
        x = x.to(tl.float32)
    return x


@triton.jit
def _segment_dot(dy, y):
    """sum(dy * y) along the last axis (a segment's, or each row's of a tile), each product
    taken and summed in float32 (float64 for float64) from the stored values."""
    return tl.sum(_compute_dtype(dy) * _compute_dtype(y), axis=len(dy.shape) - 1)


@triton.jit
def softmax_backward_kernel(
    dy_ptr, y_ptr, dx_ptr, n_rows, n_cols, inner,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, COL_MULTIPLE: tl.constexpr,
):  # fmt: skip
    """dx = y * (dy - sum(dy * y)), a tile of BLOCK_M whole rows in one block.

    dy and y are loaded in their storage dtype and widened where they are used:
    each product dy * y and the sum in float32, dx in float32 from the stored
    values.  (The products were once rounded to the storage dtype, to keep
    float32 copies of a long 16-bit row out of the registers; that gave up to
    35x PyTorch's error on some rows, and the compiler keeps the widened values
    as short-lived as the rounded ones: the same registers and stack, sm_90.)
    The held backward takes its dot the same way."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    offsets, read, write = _tile(n_rows, n_cols, inner, BLOCK_M, BLOCK_N)
    dy = tl.load(dy_ptr + offsets, mask=read, other=0.0)
    y = tl.load(y_ptr + offsets, mask=read, other=0.0)
    dot = _segment_dot(dy, y)
    dx = _compute_dtype(y) * (_compute_dtype(dy) - dot[:, None])
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=write)


@triton.jit
def softmax_backward_looped_kernel(
    dy_ptr, y_ptr, dx_ptr, n_cols, inner, BLOCK_SIZE: tl.constexpr, COL_MULTIPLE: tl.constexpr
):
    """A row a program, chunk by chunk: one pass for sum(dy * y), one to write dx.  Rows longer than a
    block, and 16-bit rows of one chunk that fill it partly (plan.py)."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    start = _row_start(tl.program_id(0).to(tl.int64), n_cols, inner)
    dot = _dot(dy_ptr, y_ptr, start, 0, n_cols, inner, BLOCK_SIZE)
    _write_dx(dy_ptr, y_ptr, dx_ptr, start, 0, n_cols, inner, dot, BLOCK_SIZE)


# --------------------------------------------------------------------------
# Split rows: a (row, segment) grid, partials in a (n_rows, n_segments) scratch.
# --------------------------------------------------------------------------


@triton.jit
def _segment(segment, segment_len, n_cols):
    """Columns [first, end) of a row that `segment` covers (the last one may be short)."""
    first = segment.to(tl.int64) * segment_len
    return first, tl.minimum(first + segment_len, n_cols)


@triton.jit
def _reversed_program():
    """(row, segment) of a second-pass program: the grid walked backwards.

    The GPU starts programs in about grid order, so the first pass read the
    last (row, segment)s last, and they are still in L2 (50 MB on an H100):
    the second pass begins with them instead of with data long evicted.
    Reversing both coordinates reverses the order whichever axis the
    hardware walks first."""
    row = tl.num_programs(0) - 1 - tl.program_id(0)
    segment = tl.num_programs(1) - 1 - tl.program_id(1)
    return row.to(tl.int64), segment


@triton.jit
def _row_partials(ptr, row, n_segments, other, SEGMENTS_BLOCK: tl.constexpr):
    """All partials of `row` in one masked block (lanes past the last segment: `other`).
    Read from L2 (`.cg`): other programs, on other SMs, wrote them."""
    segments = tl.arange(0, SEGMENTS_BLOCK)
    offsets = partial_at(row, segments, n_segments)
    return tl.load(ptr + offsets, mask=segments < n_segments, other=other, cache_modifier=".cg")


@triton.jit
def softmax_partial_stats_kernel(
    x_ptr, max_ptr, sum_ptr, n_cols, inner, segment_len, BLOCK_SIZE: tl.constexpr, COL_MULTIPLE: tl.constexpr
):
    """Split rows, pass 1: the online (max, sum) of one segment of one row."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    row, segment = tl.program_id(0).to(tl.int64), tl.program_id(1)
    first, end = _segment(segment, segment_len, n_cols)
    seg_max, seg_sum = _online_max_sum(x_ptr, _row_start(row, n_cols, inner), first, end, inner, BLOCK_SIZE)
    at = partial_at(row, segment, tl.num_programs(1))  # the grid is the scratch's shape: in bounds
    tl.store(max_ptr + at, seg_max)
    tl.store(sum_ptr + at, seg_sum)


@triton.jit
def softmax_normalize_segments_kernel(
    x_ptr, y_ptr, max_ptr, sum_ptr, n_cols, inner, segment_len,
    BLOCK_SIZE: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr, COL_MULTIPLE: tl.constexpr,
):  # fmt: skip
    """Split rows, pass 2: combine the row's partials, then write one segment."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    row, segment = _reversed_program()
    seg_max = _row_partials(max_ptr, row, tl.num_programs(1), -float("inf"), SEGMENTS_BLOCK)
    seg_sum = _row_partials(sum_ptr, row, tl.num_programs(1), 0.0, SEGMENTS_BLOCK)
    row_max, row_sum = _combine_partials(seg_max, seg_sum)
    first, end = _segment(segment, segment_len, n_cols)
    _write_softmax(x_ptr, y_ptr, _row_start(row, n_cols, inner), first, end, inner, row_max, row_sum, BLOCK_SIZE)


@triton.jit
def softmax_backward_partial_dot_kernel(
    dy_ptr, y_ptr, dot_ptr, n_cols, inner, segment_len, BLOCK_SIZE: tl.constexpr, COL_MULTIPLE: tl.constexpr
):
    """Split rows, pass 1: sum(dy * y) over one segment of one row."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    row, segment = tl.program_id(0).to(tl.int64), tl.program_id(1)
    first, end = _segment(segment, segment_len, n_cols)
    dot = _dot(dy_ptr, y_ptr, _row_start(row, n_cols, inner), first, end, inner, BLOCK_SIZE)
    tl.store(dot_ptr + partial_at(row, segment, tl.num_programs(1)), dot)  # the grid is the scratch's shape


@triton.jit
def softmax_backward_segments_kernel(
    dy_ptr, y_ptr, dx_ptr, dot_ptr, n_cols, inner, segment_len,
    BLOCK_SIZE: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr, COL_MULTIPLE: tl.constexpr,
):  # fmt: skip
    """Split rows, pass 2: the row's dot is the sum of its partials; write dx for one segment."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    row, segment = _reversed_program()
    dot = tl.sum(_row_partials(dot_ptr, row, tl.num_programs(1), 0.0, SEGMENTS_BLOCK), axis=0)
    first, end = _segment(segment, segment_len, n_cols)
    _write_dx(dy_ptr, y_ptr, dx_ptr, _row_start(row, n_cols, inner), first, end, inner, dot, BLOCK_SIZE)
