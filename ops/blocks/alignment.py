"""Telling Triton that rows start aligned when their length is not a multiple of 16.

Triton specializes each integer argument on whether it is a multiple of 16,
and its alignment analysis knows nothing else about it.  A kernel that finds
row r at r * n_cols therefore knows that every row starts on a 16-element
boundary when n_cols is a multiple of 16; for any other n_cols it assumes
nothing and loads and stores one element at a time.  A row of 1000 bfloat16
columns (8 x 125) then moves 2 bytes an access where 16 would do (the PTX has
``ld.global.b16`` where ``ld.global.v4.b32`` fits), and the row masks
(``cols < n_cols``) split the same way.

The remedy costs one integer op a program: the launcher passes COL_MULTIPLE,
the largest power of two up to 16 that divides the row length, and the kernel
restates the length with ``known_multiple``: n // COL_MULTIPLE * COL_MULTIPLE,
the same number, in a form the analysis reads as a multiple of COL_MULTIPLE
(a product with a constant).  ``tl.multiple_of`` does not do this: it marks
tensors, and leaves a scalar argument as it was (Triton 3.6 and 3.9).
"""

import triton
import triton.language as tl

_MOST = 16  # what Triton's own specialization already tells for multiples of 16


def column_multiple(*lengths: int) -> int:
    """The largest power of two, at most 16, that divides every one of `lengths` (row lengths, row strides)."""
    bits = _MOST
    for n in lengths:
        bits |= int(n)  # the lowest bit set in any of them, or in 16, is the answer
    return bits & -bits


@triton.jit
def known_multiple(n, MULTIPLE: tl.constexpr):
    """n, known to the compiler as a multiple of MULTIPLE (which must divide n)."""
    if MULTIPLE > 1:
        n = n // MULTIPLE * MULTIPLE
    return n


# ---------------------------------------------------------------------------
# Rows that start off a 16-byte boundary: read in a frame that starts on one.
#
# A row of 50257 bfloat16 starts 2 bytes further off a boundary than the row
# before it, so seven rows in eight start off one.  Columns counted from the
# row's first element cut every 16-byte run in two, and Triton then moves one
# element an access.  Counted from the boundary at or before the row's start
# (the frame), the runs are whole: every run wholly in the row is read and
# written 16 bytes at a time under masks whose bounds are multiples of the run,
# and only the row's first and last partial runs are masked element by element,
# apart.  (Cross entropy's sweeps and softmax's held rows take rows this way.)
# ---------------------------------------------------------------------------


def frame_run(n_cols: int, inner: int, *element_sizes: int) -> int:
    """The elements in a 16-byte run of the narrowest of `element_sizes` where rows of n_cols along
    the last dim (inner == 1) do not all start on a 16-byte boundary and are two runs long at least
    (so that their partial ends are two runs, not one); 0 where the rows need no frame."""
    run = 16 // min(element_sizes)
    off_boundary = any((n_cols * size) % 16 for size in element_sizes)
    return run if inner == 1 and off_boundary and n_cols >= 2 * run else 0


@triton.jit
def peeled_frame(row_start, n_cols, RUN: tl.constexpr):
    """(frame, skew, body_end) of the contiguous row at element row_start, framed at the boundary at or
    before it (RUN elements a 16-byte run): the frame's first element, the row's first column's place in
    the frame (column = place - skew), and the end of the runs wholly in the row, a multiple of RUN.
    The run [0, RUN) and the run from body_end hold the row's partial ends."""
    frame = known_multiple(row_start, RUN)
    skew = (row_start - frame).to(tl.int32)
    return frame, skew, known_multiple(skew + n_cols, RUN)


@triton.jit
def partial_run_places(body_end, RUN: tl.constexpr):
    """The places of a framed row's two partial runs, [0, RUN) and [body_end, body_end + RUN), as one
    block of 2 RUN lanes."""
    lane = tl.arange(0, 2 * RUN)
    return tl.where(lane < RUN, lane, body_end - RUN + lane)


@triton.jit
def frame_edges(skew, body_end, n_cols, RUN: tl.constexpr):
    """partial_run_places, and which of them hold the row's elements (at least one: the row's first)."""
    place = partial_run_places(body_end, RUN)
    return place, (place >= skew) & (place < skew + n_cols)
