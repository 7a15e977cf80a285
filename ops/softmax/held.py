"""Softmax rows held on chip across programs (the protocol: ops/blocks/held_rows.py).

A program's partial is its segment's (max, sum) in the forward, sum(dy * y) in
the backward; lanes past a row's last segment read as (-inf, 0.0), a partial
that counts for nothing.
"""


import triton
import triton.language as tl

from ..blocks.alignment import known_multiple, partial_run_places, peeled_frame
from ..blocks.held_rows import (
    pack,
    partial_at,
    program_segment,
    publish,
    row_words,
    unpack,
    wait_for_fill,
)
from ..blocks.fastmath import exp, finite_or_zero
from .kernels import (
    _block_max_exp,
    _combine_partials,
    _compute_dtype,
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


# A row framed at a 16-byte boundary (FRAME, the elements in a run, or 0; see
# ops/blocks/alignment.py): a program's columns `cols` are places in the frame,
# the runs wholly in the row read under run-aligned masks, and the program whose
# segment holds one of the row's two partial runs reads it apart, element by
# element, as its `edge` (FRAME 0: no edge; the helpers then pass a placeholder).


@triton.jit
def _row_frame(row, n_cols, inner, FRAME: tl.constexpr):
    """(start, skew, body_end) of `row`: where its reads start, its first column's place, and
    the end of its whole runs; unframed, (its start, 0, n_cols)."""
    start = _row_start(row, n_cols, inner)
    skew = 0
    body_end = n_cols
    if FRAME:
        start, skew, body_end = peeled_frame(start, n_cols, FRAME)
    return start, skew, body_end


@triton.jit
def _edge_places(segment, body_end, SEGMENT: tl.constexpr, FRAME: tl.constexpr):
    """The frame places of a framed row's partial runs, [0, FRAME) and [body_end, body_end + FRAME),
    and which of them lie in `segment` (a run never straddles two: SEGMENT is a multiple of FRAME)."""
    place = partial_run_places(body_end, FRAME)
    return place, place // SEGMENT == segment


@triton.jit
def _load_stored(ptr, row, n_rows, segment, cols, n_cols, inner, other, SEGMENT: tl.constexpr, FRAME: tl.constexpr):
    """The row's segment in its storage dtype, and its edge (FRAME); all `other` (nothing read) when
    row >= n_rows."""
    start, skew, body_end = _row_frame(row, n_cols, inner, FRAME)
    edge = other  # one return statement: Triton types every return alike, also under a constexpr if
    if FRAME:
        # Past the last row both ends are 0: nothing is read.  (A where of two scalars keeps the
        # bound a multiple of FRAME to the compiler, as `end` below keeps n_cols's multiple.)
        body_end = tl.where(row < n_rows, body_end, 0)
        x = tl.load(ptr + start + cols, mask=(cols >= FRAME) & (cols < body_end), other=other)
        place, here = _edge_places(segment, body_end, SEGMENT, FRAME)
        end = tl.where(row < n_rows, skew + n_cols, 0)
        edge = tl.load(ptr + start + place, mask=here & (place >= skew) & (place < end), other=other)
    else:
        end = tl.where(row < n_rows, n_cols, 0)
        x = tl.load(ptr + _offsets(start, cols, inner), mask=cols < end, other=other)
    return x, edge


@triton.jit
def _store_segment(ptr, row, segment, cols, n_cols, inner, value, edge, SEGMENT: tl.constexpr, FRAME: tl.constexpr):
    """Write the row's segment (and its edge, FRAME) of the output."""
    start, skew, body_end = _row_frame(row, n_cols, inner, FRAME)
    if FRAME:
        tl.store(ptr + start + cols, value.to(ptr.dtype.element_ty), mask=(cols >= FRAME) & (cols < body_end))
        place, here = _edge_places(segment, body_end, SEGMENT, FRAME)
        in_row = here & (place >= skew) & (place < skew + n_cols)
        tl.store(ptr + start + place, edge.to(ptr.dtype.element_ty), mask=in_row)
    else:
        _store_row(ptr, start, cols, n_cols, inner, value)


@triton.jit
def _load_x(x_ptr, row, n_rows, segment, cols, n_cols, inner, SEGMENT: tl.constexpr, FRAME: tl.constexpr):
    """A segment of x and its edge in the compute dtype (-inf past the last row)."""
    x, edge = _load_stored(x_ptr, row, n_rows, segment, cols, n_cols, inner, -float("inf"), SEGMENT, FRAME)
    if FRAME:
        edge = _compute_dtype(edge)
    return _compute_dtype(x), edge


@triton.jit
def _segment_max_exp(x, edge, FRAME: tl.constexpr):
    """A segment's max, exp(x - max) and its edge's exp(edge - max) (FRAME; else the placeholder)."""
    if FRAME:
        seg_max = tl.maximum(tl.max(x, axis=0), tl.max(edge, axis=0))
        shift = finite_or_zero(seg_max)
        numerator = exp(x - shift)
        edge = exp(edge - shift)
    else:
        seg_max, numerator = _block_max_exp(x)
    return seg_max, numerator, edge


@triton.jit
def _numerators_sum(numerator, edge, FRAME: tl.constexpr):
    """The sum of a segment's numerators, its edge's among them."""
    total = tl.sum(numerator, axis=0)
    if FRAME:
        total += tl.sum(edge, axis=0)
    return total


@triton.jit
def _segments_max_sum_here(x_ptr, row, n_cols, inner, n_segments,
                           SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr, FRAME: tl.constexpr):  # fmt: skip
    """Every segment's (max, sum) of a row, computed by this program: the same
    code on the same blocks as the programs that own them, so the same bits."""
    segments = tl.arange(0, SEGMENTS_BLOCK)
    part_max = tl.full((SEGMENTS_BLOCK,), -float("inf"), tl.float32)
    part_sum = tl.zeros((SEGMENTS_BLOCK,), tl.float32)
    for segment in range(0, n_segments):
        cols = segment * SEGMENT + tl.arange(0, SEGMENT)
        x, edge = _load_x(x_ptr, row, row + 1, segment, cols, n_cols, inner, SEGMENT, FRAME)
        seg_max, numerator, edge = _segment_max_exp(x, edge, FRAME)
        part_max = tl.where(segments == segment, seg_max, part_max)
        part_sum = tl.where(segments == segment, _numerators_sum(numerator, edge, FRAME), part_sum)
    return part_max, part_sum


@triton.jit
def _write_held_segment(x_ptr, y_ptr, words_ptr, row, segment, cols, n_cols, inner, n_segments, max_spins, seg_max,
                        numerator, edge,
                        SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr, FRAME: tl.constexpr):  # fmt: skip
    """Wait for the row's words, combine them and write y's segment from its numerators."""
    words, published = row_words(words_ptr, row, n_segments, max_spins, SEGMENTS_BLOCK)
    if published:
        part_max, part_sum = unpack(words)
    else:
        part_max, part_sum = _segments_max_sum_here(x_ptr, row, n_cols, inner, n_segments, SEGMENT, SEGMENTS_BLOCK,
                                                    FRAME)  # fmt: skip
        # Compute this segment's numerators again rather than keep them in registers through the loop above.
        x, edge = _load_x(x_ptr, row, row + 1, segment, cols, n_cols, inner, SEGMENT, FRAME)
        seg_max, numerator, edge = _segment_max_exp(x, edge, FRAME)
    row_max, row_sum = _combine_partials(part_max, part_sum)
    factor = _rescale(seg_max, row_max, row_sum)
    _store_segment(y_ptr, row, segment, cols, n_cols, inner, numerator * factor, edge * factor, SEGMENT, FRAME)


@triton.jit
def softmax_forward_held_kernel(
    x_ptr, y_ptr, words_ptr, n_rows, n_cols, inner, n_segments, rows_at_once, max_spins,
    SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr, LOAD_NEXT: tl.constexpr, COL_MULTIPLE: tl.constexpr,
    OVERLAPPED: tl.constexpr, FRAME: tl.constexpr,
):
    """Rows held on chip across programs: publish (max, sum) of the segment, wait, write y
    (the plan's PUBLISH_THEN_WAIT).

    The segment's exp(x - segment max), computed for its sum, is kept rather
    than x: after the wait y is that times one factor, exp(segment max - row
    max) / row sum, with no second exp over the segment.  LOAD_NEXT: when the
    next round's segment is loaded (plan.py, Tuning.load_before_partial_segments), to stream in while this
    round works and waits: "before_partial" or "during_wait".  FRAME: rows framed at a 16-byte
    boundary (see above)."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    segment, cols, first_row = program_segment(n_segments, SEGMENT)
    x, edge = _load_x(x_ptr, first_row, n_rows, segment, cols, n_cols, inner, SEGMENT, FRAME)
    wait_for_fill(OVERLAPPED)
    for round in range(0, tl.cdiv(n_rows - first_row, rows_at_once)):
        row = first_row + round * rows_at_once
        next_row = row + rows_at_once
        if LOAD_NEXT == "before_partial":
            x_next, edge_next = _load_x(x_ptr, next_row, n_rows, segment, cols, n_cols, inner, SEGMENT, FRAME)
        seg_max, numerator, edge = _segment_max_exp(x, edge, FRAME)
        publish(words_ptr, partial_at(row, segment, n_segments), pack(seg_max, _numerators_sum(numerator, edge, FRAME)))
        if LOAD_NEXT == "during_wait":
            x_next, edge_next = _load_x(x_ptr, next_row, n_rows, segment, cols, n_cols, inner, SEGMENT, FRAME)
        _write_held_segment(x_ptr, y_ptr, words_ptr, row, segment, cols, n_cols, inner, n_segments, max_spins, seg_max,
                            numerator, edge, SEGMENT, SEGMENTS_BLOCK, FRAME)  # fmt: skip
        x, edge = x_next, edge_next


@triton.jit
def _publish_max_sum(x_ptr, words_ptr, row, n_rows, segment, cols, n_cols, inner, n_segments,
                     OVERLAPPED: tl.constexpr, SEGMENT: tl.constexpr, FRAME: tl.constexpr):  # fmt: skip
    """Load `row`'s segment, publish its (max, sum) word (none past the last row); its max, exp(x - max)
    and its edge's.  OVERLAPPED: this is the kernel's first publish (see wait_for_fill)."""
    x, edge = _load_x(x_ptr, row, n_rows, segment, cols, n_cols, inner, SEGMENT, FRAME)
    seg_max, numerator, edge = _segment_max_exp(x, edge, FRAME)
    wait_for_fill(OVERLAPPED)
    if row < n_rows:
        publish(words_ptr, partial_at(row, segment, n_segments), pack(seg_max, _numerators_sum(numerator, edge, FRAME)))
    return seg_max, numerator, edge


@triton.jit
def softmax_forward_lagged_kernel(
    x_ptr, y_ptr, words_ptr, n_rows, n_cols, inner, n_segments, rows_at_once, max_spins,
    SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr, COL_MULTIPLE: tl.constexpr, OVERLAPPED: tl.constexpr,
    FRAME: tl.constexpr,
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
    seg_max, numerator, edge = _publish_max_sum(x_ptr, words_ptr, first_row, n_rows, segment, cols, n_cols, inner,
                                                n_segments, OVERLAPPED, SEGMENT, FRAME)  # fmt: skip
    for round in range(0, tl.cdiv(n_rows - first_row, rows_at_once)):
        row = first_row + round * rows_at_once
        next_row = row + rows_at_once
        next_max, next_numerator, next_edge = _publish_max_sum(
            x_ptr, words_ptr, next_row, n_rows, segment, cols, n_cols, inner, n_segments, False, SEGMENT, FRAME
        )
        _write_held_segment(x_ptr, y_ptr, words_ptr, row, segment, cols, n_cols, inner, n_segments, max_spins, seg_max,
                            numerator, edge, SEGMENT, SEGMENTS_BLOCK, FRAME)  # fmt: skip
        seg_max, numerator, edge = next_max, next_numerator, next_edge


@triton.jit
def _load_dy_y(dy_ptr, y_ptr, row, n_rows, segment, cols, n_cols, inner, SEGMENT: tl.constexpr, FRAME: tl.constexpr):
    """A segment of dy and of y and their edges, in their storage dtype (zeros past the last row)."""
    dy, dy_edge = _load_stored(dy_ptr, row, n_rows, segment, cols, n_cols, inner, 0.0, SEGMENT, FRAME)
    y, y_edge = _load_stored(y_ptr, row, n_rows, segment, cols, n_cols, inner, 0.0, SEGMENT, FRAME)
    return dy, y, dy_edge, y_edge


@triton.jit
def _dot_here(dy, y, dy_edge, y_edge, FRAME: tl.constexpr):
    """A segment's sum(dy * y), its edge's products among them."""
    dot = _segment_dot(dy, y)
    if FRAME:
        dot += _segment_dot(dy_edge, y_edge)
    return dot


@triton.jit
def _segments_dot_here(dy_ptr, y_ptr, row, n_cols, inner, n_segments,
                       SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr, FRAME: tl.constexpr):  # fmt: skip
    """Every segment's sum(dy * y) of a row, computed by this program (see _segments_max_sum_here)."""
    segments = tl.arange(0, SEGMENTS_BLOCK)
    part_dot = tl.zeros((SEGMENTS_BLOCK,), tl.float32)
    for segment in range(0, n_segments):
        cols = segment * SEGMENT + tl.arange(0, SEGMENT)
        dy, y, dy_edge, y_edge = _load_dy_y(dy_ptr, y_ptr, row, row + 1, segment, cols, n_cols, inner, SEGMENT, FRAME)
        part_dot = tl.where(segments == segment, _dot_here(dy, y, dy_edge, y_edge, FRAME), part_dot)
    return part_dot


@triton.jit
def _publish_dot(dy_ptr, y_ptr, words_ptr, row, n_rows, segment, cols, n_cols, inner, n_segments,
                 OVERLAPPED: tl.constexpr, SEGMENT: tl.constexpr, FRAME: tl.constexpr):  # fmt: skip
    """Load `row`'s segment of dy and y, publish its sum(dy * y) word (none past the last row); dy, y
    and their edges.  OVERLAPPED: this is the kernel's first publish (see wait_for_fill)."""
    dy, y, dy_edge, y_edge = _load_dy_y(dy_ptr, y_ptr, row, n_rows, segment, cols, n_cols, inner, SEGMENT, FRAME)
    wait_for_fill(OVERLAPPED)
    if row < n_rows:
        publish(words_ptr, partial_at(row, segment, n_segments), _pack_dot(_dot_here(dy, y, dy_edge, y_edge, FRAME)))
    return dy, y, dy_edge, y_edge


@triton.jit
def _softmax_gradient(dy, y, dot):
    """dx = y * (dy - dot), from the stored dy and y, in the compute dtype."""
    return _compute_dtype(y) * (_compute_dtype(dy) - dot)


@triton.jit
def softmax_backward_lagged_kernel(
    dy_ptr, y_ptr, dx_ptr, words_ptr, n_rows, n_cols, inner, n_segments, rows_at_once, max_spins,
    SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr, COL_MULTIPLE: tl.constexpr,
    OVERLAPPED: tl.constexpr, FRAME: tl.constexpr,
):
    """Rows held on chip across programs, publishing a round ahead (see
    softmax_forward_lagged_kernel): the next row's sum(dy * y) goes out
    before the wait for this row's words, then dx is written."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    segment, cols, first_row = program_segment(n_segments, SEGMENT)
    dy, y, dy_edge, y_edge = _publish_dot(dy_ptr, y_ptr, words_ptr, first_row, n_rows, segment, cols, n_cols, inner,
                                          n_segments, OVERLAPPED, SEGMENT, FRAME)  # fmt: skip
    for round in range(0, tl.cdiv(n_rows - first_row, rows_at_once)):
        row = first_row + round * rows_at_once
        next_row = row + rows_at_once
        dy_next, y_next, dy_edge_next, y_edge_next = _publish_dot(
            dy_ptr, y_ptr, words_ptr, next_row, n_rows, segment, cols, n_cols, inner, n_segments, False, SEGMENT, FRAME
        )
        words, published = row_words(words_ptr, row, n_segments, max_spins, SEGMENTS_BLOCK)
        if published:
            _, part_dot = unpack(words)
        else:
            part_dot = _segments_dot_here(dy_ptr, y_ptr, row, n_cols, inner, n_segments, SEGMENT, SEGMENTS_BLOCK, FRAME)
            # Read this segment again rather than keep it in registers through the loop above.
            dy, y, dy_edge, y_edge = _load_dy_y(
                dy_ptr, y_ptr, row, row + 1, segment, cols, n_cols, inner, SEGMENT, FRAME
            )
        dot = tl.sum(part_dot, axis=0)
        edge = dy_edge
        if FRAME:
            edge = _softmax_gradient(dy_edge, y_edge, dot)
        _store_segment(dx_ptr, row, segment, cols, n_cols, inner, _softmax_gradient(dy, y, dot), edge, SEGMENT, FRAME)
        dy, y, dy_edge, y_edge = dy_next, y_next, dy_edge_next, y_edge_next
