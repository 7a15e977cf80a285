"""The norms' backward for rows past a block, held on chip across programs (CUDA).

The protocol is ops/blocks/held_rows.py's; which rows take it, on which setup,
is the norms' plan.
"""


import triton
import triton.language as tl

from ..blocks.alignment import known_multiple
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
# Backward rows past a block, held on chip across programs (CUDA; the protocol:
# ops/blocks/held_rows.py).  A program keeps one segment of x and dy of a row in
# registers, and the dw (and db) accumulator of its segment's columns over all
# the rows it takes.  RMS norm's kernel is further down.
# --------------------------------------------------------------------------


@triton.jit
def _moments_mask(cols, n_cols, FULL: tl.constexpr):
    """Which of `cols` lie inside the row, for a segment's moments.  FULL (the row is whole
    segments): a constant, which the compiler folds away with the selects it feeds (perf
    notes 39).  The loads and stores keep their masks: without them the compiler held 16-bit
    x and dy one to a register, and spilled."""
    if FULL:
        mask = tl.full(cols.shape, True, tl.int1)
    else:
        mask = cols < n_cols
    return mask


@triton.jit
def _load_segment(dy_ptr, x_ptr, row, n_rows, cols, n_cols):
    """The row's columns `cols` of x and dy as stored (0 where masked, and past the last row)."""
    end = tl.where(row < n_rows, n_cols, 0)
    offsets = row * n_cols + cols
    return tl.load(x_ptr + offsets, mask=cols < end, other=0.0), tl.load(dy_ptr + offsets, mask=cols < end, other=0.0)


@triton.jit
def _segment_weight(w_ptr, cols, mask, HAS_WEIGHT: tl.constexpr):
    """w at `cols` in the compute dtype (0 without one).  Layer norm's held kernel loads it once a
    round for the round's two rows; RMS norm's at each use."""
    if HAS_WEIGHT:
        w = _load(w_ptr + cols, mask)
    else:
        w = 0.0
    return w


@triton.jit
def _gradient_at_xhat(dy_stored, w, HAS_WEIGHT: tl.constexpr):
    """g = dy * w, in the compute dtype."""
    g = _widen(dy_stored)
    if HAS_WEIGHT:
        g = g * w
    return g


@triton.jit
def _segment_moments(x_stored, dy_stored, w, segment, cols, n_cols, SEGMENT: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                     FULL: tl.constexpr):  # fmt: skip
    """A segment's partial: (mean x, M2 of x) and (mean g, sum((x - mean x) * g)), each a word."""
    count = tl.minimum(n_cols - segment * SEGMENT, SEGMENT).to(tl.float32)
    g = _gradient_at_xhat(dy_stored, w, HAS_WEIGHT)
    return _chunk_comoments(_widen(x_stored), g, _moments_mask(cols, n_cols, FULL), count)


@triton.jit
def _publish_moments(dy_ptr, x_ptr, w, words_ptr, row, n_rows, segment, cols, n_cols, n_segments,
                     SEGMENT: tl.constexpr, HAS_WEIGHT: tl.constexpr, FULL: tl.constexpr,
                     OVERLAPPED: tl.constexpr):  # fmt: skip
    """Load `row`'s segment of x and dy, publish its two words (nothing past the last row); x and dy as stored.
    OVERLAPPED: this is the kernel's first publish (see wait_for_fill)."""
    x, dy = _load_segment(dy_ptr, x_ptr, row, n_rows, cols, n_cols)
    wait_for_fill(OVERLAPPED)
    _publish_loaded(x, dy, w, words_ptr, row, n_rows, segment, cols, n_cols, n_segments, SEGMENT, HAS_WEIGHT, FULL)
    return x, dy


@triton.jit
def _publish_loaded(x, dy, w, words_ptr, row, n_rows, segment, cols, n_cols, n_segments,
                    SEGMENT: tl.constexpr, HAS_WEIGHT: tl.constexpr, FULL: tl.constexpr):  # fmt: skip
    """Publish the two words of `row`'s segment, loaded already as x and dy (nothing past the last row)."""
    if row < n_rows:
        mean_x, mean_g, m2, c = _segment_moments(x, dy, w, segment, cols, n_cols, SEGMENT, HAS_WEIGHT, FULL)
        at = row * (2 * n_segments) + 2 * segment
        publish(words_ptr, at, pack(mean_x, m2))
        publish(words_ptr, at + 1, pack(mean_g, c))


@triton.jit
def _segments_moments_here(dy_ptr, x_ptr, w_ptr, row, n_rows, n_cols, n_segments, HAS_WEIGHT: tl.constexpr,
                           SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr, FULL: tl.constexpr):  # fmt: skip
    """Every segment's moments of a row, computed by this program: the same code on the
    same data as the programs that own them, so the same bits."""
    segments = tl.arange(0, SEGMENTS_BLOCK)
    means_x = tl.zeros((SEGMENTS_BLOCK,), tl.float32)
    m2s = means_x
    means_g = means_x
    cs = means_x
    for segment in range(0, n_segments):
        cols = segment * SEGMENT + tl.arange(0, SEGMENT)
        x, dy = _load_segment(dy_ptr, x_ptr, row, n_rows, cols, n_cols)
        w = _segment_weight(w_ptr, cols, cols < n_cols, HAS_WEIGHT)
        mean_x, mean_g, m2, c = _segment_moments(x, dy, w, segment, cols, n_cols, SEGMENT, HAS_WEIGHT, FULL)
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
    ROWS_AHEAD: tl.constexpr = 1, FULL: tl.constexpr = False,
):  # fmt: skip
    """Layer norm's long rows held on chip across programs, as RMS norm's
    (rms_norm_backward_held_kernel), with a partial of two words a segment: (mean x,
    M2 of x) and (mean g, sum((x - mean x) * g)), merged over the row's segments as
    _merge_comoments merges chunks, so a row whose mean is far from 0 loses nothing
    to cancellation.  Words of row r's segment s: r * 2 * n_segments + 2 * s, and the next.
    FULL: the row is whole segments (see _moments_mask)."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    segment, cols, first_row = program_segment(n_segments, SEGMENT)
    mask = cols < n_cols
    segments = tl.arange(0, SEGMENTS_BLOCK)
    inside = segments < n_segments
    counts = tl.where(inside, tl.minimum(n_cols - segments * SEGMENT, SEGMENT), 0).to(tl.float32)
    dw_acc = _zeros_1d(x_ptr, SEGMENT)
    db_acc = _zeros_1d(x_ptr, SEGMENT)
    w = _segment_weight(w_ptr, cols, mask, HAS_WEIGHT)
    x_stored, dy_stored = _publish_moments(dy_ptr, x_ptr, w, words_ptr, first_row, n_rows, segment, cols, n_cols,
                                           n_segments, SEGMENT, HAS_WEIGHT, FULL, OVERLAPPED)  # fmt: skip
    if ROWS_AHEAD == 2:
        x_next, dy_next = _load_segment(dy_ptr, x_ptr, first_row + rows_at_once, n_rows, cols, n_cols)
    for round in range(0, tl.cdiv(n_rows - first_row, rows_at_once)):
        row = first_row + round * rows_at_once
        # w again (from L1), for this round's two rows: held across rounds, it cost more than the loads.
        w = _segment_weight(w_ptr, cols, mask, HAS_WEIGHT)
        if ROWS_AHEAD == 2:
            # The round after next is in flight while this one publishes, polls and writes.
            x_after, dy_after = _load_segment(dy_ptr, x_ptr, row + 2 * rows_at_once, n_rows, cols, n_cols)
            _publish_loaded(x_next, dy_next, w, words_ptr, row + rows_at_once, n_rows, segment, cols, n_cols,
                            n_segments, SEGMENT, HAS_WEIGHT, FULL)  # fmt: skip
        else:
            x_next, dy_next = _publish_moments(dy_ptr, x_ptr, w, words_ptr, row + rows_at_once, n_rows, segment,
                                               cols, n_cols, n_segments, SEGMENT, HAS_WEIGHT, FULL, False)  # fmt: skip
        # Both words of every segment in one poll: a second poll would wait a second trip to L2.
        pairs = tl.arange(0, 2 * SEGMENTS_BLOCK)
        words, published = poll(words_ptr + row * (2 * n_segments) + pairs, pairs < 2 * n_segments, max_spins)
        if published:
            words_x, words_g = tl.split(tl.reshape(words, (SEGMENTS_BLOCK, 2)))
            means_x, m2s = unpack(words_x)
            means_g, cs = unpack(words_g)
        else:
            means_x, m2s, means_g, cs = _segments_moments_here(dy_ptr, x_ptr, w_ptr, row, n_rows, n_cols, n_segments,
                                                               HAS_WEIGHT, SEGMENT, SEGMENTS_BLOCK, FULL)  # fmt: skip
            # Read this segment again rather than keep it in registers through that loop.
            x_stored, dy_stored = _load_segment(dy_ptr, x_ptr, row, n_rows, cols, n_cols)
        # The segments' moments merged (Chan et al., as _merge_comoments, over all segments at once),
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
        xhat = (_widen(x_stored) - mean) * rstd
        g = _gradient_at_xhat(dy_stored, w, HAS_WEIGHT)
        # (g - mean g - xhat * mean_g_xhat) * rstd, as two fused multiply-adds an element
        dx = g * rstd - (xhat * (mean_g_xhat * rstd) + mean_g * rstd)
        tl.store(dx_ptr + row * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if WEIGHT_GRAD:
            dw_acc += tl.where(mask, _widen(dy_stored) * xhat, 0.0)
        if BIAS_GRAD:
            db_acc += _widen(dy_stored)
        x_stored, dy_stored = x_next, dy_next
        if ROWS_AHEAD == 2:
            x_next, dy_next = x_after, dy_after
    if WEIGHT_GRAD:
        tl.store(dw_partial_ptr + first_row * n_cols + cols, dw_acc, mask=mask)
    if BIAS_GRAD:
        tl.store(db_partial_ptr + first_row * n_cols + cols, db_acc, mask=mask)


# --------------------------------------------------------------------------
# Backward rows past a block, held on chip across programs (CUDA; the protocol:
# ops/blocks/held_rows.py).  A program keeps one segment of x and dy of a row in
# registers, and the dw accumulator of its segment's columns over all the rows
# it takes.  A segment's partial is one word: (sum(x^2), sum(x * g)).
# --------------------------------------------------------------------------


@triton.jit
def _segment_sums(x_stored, dy_stored, w_ptr, cols, n_cols, HAS_WEIGHT: tl.constexpr):
    """A segment's partial: sum(x^2) and sum(x * g)."""
    x = _widen(x_stored)
    g = _gradient_at_xhat(dy_stored, _segment_weight(w_ptr, cols, cols < n_cols, HAS_WEIGHT), HAS_WEIGHT)
    return tl.sum(x * x, axis=0), tl.sum(x * g, axis=0)


@triton.jit
def _publish_sums(dy_ptr, x_ptr, w_ptr, words_ptr, row, n_rows, segment, cols, n_cols, n_segments,
                  HAS_WEIGHT: tl.constexpr, OVERLAPPED: tl.constexpr):  # fmt: skip
    """Load `row`'s segment of x and dy, publish its partial (nothing past the last row); x and dy as stored.
    OVERLAPPED: this is the kernel's first publish (see wait_for_fill)."""
    x, dy = _load_segment(dy_ptr, x_ptr, row, n_rows, cols, n_cols)
    wait_for_fill(OVERLAPPED)
    _publish_sums_loaded(x, dy, w_ptr, words_ptr, row, n_rows, segment, cols, n_cols, n_segments, HAS_WEIGHT)
    return x, dy


@triton.jit
def _publish_sums_loaded(x, dy, w_ptr, words_ptr, row, n_rows, segment, cols, n_cols, n_segments,
                    HAS_WEIGHT: tl.constexpr):  # fmt: skip
    """Publish the partial of `row`'s segment, loaded already as x and dy (nothing past the last row)."""
    if row < n_rows:
        sum_xx, sum_xg = _segment_sums(x, dy, w_ptr, cols, n_cols, HAS_WEIGHT)
        publish(words_ptr, partial_at(row, segment, n_segments), pack(sum_xx, sum_xg))


@triton.jit
def _segments_sums_here(dy_ptr, x_ptr, w_ptr, row, n_rows, n_cols, n_segments, HAS_WEIGHT: tl.constexpr,
                        SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr):  # fmt: skip
    """Every segment's partial of a row, computed by this program: the same code
    on the same data as the programs that own them, so the same bits."""
    segments = tl.arange(0, SEGMENTS_BLOCK)
    sums_xx = tl.zeros((SEGMENTS_BLOCK,), tl.float32)
    sums_xg = sums_xx
    for segment in range(0, n_segments):
        cols = segment * SEGMENT + tl.arange(0, SEGMENT)
        x, dy = _load_segment(dy_ptr, x_ptr, row, n_rows, cols, n_cols)
        sum_xx, sum_xg = _segment_sums(x, dy, w_ptr, cols, n_cols, HAS_WEIGHT)
        sums_xx = tl.where(segments == segment, sum_xx, sums_xx)
        sums_xg = tl.where(segments == segment, sum_xg, sums_xg)
    return sums_xx, sums_xg


@triton.jit
def rms_norm_backward_held_kernel(
    dy_ptr, x_ptr, w_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, words_ptr, n_rows, n_cols, eps,
    n_segments, rows_at_once, max_spins,
    HAS_WEIGHT: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr,
    SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr, COL_MULTIPLE: tl.constexpr, OVERLAPPED: tl.constexpr,
    ROWS_AHEAD: tl.constexpr = 1,
):  # fmt: skip
    """Long rows held on chip across programs, publishing a round ahead: the next
    row's partial goes out before the wait for this row's words, then dx is
    written from the segment in registers, so x and dy are read once.  The
    program's dw accumulator goes out as row `first_row` of the (rows_at_once, N)
    scratch.  ROWS_AHEAD=2 also loads the segment of the row after next at the top of
    a round, so those loads are in flight while the round polls and writes (a third
    segment's registers; see plan.py's HeldNormSetup).  (BIAS_GRAD and db_partial_ptr: the signature
    is layer norm's.)"""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    segment, cols, first_row = program_segment(n_segments, SEGMENT)
    mask = cols < n_cols
    inside = tl.arange(0, SEGMENTS_BLOCK) < n_segments  # lanes past the row read as padding words
    dw_acc = _zeros_1d(x_ptr, SEGMENT)
    x_stored, dy_stored = _publish_sums(dy_ptr, x_ptr, w_ptr, words_ptr, first_row, n_rows, segment, cols, n_cols,
                                        n_segments, HAS_WEIGHT, OVERLAPPED)  # fmt: skip
    if ROWS_AHEAD == 2:
        x_next, dy_next = _load_segment(dy_ptr, x_ptr, first_row + rows_at_once, n_rows, cols, n_cols)
    for round in range(0, tl.cdiv(n_rows - first_row, rows_at_once)):
        row = first_row + round * rows_at_once
        if ROWS_AHEAD == 2:
            # The round after next is in flight while this one publishes, polls and writes.
            x_after, dy_after = _load_segment(dy_ptr, x_ptr, row + 2 * rows_at_once, n_rows, cols, n_cols)
            _publish_sums_loaded(x_next, dy_next, w_ptr, words_ptr, row + rows_at_once, n_rows, segment, cols, n_cols,
                            n_segments, HAS_WEIGHT)  # fmt: skip
        else:
            x_next, dy_next = _publish_sums(dy_ptr, x_ptr, w_ptr, words_ptr, row + rows_at_once, n_rows, segment,
                                            cols, n_cols, n_segments, HAS_WEIGHT, False)  # fmt: skip
        words, published = row_words(words_ptr, row, n_segments, max_spins, SEGMENTS_BLOCK)
        if published:
            sums_xx, sums_xg = unpack(words)
        else:
            sums_xx, sums_xg = _segments_sums_here(dy_ptr, x_ptr, w_ptr, row, n_rows, n_cols, n_segments, HAS_WEIGHT,
                                                   SEGMENT, SEGMENTS_BLOCK)  # fmt: skip
            # Read this segment again rather than keep it in registers through that loop.
            x_stored, dy_stored = _load_segment(dy_ptr, x_ptr, row, n_rows, cols, n_cols)
        rstd = _rstd(tl.sum(tl.where(inside, sums_xx, 0.0), axis=0), n_cols, eps)
        mean_g_xhat = rstd * tl.sum(tl.where(inside, sums_xg, 0.0), axis=0) / n_cols
        xhat = _widen(x_stored) * rstd
        g = _gradient_at_xhat(dy_stored, _segment_weight(w_ptr, cols, mask, HAS_WEIGHT), HAS_WEIGHT)
        dx = (g - xhat * mean_g_xhat) * rstd
        tl.store(dx_ptr + row * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if WEIGHT_GRAD:
            dw_acc += tl.where(mask, _widen(dy_stored) * xhat, 0.0)
        x_stored, dy_stored = x_next, dy_next
        if ROWS_AHEAD == 2:
            x_next, dy_next = x_after, dy_after
    if WEIGHT_GRAD:
        tl.store(dw_partial_ptr + first_row * n_cols + cols, dw_acc, mask=mask)
