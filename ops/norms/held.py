"""The norms' backward for rows past a block, held on chip across programs (CUDA).

The protocol is ops/blocks/held_rows.py's; which rows take it, on which setup,
is the norms' plan.

Rows that start off a 16-byte boundary (FRAME, the elements in a 16-byte run,
or 0; ops/blocks/alignment.py) are held in a frame that starts at the boundary
at or before each row: a program's columns `cols` are then places in the
frame, place = column + skew.  A program reads and writes the places of its
segment that hold whole runs of the row (its body) under masks whose bounds
are multiples of FRAME, 16 bytes an access, and the row's two partial runs
that fall in its segment (its edge, a block of 2 FRAME places) apart, element
by element.  A segment that chose between an exact mask and a run mask at run
time spilled: 280 bytes a thread in RMS norm's kernel at its 96 registers
(ptxas, sm_90), against none for the edge apart.  The plan makes rows_at_once
* n_cols a multiple of FRAME, so every row a program takes has its first
row's skew: its places are the same columns each round, and w, dw and db stay
where they were (read and written at place - skew, element by element; w from
L1).  Unframed (FRAME 0) the edge is a placeholder, and the kernels are those
of rows that start on a boundary.
"""


import triton
import triton.language as tl

from ..blocks.alignment import frame_edges, known_multiple, peeled_frame
from ..blocks.held_rows import (
    pack,
    partial_at,
    poll,
    program_segment,
    publish,
    row_words,
    unpack,
    wait_for_fill,
)
from .kernels import _chunk_comoments, _load, _rstd, _widen, _zeros_1d, exact_div

# --------------------------------------------------------------------------
# A segment's places, framed or not.
# --------------------------------------------------------------------------


@triton.jit
def _segment_places(first_row, segment, cols, n_cols, SEGMENT: tl.constexpr, FRAME: tl.constexpr):
    """(skew, body_end, body, edges, edge) of `segment` of the rows of the program whose first row is
    first_row (they share its skew): the row's first element's place, the end of its whole runs, which
    of `cols` are the row's (framed: in its whole runs), the places of its two partial runs ([0, FRAME)
    and [body_end, body_end + FRAME)) and which of those are this segment's and the row's.  Unframed:
    (0, n_cols, cols < n_cols) and placeholders."""
    skew = 0
    body_end = n_cols
    body = cols < n_cols
    edges = 0
    edge = False
    if FRAME:
        _, skew, body_end = peeled_frame(first_row * n_cols, n_cols, FRAME)
        body = (cols >= FRAME) & (cols < body_end)
        edges, in_row = frame_edges(skew, body_end, n_cols, FRAME)
        edge = (edges // SEGMENT == segment) & in_row
    return skew, body_end, body, edges, edge


@triton.jit
def _row_base(row, n_cols, FRAME: tl.constexpr):
    """The element `row`'s places count from: the 16-byte boundary at or before its first element (FRAME)."""
    base = row * n_cols
    if FRAME:
        base = known_multiple(base, FRAME)
    return base


@triton.jit
def _load_places(ptr, row, n_rows, cols, n_cols, body_end, edges, edge, FRAME: tl.constexpr):
    """The row's values at its segment's places, and at its edge (FRAME; else a placeholder), as stored;
    0 outside the row and past the last row.  (A where of two scalars keeps body_end a multiple of
    FRAME, and n_cols its multiple, to the compiler.)"""
    base = _row_base(row, n_cols, FRAME)
    exists = row < n_rows
    values_edge = 0.0
    if FRAME:
        values = tl.load(ptr + base + cols, mask=(cols >= FRAME) & (cols < tl.where(exists, body_end, 0)), other=0.0)
        # (edge & exists, as a comparison: Triton 3.9's interpreter makes a tensor & a scalar mask ints)
        values_edge = tl.load(ptr + base + edges, mask=edge & (edges < tl.where(exists, body_end + FRAME, 0)), other=0.0)
    else:
        values = tl.load(ptr + base + cols, mask=cols < tl.where(exists, n_cols, 0), other=0.0)
    return values, values_edge


@triton.jit
def _load_segment(dy_ptr, x_ptr, row, n_rows, cols, n_cols, body_end, edges, edge, FRAME: tl.constexpr):
    """(x, dy, x's edge, dy's edge) of `row` as stored (see _load_places)."""
    x, x_edge = _load_places(x_ptr, row, n_rows, cols, n_cols, body_end, edges, edge, FRAME)
    dy, dy_edge = _load_places(dy_ptr, row, n_rows, cols, n_cols, body_end, edges, edge, FRAME)
    return x, dy, x_edge, dy_edge


@triton.jit
def _store_places(ptr, row, cols, n_cols, body, edges, edge, values, values_edge, FRAME: tl.constexpr):
    """Write `values` at the row's places `cols` where `body`, and `values_edge` at its edge (FRAME)."""
    base = _row_base(row, n_cols, FRAME)
    tl.store(ptr + base + cols, values.to(ptr.dtype.element_ty), mask=body)
    if FRAME:
        tl.store(ptr + base + edges, values_edge.to(ptr.dtype.element_ty), mask=edge)


@triton.jit
def _weights(w_ptr, cols, skew, body, edges, edge, HAS_WEIGHT: tl.constexpr, FRAME: tl.constexpr):
    """w at a segment's places and at its edge (FRAME), in the compute dtype; 0 without a weight."""
    w = 0.0
    w_edge = 0.0
    if HAS_WEIGHT:
        w = _load(w_ptr + cols - skew, body)
        if FRAME:
            w_edge = _load(w_ptr + edges - skew, edge)
    return w, w_edge


@triton.jit
def _gradient_at_xhat(dy_stored, w, HAS_WEIGHT: tl.constexpr):
    """g = dy * w, in the compute dtype."""
    g = _widen(dy_stored)
    if HAS_WEIGHT:
        g = g * w
    return g


@triton.jit
def _sum_both(values, values_edge, FRAME: tl.constexpr):
    """The sum of a segment's values and of its edge's (FRAME)."""
    total = tl.sum(values, axis=0)
    if FRAME:
        total += tl.sum(values_edge, axis=0)
    return total


# --------------------------------------------------------------------------
# Backward rows past a block, held on chip across programs (CUDA; the protocol:
# ops/blocks/held_rows.py).  A program keeps one segment of x and dy of a row in
# registers, and the dw (and db) accumulator of its segment's columns over all
# the rows it takes.  RMS norm's kernel is further down.
# --------------------------------------------------------------------------


@triton.jit
def _moments_mask(body, FULL: tl.constexpr):
    """Which places lie inside the row, for a segment's moments.  FULL (the row is whole segments,
    never framed): a constant, which the compiler folds away with the selects it feeds (perf notes
    39).  The loads and stores keep their masks: without them the compiler held 16-bit x and dy one
    to a register, and spilled."""
    if FULL:
        body = tl.full(body.shape, True, tl.int1)
    return body


@triton.jit
def _segment_count(segment, skew, n_cols, SEGMENT: tl.constexpr):
    """The row's elements in `segment` (one, or a block of them), float32: 0 in a framed row's
    segment that lies past its end (the grid's segments cover the widest skew)."""
    first = segment * SEGMENT
    count = tl.minimum(skew + n_cols - first, SEGMENT) - tl.maximum(skew - first, 0)
    return tl.maximum(count, 0).to(tl.float32)


@triton.jit
def _segment_moments(x_stored, dy_stored, x_edge, dy_edge, w, w_edge, segment, skew, n_cols, body, edge,
                     SEGMENT: tl.constexpr, HAS_WEIGHT: tl.constexpr, FULL: tl.constexpr, FRAME: tl.constexpr):  # fmt: skip
    """A segment's partial: (mean x, M2 of x) and (mean g, sum((x - mean x) * g)), each a word; a
    segment of none of the row's elements gives zeros (its count, 0, weighs it out of the merge).
    Framed, the segment's body and edge as one chunk: _chunk_comoments' steps over both."""
    count = tl.maximum(_segment_count(segment, skew, n_cols, SEGMENT), 1.0)
    x = _widen(x_stored)
    g = _gradient_at_xhat(dy_stored, w, HAS_WEIGHT)
    if FRAME:
        xe = _widen(x_edge)
        ge = _gradient_at_xhat(dy_edge, w_edge, HAS_WEIGHT)
        mean_x = exact_div(_sum_both(x, xe, FRAME), count)  # corrected as _center corrects a chunk's
        d = tl.where(body, x - mean_x, 0.0)
        de = tl.where(edge, xe - mean_x, 0.0)
        shift = exact_div(_sum_both(d, de, FRAME), count)
        d = tl.where(body, d - shift, 0.0)
        de = tl.where(edge, de - shift, 0.0)
        mean_x += shift
        mean_g = _sum_both(g, ge, FRAME) / count
        m2 = _sum_both(d * d, de * de, FRAME)
        c = _sum_both(d * tl.where(body, g - mean_g, 0.0), de * tl.where(edge, ge - mean_g, 0.0), FRAME)
    else:
        mean_x, mean_g, m2, c = _chunk_comoments(x, g, _moments_mask(body, FULL), count)
    return mean_x, mean_g, m2, c


@triton.jit
def _publish_loaded(x, dy, x_edge, dy_edge, w, w_edge, words_ptr, row, n_rows, segment, skew, n_cols, n_segments,
                    body, edge, SEGMENT: tl.constexpr, HAS_WEIGHT: tl.constexpr, FULL: tl.constexpr,
                    FRAME: tl.constexpr):  # fmt: skip
    """Publish the two words of `row`'s segment, loaded already (nothing past the last row)."""
    if row < n_rows:
        mean_x, mean_g, m2, c = _segment_moments(x, dy, x_edge, dy_edge, w, w_edge, segment, skew, n_cols, body, edge,
                                                 SEGMENT, HAS_WEIGHT, FULL, FRAME)  # fmt: skip
        at = row * (2 * n_segments) + 2 * segment
        publish(words_ptr, at, pack(mean_x, m2))
        publish(words_ptr, at + 1, pack(mean_g, c))


@triton.jit
def _segments_moments_here(dy_ptr, x_ptr, w_ptr, row, n_rows, first_row, n_cols, n_segments,
                           HAS_WEIGHT: tl.constexpr, SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr,
                           FULL: tl.constexpr, FRAME: tl.constexpr):  # fmt: skip
    """Every segment's moments of a row, computed by this program: the same code on the
    same data as the programs that own them, so the same bits."""
    segments = tl.arange(0, SEGMENTS_BLOCK)
    means_x = tl.zeros((SEGMENTS_BLOCK,), tl.float32)
    m2s = means_x
    means_g = means_x
    cs = means_x
    for segment in range(0, n_segments):
        cols = segment * SEGMENT + tl.arange(0, SEGMENT)
        skew, body_end, body, edges, edge = _segment_places(first_row, segment, cols, n_cols, SEGMENT, FRAME)
        x, dy, x_edge, dy_edge = _load_segment(dy_ptr, x_ptr, row, n_rows, cols, n_cols, body_end, edges, edge, FRAME)
        w, w_edge = _weights(w_ptr, cols, skew, body, edges, edge, HAS_WEIGHT, FRAME)
        mean_x, mean_g, m2, c = _segment_moments(x, dy, x_edge, dy_edge, w, w_edge, segment, skew, n_cols, body, edge,
                                                 SEGMENT, HAS_WEIGHT, FULL, FRAME)  # fmt: skip
        here = segments == segment
        means_x = tl.where(here, mean_x, means_x)
        m2s = tl.where(here, m2, m2s)
        means_g = tl.where(here, mean_g, means_g)
        cs = tl.where(here, c, cs)
    return means_x, m2s, means_g, cs


@triton.jit
def layer_norm_backward_held_kernel(
    dy_ptr, x_ptr, w_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, words_ptr, n_rows, n_cols, eps,
    n_segments, rows_at_once, max_spins,
    HAS_WEIGHT: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr,
    SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr, COL_MULTIPLE: tl.constexpr, OVERLAPPED: tl.constexpr,
    ROWS_AHEAD: tl.constexpr = 1, FULL: tl.constexpr = False, FRAME: tl.constexpr = 0,
):  # fmt: skip
    """Layer norm's long rows held on chip across programs, as RMS norm's
    (rms_norm_backward_held_kernel), with a partial of two words a segment: (mean x,
    M2 of x) and (mean g, sum((x - mean x) * g)), merged over the row's segments
    (Chan et al.), so a row whose mean is far from 0 loses nothing to cancellation.
    Words of row r's segment s: r * 2 * n_segments + 2 * s, and the next.
    FULL: the row is whole segments (see _moments_mask); FRAME: see the module docstring."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    segment, cols, first_row = program_segment(n_segments, SEGMENT)
    skew, body_end, body, edges, edge = _segment_places(first_row, segment, cols, n_cols, SEGMENT, FRAME)
    segments = tl.arange(0, SEGMENTS_BLOCK)
    inside = segments < n_segments
    counts = tl.where(inside, _segment_count(segments, skew, n_cols, SEGMENT), 0.0)
    dw_acc = _zeros_1d(x_ptr, SEGMENT)
    db_acc = _zeros_1d(x_ptr, SEGMENT)
    dw_edge = 0.0
    db_edge = 0.0
    if FRAME:
        dw_edge = _zeros_1d(x_ptr, 2 * FRAME)
        db_edge = _zeros_1d(x_ptr, 2 * FRAME)
    w, w_edge = _weights(w_ptr, cols, skew, body, edges, edge, HAS_WEIGHT, FRAME)
    x_stored, dy_stored, x_edge, dy_edge = _load_segment(dy_ptr, x_ptr, first_row, n_rows, cols, n_cols, body_end,
                                                         edges, edge, FRAME)  # fmt: skip
    wait_for_fill(OVERLAPPED)
    _publish_loaded(x_stored, dy_stored, x_edge, dy_edge, w, w_edge, words_ptr, first_row, n_rows, segment, skew,
                    n_cols, n_segments, body, edge, SEGMENT, HAS_WEIGHT, FULL, FRAME)  # fmt: skip
    if ROWS_AHEAD == 2:
        x_next, dy_next, x_next_edge, dy_next_edge = _load_segment(
            dy_ptr, x_ptr, first_row + rows_at_once, n_rows, cols, n_cols, body_end, edges, edge, FRAME
        )
    for round in range(0, tl.cdiv(n_rows - first_row, rows_at_once)):
        row = first_row + round * rows_at_once
        # w again (from L1), for this round's two rows: held across rounds, it cost more than the loads.
        w, w_edge = _weights(w_ptr, cols, skew, body, edges, edge, HAS_WEIGHT, FRAME)
        if ROWS_AHEAD == 2:
            # The round after next is in flight while this one publishes, polls and writes.
            x_after, dy_after, x_after_edge, dy_after_edge = _load_segment(
                dy_ptr, x_ptr, row + 2 * rows_at_once, n_rows, cols, n_cols, body_end, edges, edge, FRAME
            )
        else:
            x_next, dy_next, x_next_edge, dy_next_edge = _load_segment(
                dy_ptr, x_ptr, row + rows_at_once, n_rows, cols, n_cols, body_end, edges, edge, FRAME
            )
        _publish_loaded(x_next, dy_next, x_next_edge, dy_next_edge, w, w_edge, words_ptr, row + rows_at_once, n_rows,
                        segment, skew, n_cols, n_segments, body, edge, SEGMENT, HAS_WEIGHT, FULL, FRAME)  # fmt: skip
        # Both words of every segment in one poll: a second poll would wait a second trip to L2.
        pairs = tl.arange(0, 2 * SEGMENTS_BLOCK)
        words, published = poll(words_ptr + row * (2 * n_segments) + pairs, pairs < 2 * n_segments, max_spins)
        if published:
            words_x, words_g = tl.split(tl.reshape(words, (SEGMENTS_BLOCK, 2)))
            means_x, m2s = unpack(words_x)
            means_g, cs = unpack(words_g)
        else:
            means_x, m2s, means_g, cs = _segments_moments_here(dy_ptr, x_ptr, w_ptr, row, n_rows, first_row, n_cols,
                                                               n_segments, HAS_WEIGHT, SEGMENT, SEGMENTS_BLOCK, FULL,
                                                               FRAME)  # fmt: skip
            # Read this segment again rather than keep it in registers through that loop.
            x_stored, dy_stored, x_edge, dy_edge = _load_segment(dy_ptr, x_ptr, row, n_rows, cols, n_cols, body_end,
                                                                 edges, edge, FRAME)  # fmt: skip
        # The segments' moments merged (Chan et al., over all segments at once),
        # the mean corrected as _center corrects a row's: on a constant row every segment's mean is
        # exact, sum(counts * means) / n need not be, and the correction makes it and the deltas exact.
        mean = exact_div(tl.sum(tl.where(inside, counts * means_x, 0.0), axis=0), n_cols)  # rounded, see _center
        deltas = tl.where(inside, means_x - mean, 0.0)
        shift = exact_div(tl.sum(counts * deltas, axis=0), n_cols)  # one more reduction, of SEGMENTS_BLOCK values
        mean += shift
        deltas = tl.where(inside, deltas - shift, 0.0)
        m2 = tl.sum(tl.where(inside, m2s, 0.0) + counts * deltas * deltas, axis=0)
        mean_g = tl.sum(tl.where(inside, counts * means_g, 0.0), axis=0) / n_cols
        c = tl.sum(tl.where(inside, cs + counts * deltas * means_g, 0.0), axis=0)
        rstd = _rstd(m2, n_cols, eps)
        mean_g_xhat = rstd * c / n_cols
        # (g - mean g - xhat * mean_g_xhat) * rstd, as two fused multiply-adds an element
        xhat = (_widen(x_stored) - mean) * rstd
        dx = _gradient_at_xhat(dy_stored, w, HAS_WEIGHT) * rstd - (xhat * (mean_g_xhat * rstd) + mean_g * rstd)
        xhat_edge = 0.0
        dx_edge = 0.0
        if FRAME:
            xhat_edge = (_widen(x_edge) - mean) * rstd
            g_edge = _gradient_at_xhat(dy_edge, w_edge, HAS_WEIGHT)
            dx_edge = g_edge * rstd - (xhat_edge * (mean_g_xhat * rstd) + mean_g * rstd)
        _store_places(dx_ptr, row, cols, n_cols, body, edges, edge, dx, dx_edge, FRAME)
        if WEIGHT_GRAD:
            dw_acc += tl.where(body, _widen(dy_stored) * xhat, 0.0)
            if FRAME:
                dw_edge += tl.where(edge, _widen(dy_edge) * xhat_edge, 0.0)
        if BIAS_GRAD:
            db_acc += _widen(dy_stored)
            if FRAME:
                db_edge += _widen(dy_edge)
        x_stored, dy_stored, x_edge, dy_edge = x_next, dy_next, x_next_edge, dy_next_edge
        if ROWS_AHEAD == 2:
            x_next, dy_next, x_next_edge, dy_next_edge = x_after, dy_after, x_after_edge, dy_after_edge
    _store_partials(dw_partial_ptr, db_partial_ptr, first_row, cols, skew, n_cols, body, edges, edge, dw_acc, dw_edge,
                    db_acc, db_edge, WEIGHT_GRAD, BIAS_GRAD, FRAME)  # fmt: skip


@triton.jit
def _store_partials(dw_partial_ptr, db_partial_ptr, first_row, cols, skew, n_cols, body, edges, edge, dw_acc, dw_edge,
                    db_acc, db_edge, WEIGHT_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr, FRAME: tl.constexpr):  # fmt: skip
    """The program's dw (and db) accumulators as row first_row of their scratches, at its places' columns."""
    row_start = first_row * n_cols - skew
    if WEIGHT_GRAD:
        tl.store(dw_partial_ptr + row_start + cols, dw_acc, mask=body)
        if FRAME:
            tl.store(dw_partial_ptr + row_start + edges, dw_edge, mask=edge)
    if BIAS_GRAD:
        tl.store(db_partial_ptr + row_start + cols, db_acc, mask=body)
        if FRAME:
            tl.store(db_partial_ptr + row_start + edges, db_edge, mask=edge)


# --------------------------------------------------------------------------
# Backward rows past a block, held on chip across programs (CUDA; the protocol:
# ops/blocks/held_rows.py).  A program keeps one segment of x and dy of a row in
# registers, and the dw accumulator of its segment's columns over all the rows
# it takes.  A segment's partial is one word: (sum(x^2), sum(x * g)).
# --------------------------------------------------------------------------


@triton.jit
def _segment_sums(x_stored, dy_stored, x_edge, dy_edge, w_ptr, cols, skew, body, edges, edge,
                  HAS_WEIGHT: tl.constexpr, FRAME: tl.constexpr):  # fmt: skip
    """A segment's partial: sum(x^2) and sum(x * g) (x and dy are 0 outside the row), w loaded here."""
    w, w_edge = _weights(w_ptr, cols, skew, body, edges, edge, HAS_WEIGHT, FRAME)
    x = _widen(x_stored)
    g = _gradient_at_xhat(dy_stored, w, HAS_WEIGHT)
    xe = 0.0
    ge = 0.0
    if FRAME:
        xe = _widen(x_edge)
        ge = _gradient_at_xhat(dy_edge, w_edge, HAS_WEIGHT)
    return _sum_both(x * x, xe * xe, FRAME), _sum_both(x * g, xe * ge, FRAME)


@triton.jit
def _publish_sums_loaded(x, dy, x_edge, dy_edge, w_ptr, words_ptr, row, n_rows, segment, n_segments, cols, skew, body,
                         edges, edge, HAS_WEIGHT: tl.constexpr, FRAME: tl.constexpr):  # fmt: skip
    """Publish the partial of `row`'s segment, loaded already (nothing past the last row)."""
    if row < n_rows:
        sum_xx, sum_xg = _segment_sums(x, dy, x_edge, dy_edge, w_ptr, cols, skew, body, edges, edge, HAS_WEIGHT, FRAME)
        publish(words_ptr, partial_at(row, segment, n_segments), pack(sum_xx, sum_xg))


@triton.jit
def _segments_sums_here(dy_ptr, x_ptr, w_ptr, row, n_rows, first_row, n_cols, n_segments, HAS_WEIGHT: tl.constexpr,
                        SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr, FRAME: tl.constexpr):  # fmt: skip
    """Every segment's partial of a row, computed by this program: the same code
    on the same data as the programs that own them, so the same bits."""
    segments = tl.arange(0, SEGMENTS_BLOCK)
    sums_xx = tl.zeros((SEGMENTS_BLOCK,), tl.float32)
    sums_xg = sums_xx
    for segment in range(0, n_segments):
        cols = segment * SEGMENT + tl.arange(0, SEGMENT)
        skew, body_end, body, edges, edge = _segment_places(first_row, segment, cols, n_cols, SEGMENT, FRAME)
        x, dy, x_edge, dy_edge = _load_segment(dy_ptr, x_ptr, row, n_rows, cols, n_cols, body_end, edges, edge, FRAME)
        sum_xx, sum_xg = _segment_sums(x, dy, x_edge, dy_edge, w_ptr, cols, skew, body, edges, edge, HAS_WEIGHT, FRAME)
        sums_xx = tl.where(segments == segment, sum_xx, sums_xx)
        sums_xg = tl.where(segments == segment, sum_xg, sums_xg)
    return sums_xx, sums_xg


@triton.jit
def rms_norm_backward_held_kernel(
    dy_ptr, x_ptr, w_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, words_ptr, n_rows, n_cols, eps,
    n_segments, rows_at_once, max_spins,
    HAS_WEIGHT: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr,
    SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr, COL_MULTIPLE: tl.constexpr, OVERLAPPED: tl.constexpr,
    ROWS_AHEAD: tl.constexpr = 1, FRAME: tl.constexpr = 0,
):  # fmt: skip
    """Long rows held on chip across programs, publishing a round ahead: the next
    row's partial goes out before the wait for this row's words, then dx is
    written from the segment in registers, so x and dy are read once.  The
    program's dw accumulator goes out as row `first_row` of the (rows_at_once, N)
    scratch.  ROWS_AHEAD=2 also loads the segment of the row after next at the top of
    a round, so those loads are in flight while the round polls and writes (a third
    segment's registers; see plan.py's HeldNormSetup).  FRAME: see the module docstring.
    (BIAS_GRAD and db_partial_ptr: the signature is layer norm's.)"""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    segment, cols, first_row = program_segment(n_segments, SEGMENT)
    skew, body_end, body, edges, edge = _segment_places(first_row, segment, cols, n_cols, SEGMENT, FRAME)
    inside = tl.arange(0, SEGMENTS_BLOCK) < n_segments  # lanes past the row read as padding words
    dw_acc = _zeros_1d(x_ptr, SEGMENT)
    dw_edge = 0.0
    if FRAME:
        dw_edge = _zeros_1d(x_ptr, 2 * FRAME)
    x_stored, dy_stored, x_edge, dy_edge = _load_segment(dy_ptr, x_ptr, first_row, n_rows, cols, n_cols, body_end,
                                                         edges, edge, FRAME)  # fmt: skip
    wait_for_fill(OVERLAPPED)
    _publish_sums_loaded(x_stored, dy_stored, x_edge, dy_edge, w_ptr, words_ptr, first_row, n_rows, segment,
                         n_segments, cols, skew, body, edges, edge, HAS_WEIGHT, FRAME)  # fmt: skip
    if ROWS_AHEAD == 2:
        x_next, dy_next, x_next_edge, dy_next_edge = _load_segment(
            dy_ptr, x_ptr, first_row + rows_at_once, n_rows, cols, n_cols, body_end, edges, edge, FRAME
        )
    for round in range(0, tl.cdiv(n_rows - first_row, rows_at_once)):
        row = first_row + round * rows_at_once
        if ROWS_AHEAD == 2:
            # The round after next is in flight while this one publishes, polls and writes.
            x_after, dy_after, x_after_edge, dy_after_edge = _load_segment(
                dy_ptr, x_ptr, row + 2 * rows_at_once, n_rows, cols, n_cols, body_end, edges, edge, FRAME
            )
        else:
            x_next, dy_next, x_next_edge, dy_next_edge = _load_segment(
                dy_ptr, x_ptr, row + rows_at_once, n_rows, cols, n_cols, body_end, edges, edge, FRAME
            )
        _publish_sums_loaded(x_next, dy_next, x_next_edge, dy_next_edge, w_ptr, words_ptr, row + rows_at_once, n_rows,
                             segment, n_segments, cols, skew, body, edges, edge, HAS_WEIGHT, FRAME)  # fmt: skip
        words, published = row_words(words_ptr, row, n_segments, max_spins, SEGMENTS_BLOCK)
        if published:
            sums_xx, sums_xg = unpack(words)
        else:
            sums_xx, sums_xg = _segments_sums_here(dy_ptr, x_ptr, w_ptr, row, n_rows, first_row, n_cols, n_segments,
                                                   HAS_WEIGHT, SEGMENT, SEGMENTS_BLOCK, FRAME)  # fmt: skip
            # Read this segment again rather than keep it in registers through that loop.
            x_stored, dy_stored, x_edge, dy_edge = _load_segment(dy_ptr, x_ptr, row, n_rows, cols, n_cols, body_end,
                                                                 edges, edge, FRAME)  # fmt: skip
        rstd = _rstd(tl.sum(tl.where(inside, sums_xx, 0.0), axis=0), n_cols, eps)
        mean_g_xhat = rstd * tl.sum(tl.where(inside, sums_xg, 0.0), axis=0) / n_cols
        w, w_edge = _weights(w_ptr, cols, skew, body, edges, edge, HAS_WEIGHT, FRAME)
        xhat = _widen(x_stored) * rstd
        dx = (_gradient_at_xhat(dy_stored, w, HAS_WEIGHT) - xhat * mean_g_xhat) * rstd
        xhat_edge = 0.0
        dx_edge = 0.0
        if FRAME:
            xhat_edge = _widen(x_edge) * rstd
            dx_edge = (_gradient_at_xhat(dy_edge, w_edge, HAS_WEIGHT) - xhat_edge * mean_g_xhat) * rstd
        _store_places(dx_ptr, row, cols, n_cols, body, edges, edge, dx, dx_edge, FRAME)
        if WEIGHT_GRAD:
            dw_acc += tl.where(body, _widen(dy_stored) * xhat, 0.0)
            if FRAME:
                dw_edge += tl.where(edge, _widen(dy_edge) * xhat_edge, 0.0)
        x_stored, dy_stored, x_edge, dy_edge = x_next, dy_next, x_next_edge, dy_next_edge
        if ROWS_AHEAD == 2:
            x_next, dy_next, x_next_edge, dy_next_edge = x_after, dy_after, x_after_edge, dy_after_edge
    _store_partials(dw_partial_ptr, db_partial_ptr, first_row, cols, skew, n_cols, body, edges, edge, dw_acc, dw_edge,
                    dw_acc, dw_edge, WEIGHT_GRAD, False, FRAME)  # fmt: skip
