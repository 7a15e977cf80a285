"""Softmax rows held on chip across programs (the protocol: ops/blocks/held_rows.py).

A program's partial is its segment's (max, sum) in the forward, sum(dy * y) in
the backward; lanes past a row's last segment read as (-inf, 0.0), a partial
that counts for nothing.
"""


import triton
import triton.language as tl

from ..blocks.alignment import known_multiple
from ..blocks.held_rows import (
    pack,
    partial_at,
    program_segment,
    publish,
    row_words,
    unpack,
    wait_for_fill,
)
from .kernels import (
    _block_max_exp,
    _block_max_sum,
    _combine_partials,
    _compute_dtype,
    _load_row,
    _offsets,
    _rescale,
    _row_start,
    _segment_dot,
    _store_row,
)


@triton.jit
def _pack_dot(dot):
    """The backward's partial, sum(dy * y), as a word (in the lower half)."""
    return pack(tl.zeros_like(dot), dot)


@triton.jit
def _load_stored(ptr, row, n_rows, cols, n_cols, inner, other):
    """The row's columns `cols` in their storage dtype; all `other` (nothing read) when row >= n_rows."""
    end = tl.where(row < n_rows, n_cols, 0)
    return tl.load(ptr + _offsets(_row_start(row, n_cols, inner), cols, inner), mask=cols < end, other=other)


@triton.jit
def _load_x(x_ptr, row, n_rows, cols, n_cols, inner):
    """A segment of x in the compute dtype (-inf past the last row)."""
    return _compute_dtype(_load_stored(x_ptr, row, n_rows, cols, n_cols, inner, -float("inf")))


@triton.jit
def _segments_max_sum_here(x_ptr, start, n_cols, inner, n_segments, SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr):
    """Every segment's (max, sum) of a row, computed by this program: the same
    code on the same blocks as the programs that own them, so the same bits."""
    segments = tl.arange(0, SEGMENTS_BLOCK)
    part_max = tl.full((SEGMENTS_BLOCK,), -float("inf"), tl.float32)
    part_sum = tl.zeros((SEGMENTS_BLOCK,), tl.float32)
    for segment in range(0, n_segments):
        x = _load_row(x_ptr, start, segment * SEGMENT + tl.arange(0, SEGMENT), n_cols, inner, -float("inf"))
        seg_max, seg_sum = _block_max_sum(x)
        part_max = tl.where(segments == segment, seg_max, part_max)
        part_sum = tl.where(segments == segment, seg_sum, part_sum)
    return part_max, part_sum


@triton.jit
def _write_held_segment(x_ptr, y_ptr, words_ptr, start, row, cols, n_cols, inner, n_segments, max_spins, seg_max, numerator,
                        SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr):  # fmt: skip
    """Wait for the row's words, combine them and write y's segment from its numerators."""
    words, published = row_words(words_ptr, row, n_segments, max_spins, SEGMENTS_BLOCK)
    if published:
        part_max, part_sum = unpack(words)
    else:
        part_max, part_sum = _segments_max_sum_here(x_ptr, start, n_cols, inner, n_segments, SEGMENT, SEGMENTS_BLOCK)
        # Compute this segment's numerator again rather than keep it in registers through the loop above.
        seg_max, numerator = _block_max_exp(_load_row(x_ptr, start, cols, n_cols, inner, -float("inf")))
    row_max, row_sum = _combine_partials(part_max, part_sum)
    _store_row(y_ptr, start, cols, n_cols, inner, numerator * _rescale(seg_max, row_max, row_sum))


@triton.jit
def softmax_forward_held_kernel(
    x_ptr, y_ptr, words_ptr, n_rows, n_cols, inner, n_segments, rows_at_once, max_spins,
    SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr, LOAD_NEXT: tl.constexpr, COL_MULTIPLE: tl.constexpr,
    OVERLAPPED: tl.constexpr,
):
    """Rows held on chip across programs: publish (max, sum) of the segment, wait, write y
    (the plan's PUBLISH_THEN_WAIT).

    The segment's exp(x - segment max), computed for its sum, is kept rather
    than x: after the wait y is that times one factor, exp(segment max - row
    max) / row sum, with no second exp over the segment.  LOAD_NEXT: when the
    next round's segment is loaded (plan.py, Tuning.load_before_partial_segments), to stream in while this
    round works and waits: "before_partial" or "during_wait"."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    segment, cols, first_row = program_segment(n_segments, SEGMENT)
    x = _load_x(x_ptr, first_row, n_rows, cols, n_cols, inner)
    wait_for_fill(OVERLAPPED)
    for round in range(0, tl.cdiv(n_rows - first_row, rows_at_once)):
        row = first_row + round * rows_at_once
        next_row = row + rows_at_once
        start = _row_start(row, n_cols, inner)
        if LOAD_NEXT == "before_partial":
            x_next = _load_x(x_ptr, next_row, n_rows, cols, n_cols, inner)
        seg_max, numerator = _block_max_exp(x)
        publish(words_ptr, partial_at(row, segment, n_segments), pack(seg_max, tl.sum(numerator, axis=0)))
        if LOAD_NEXT == "during_wait":
            x_next = _load_x(x_ptr, next_row, n_rows, cols, n_cols, inner)
        _write_held_segment(x_ptr, y_ptr, words_ptr, start, row, cols, n_cols, inner, n_segments, max_spins, seg_max,
                            numerator, SEGMENT, SEGMENTS_BLOCK)  # fmt: skip
        x = x_next


@triton.jit
def _publish_max_sum(x_ptr, words_ptr, row, n_rows, segment, cols, n_cols, inner, n_segments, OVERLAPPED: tl.constexpr):
    """Load `row`'s segment, publish its (max, sum) word (none past the last row); its max and exp(x - max).
    OVERLAPPED: this is the kernel's first publish (see wait_for_fill)."""
    seg_max, numerator = _block_max_exp(_load_x(x_ptr, row, n_rows, cols, n_cols, inner))
    wait_for_fill(OVERLAPPED)
    if row < n_rows:
        publish(words_ptr, partial_at(row, segment, n_segments), pack(seg_max, tl.sum(numerator, axis=0)))
    return seg_max, numerator


@triton.jit
def softmax_forward_lagged_kernel(
    x_ptr, y_ptr, words_ptr, n_rows, n_cols, inner, n_segments, rows_at_once, max_spins,
    SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr, COL_MULTIPLE: tl.constexpr, OVERLAPPED: tl.constexpr,
):
    """Rows held on chip across programs, publishing a round ahead: the next
    row's (max, sum) goes out before the wait for this row's words.

    The wait for a row is the wait for its slowest program; here each
    program has a whole round of its own work (the next segment's loads,
    exp and sum) between publishing a row and needing that row's words, so
    the words are usually there when it looks.  The price is two segments'
    numerators in registers, which float32 affords on segments of 4096
    columns (16-bit rows: see plan.py's Tuning)."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    segment, cols, first_row = program_segment(n_segments, SEGMENT)
    seg_max, numerator = _publish_max_sum(x_ptr, words_ptr, first_row, n_rows, segment, cols, n_cols, inner, n_segments,
                                          OVERLAPPED)  # fmt: skip
    for round in range(0, tl.cdiv(n_rows - first_row, rows_at_once)):
        row = first_row + round * rows_at_once
        next_row = row + rows_at_once
        next_max, next_numerator = _publish_max_sum(x_ptr, words_ptr, next_row, n_rows, segment, cols, n_cols, inner,
                                                    n_segments, False)  # fmt: skip
        _write_held_segment(x_ptr, y_ptr, words_ptr, _row_start(row, n_cols, inner), row, cols, n_cols, inner, n_segments,
                            max_spins, seg_max, numerator, SEGMENT, SEGMENTS_BLOCK)  # fmt: skip
        seg_max, numerator = next_max, next_numerator


@triton.jit
def _load_dy_y(dy_ptr, y_ptr, row, n_rows, cols, n_cols, inner):
    """A segment of dy and of y, in their storage dtype (zeros past the last row)."""
    dy = _load_stored(dy_ptr, row, n_rows, cols, n_cols, inner, 0.0)
    return dy, _load_stored(y_ptr, row, n_rows, cols, n_cols, inner, 0.0)


@triton.jit
def _segments_dot_here(dy_ptr, y_ptr, row, n_rows, n_cols, inner, n_segments,
                       SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr):  # fmt: skip
    """Every segment's sum(dy * y) of a row, computed by this program (see _segments_max_sum_here)."""
    segments = tl.arange(0, SEGMENTS_BLOCK)
    part_dot = tl.zeros((SEGMENTS_BLOCK,), tl.float32)
    for segment in range(0, n_segments):
        cols = segment * SEGMENT + tl.arange(0, SEGMENT)
        dy, y = _load_dy_y(dy_ptr, y_ptr, row, n_rows, cols, n_cols, inner)
        part_dot = tl.where(segments == segment, _segment_dot(dy, y), part_dot)
    return part_dot


@triton.jit
def _publish_dot(dy_ptr, y_ptr, words_ptr, row, n_rows, segment, cols, n_cols, inner, n_segments,
                 OVERLAPPED: tl.constexpr):  # fmt: skip
    """Load `row`'s segment of dy and y, publish its sum(dy * y) word (none past the last row); dy and y.
    OVERLAPPED: this is the kernel's first publish (see wait_for_fill)."""
    dy, y = _load_dy_y(dy_ptr, y_ptr, row, n_rows, cols, n_cols, inner)
    wait_for_fill(OVERLAPPED)
    if row < n_rows:
        publish(words_ptr, partial_at(row, segment, n_segments), _pack_dot(_segment_dot(dy, y)))
    return dy, y


@triton.jit
def softmax_backward_lagged_kernel(
    dy_ptr, y_ptr, dx_ptr, words_ptr, n_rows, n_cols, inner, n_segments, rows_at_once, max_spins,
    SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr, COL_MULTIPLE: tl.constexpr,
    OVERLAPPED: tl.constexpr,
):
    """Rows held on chip across programs, publishing a round ahead (see
    softmax_forward_lagged_kernel): the next row's sum(dy * y) goes out
    before the wait for this row's words, then dx is written."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    segment, cols, first_row = program_segment(n_segments, SEGMENT)
    dy, y = _publish_dot(dy_ptr, y_ptr, words_ptr, first_row, n_rows, segment, cols, n_cols, inner, n_segments,
                         OVERLAPPED)  # fmt: skip
    for round in range(0, tl.cdiv(n_rows - first_row, rows_at_once)):
        row = first_row + round * rows_at_once
        next_row = row + rows_at_once
        dy_next, y_next = _publish_dot(dy_ptr, y_ptr, words_ptr, next_row, n_rows, segment, cols, n_cols, inner, n_segments,
                                       False)  # fmt: skip
        words, published = row_words(words_ptr, row, n_segments, max_spins, SEGMENTS_BLOCK)
        if published:
            _, part_dot = unpack(words)
        else:
            part_dot = _segments_dot_here(dy_ptr, y_ptr, row, n_rows, n_cols, inner, n_segments, SEGMENT, SEGMENTS_BLOCK)
            # Read this segment again rather than keep it in registers through the loop above.
            dy, y = _load_dy_y(dy_ptr, y_ptr, row, n_rows, cols, n_cols, inner)
        dot = tl.sum(part_dot, axis=0)
        _store_row(dx_ptr, _row_start(row, n_cols, inner), cols, n_cols, inner, _compute_dtype(y) * (_compute_dtype(dy) - dot))
        dy, y = dy_next, y_next
