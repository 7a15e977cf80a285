"""The norms' Triton kernels that read rows from memory on their own (see plan.py for the designs).

The kernel bodies take CENTERED: on for layer norm, off for RMS norm (no
centering, no bias, no mean(g) term).  Each op launches them through thin
kernels of its own name that fix the flag, at the end of this file.
"""


import triton
import triton.language as tl

from ..blocks.alignment import frame_edges, known_multiple, peeled_frame

# --------------------------------------------------------------------------
# Pieces shared by the kernels.
# --------------------------------------------------------------------------


@triton.jit
def _load(ptrs, mask):
    """Values at `ptrs` (0 where masked) in the compute dtype: float32, or float64 for float64."""
    return _widen(tl.load(ptrs, mask=mask, other=0.0))


@triton.jit
def _widen(x):
    """x in the compute dtype: float32, or float64 for float64."""
    if x.dtype != tl.float64:  # resolved at compile time
        x = x.to(tl.float32)
    return x


@triton.jit
def _zeros_2d(like_ptr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A (BLOCK_M, BLOCK_N) accumulator in the compute dtype of `like_ptr`'s elements."""
    if like_ptr.dtype.element_ty == tl.float64:
        zeros = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
    else:
        zeros = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    return zeros


@triton.jit
def _zeros_1d(like_ptr, BLOCK_N: tl.constexpr):
    """The same, (BLOCK_N,)."""
    if like_ptr.dtype.element_ty == tl.float64:
        zeros = tl.zeros((BLOCK_N,), dtype=tl.float64)
    else:
        zeros = tl.zeros((BLOCK_N,), dtype=tl.float32)
    return zeros


@triton.jit
def _rstd(m2, n_cols, eps):
    """1 / sqrt(var + eps) from M2 = sum((x - mean)^2) (sum(x^2) for RMS norm),
    in M2's dtype.  eps arrives as a float32 scalar from Triton's launcher (its
    type for a Python float), but as a float64 one from Inductor's generated
    code: the cast keeps a loop's accumulators from turning float64.  For
    float64 inputs on CUDA eps is thus rounded to float32 (a relative 3e-8 of
    eps, visible only on rows whose mean square is near eps)."""
    return (1.0 / tl.sqrt(m2 / n_cols + eps)).to(m2.dtype)


@triton.jit
def _load_affine(w_ptr, b_ptr, cols, mask, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, EVICTION: tl.constexpr):
    """(w, b) at `cols` (where `mask`) in the compute dtype, loaded with `EVICTION` ("" for the
    default, "evict_last" to keep them in L2 for the other programs); 0 stands in for one that is
    absent, and the flags keep it unused."""
    w = 0.0
    b = 0.0
    if HAS_WEIGHT:
        w = _widen(tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy=EVICTION))
    if HAS_BIAS:
        b = _widen(tl.load(b_ptr + cols, mask=mask, other=0.0, eviction_policy=EVICTION))
    return w, b


@triton.jit
def _affine(xhat, w, b, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """xhat * w + b, for the w and b that are there."""
    y = xhat
    if HAS_WEIGHT:
        y = y * w
    if HAS_BIAS:
        y = y + b
    return y


@triton.jit
def _scale_shift(xhat, w_ptr, b_ptr, cols, mask, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """xhat * w + b, w and b loaded now at `cols` (where `mask`): a chunk of one row."""
    w, b = _load_affine(w_ptr, b_ptr, cols, mask, HAS_WEIGHT, HAS_BIAS, "")
    return _affine(xhat, w, b, HAS_WEIGHT, HAS_BIAS)


@triton.jit
def exact_div(total, count):
    """total / count rounded to nearest.  Triton's `/` of float32 is on CUDA the approximate
    div.full.f32 (up to 2 ulp off), which undid the exactness of the correction below on the GPU
    (the interpreter divides exactly); count (an int or a float) is taken in total's dtype."""
    if total.dtype == tl.float64:  # resolved at compile time: float64's `/` is div.rn.f64 already
        quotient = total / count
    else:
        quotient = tl.math.div_rn(total, tl.zeros_like(total) + count)
    return quotient


@triton.jit
def _center(x, mask, count, AXIS: tl.constexpr):
    """(x - mean, mean) along AXIS (1: the rows of a tile; 0: a chunk of one row), x - mean
    0 where masked, in the corrected two-pass form: mean = sum(x) / n, d = x - mean, then
    the sum of d (0 but for rounding) moves the mean by sum(d) / n and is taken out of d.

    On a row of one value c, sum(x) / n can miss c by an ulp, which rstd magnifies (and a
    weight of inf turns into inf where PyTorch's exact Welford mean gives 0 * inf = NaN).
    d = c - mean is then one value in every lane, exact (Sterbenz), so sum(d) / n gives it
    back exactly: the mean comes out as c and d as exactly 0.  The cost: one more
    reduction of values already in registers, no memory traffic.

    Both divisions round (exact_div): the approximate one is a reciprocal and a multiply,
    which the GPU's compiler fused with x - mean into one FMA, so d was c minus the unrounded
    product, a value whose n copies no longer sum exactly (on an H100, rows of 1000 copies
    of 0.9 left x - mean at -2**-47)."""
    mean = exact_div(tl.sum(x, axis=AXIS), count)
    if AXIS == 1:
        mean = mean[:, None]
    centered = tl.where(mask, x - mean, 0.0)
    shift = exact_div(tl.sum(centered, axis=AXIS), count)
    if AXIS == 1:
        shift = shift[:, None]
    return tl.where(mask, centered - shift, 0.0), mean + shift


@triton.jit
def _standardize(x, mask, n_cols, eps, CENTERED: tl.constexpr):
    """(xhat, rstd) of a (BLOCK_M, BLOCK_N) tile of whole rows, reduced in registers (the backward's).

    Padding lanes of x are 0 and stay 0 after centering, so they add nothing
    to the sums.  The whole row is at hand, so the variance takes the
    two-pass form: the mean first (corrected, see _center), then the squares
    of x - mean."""
    if CENTERED:
        # M2 from the corrected x - mean, exactly 0 on a constant row (the uncorrected
        # sum(d * d) - sum(d)^2 / n need not cancel to 0 under rounding, and can go negative).
        x, _ = _center(x, mask, n_cols, 1)
    rstd = _rstd(tl.sum(x * x, axis=1), n_cols, eps)
    return x * rstd[:, None], rstd


@triton.jit
def _standardize_pivoted(x, pivot, mask, n_cols, eps, CENTERED: tl.constexpr):
    """_standardize for the forward: the row shifted by its pivot, its first value ((BLOCK_M, 1), from
    _pivots; layer norm only), instead of _center's correction: s = x - pivot, mean(s), then the squares
    of d = s - mean(s).

    On a row of one value c, s is exactly 0, so d is exactly 0 and y exactly the
    bias, as PyTorch's Welford mean gives (a mean computed as sum(x) / n can miss c
    by an ulp, which rstd magnifies: a weight of inf then gave inf where PyTorch
    gives 0 * inf = NaN).  The shift also moves the data near 0, where the two-pass
    form is at its best.  It costs a subtraction an element and a load that hits
    x's first cache line; _center's correction costs a reduction more on the row's
    critical path, and at hidden sizes, where a program's row is latency-bound,
    that took 15-30% of the forward (perf-notes, version 53).

    Taken for 16-bit x only (the plan's PIVOT_MEAN): there x - pivot is exact in
    float32 unless the two are 2**13 (float16) or 2**16 (bfloat16) apart in
    magnitude.  A float32 x - pivot rounds at the pivot's scale, an error of up to
    eps |pivot - mean| / std in xhat, eps sqrt(n) where the pivot is an outlier
    (4e-6 at 8192 columns against _center's 3e-8): float32 and float64 keep
    _center.  The backward takes no pivot: loaded ahead with the next tile, it took
    the bfloat16 tile from 124 to 163 registers (version 45); its tiles of 16-bit x
    and dy take the plain mean where they sum as one reduction (_backward_row_sums,
    plan.py's _backward_row_sums)."""
    if CENTERED:
        x = tl.where(mask, x - pivot, 0.0)
        mean = exact_div(tl.sum(x, axis=1), n_cols)
        x = tl.where(mask, x - mean[:, None], 0.0)
    rstd = _rstd(tl.sum(x * x, axis=1), n_cols, eps)
    return x * rstd[:, None], rstd


@triton.jit
def _standardize_plain(x, mask, n_cols, eps, CENTERED: tl.constexpr):
    """_standardize for the forward of 16-bit rows of at most 8192 columns (the plan's PLAIN_MEAN): the plain
    two-pass form, mean = sum(x) / n (rounded once, exact_div), then the squares of x - mean; no correction
    and no pivot.  Inductor's form with a rounded division: one load and one subtraction an element fewer
    than the pivot's (perf-notes version 58).

    Exact on constant rows, the case _center's correction and the pivot exist for.  A 16-bit value has at
    most 11 significant bits (float16; 8 for bfloat16), so k copies of it, k <= 2**13, sum exactly in
    float32's 24: a row of one value c sums to n c, n c / n rounds to c, x - mean is exactly 0 and y exactly
    the bias (an approximate `/` missed c by an ulp, perf-notes version 45).  Where n c passes float32's
    range (bfloat16 values above 3.4e38 / n) the sum is taken again of x * 2**-16, exact for values that
    large, and the mean scaled back (_row_means).

    Less accurate than the pivot where a row's mean is far larger than its spread: the mean's one rounding
    (half an ulp of float32 at the mean) shifts every x - mean, and rstd magnifies it.  On a float16 row of
    5479 values of 1023.5 and one of 1024 the error is 4.5e-3 of y, where the pivot gave 4e-4 and PyTorch's
    own float16 layer norm (CPU) 4.7e-3: the accuracy of PyTorch's and Inductor's kernels, not the pivot's."""
    if CENTERED:
        mean = _row_means(x, n_cols)
        x = tl.where(mask, x - mean[:, None], 0.0)
    rstd = _rstd(tl.sum(x * x, axis=1), n_cols, eps)
    return x * rstd[:, None], rstd


@triton.jit
def _row_means(x, n_cols):
    """sum(x) / n of each row of a tile, rounded once; a row whose sum overflows float32 is summed again as
    x * 2**-16 (exact for its large values; its small ones add nothing at that scale) and the mean scaled
    back, so a constant row of huge values still gives its value back.  The second sum runs only in a tile
    that has such a row."""
    total = tl.sum(x, axis=1)
    scale = tl.zeros_like(total) + 1.0
    overflowed = tl.abs(total) == float("inf")
    if tl.max(overflowed.to(tl.int32), axis=0) > 0:
        total = tl.where(overflowed, tl.sum(x * (1.0 / 65536.0), axis=1), total)
        scale = tl.where(overflowed, 65536.0, scale)
    return exact_div(total, n_cols) * scale  # (times 1 or 2**16: exact)


@triton.jit
def _pivots(ptr, rows, n_rows, n_cols, CENTERED: tl.constexpr):
    """Each row's first value, (BLOCK_M, 1) in the compute dtype: _standardize_pivoted's shift (0 for RMS
    norm, which does not shift and loads nothing)."""
    if CENTERED:
        pivot = _load(ptr + rows * n_cols, rows < n_rows)
    else:
        pivot = 0.0
    return pivot


# Long rows: the statistics from a sweep of per-lane sums about a pivot, and a second where the first cancels
# (_pivoted_moments; plan.py's docstring, LONG_ROWS).


@triton.jit
def _chunk_at(first, n_cols, BLOCK_N: tl.constexpr):
    """Columns [first, first + BLOCK_N) of a row, the mask of those inside it, and their count."""
    cols = first + tl.arange(0, BLOCK_N)
    return cols, cols < n_cols, tl.minimum(n_cols - first, BLOCK_N)


@triton.jit
def _places_at(first, end, BLOCK_N: tl.constexpr, LOW: tl.constexpr):
    """Places [first, first + BLOCK_N) of a row and the mask of those before `end` and at or past LOW (0: all).
    Framed (LOW = FRAME, `end` a multiple of it), the mask's bounds are whole runs: 16 bytes an access."""
    places = first + tl.arange(0, BLOCK_N)
    mask = places < end
    if LOW:
        mask = mask & (places >= LOW)
    return places, mask


@triton.jit
def _chunk_comoments(x, g, mask, count):
    """(mean x, mean g, M2 of x, co-moment sum((x - mean x) * (g - mean g))) of one chunk;
    mean x and x - mean x as _center takes them (exact on a constant chunk).  The held rows' segments."""
    dx, mean_x = _center(x, mask, count, 0)
    mean_g = tl.sum(g, axis=0) / count
    dg = tl.where(mask, g - mean_g, 0.0)
    return mean_x, mean_g, tl.sum(dx * dx, axis=0), tl.sum(dx * dg, axis=0)


@triton.jit
def _load_g(dy_ptr, w_ptr, cols, mask, HAS_WEIGHT: tl.constexpr):
    """g = dy * w, the gradient reaching xhat; and dy itself."""
    dy = _load(dy_ptr + cols, mask)
    g = dy
    if HAS_WEIGHT:
        g = dy * _load(w_ptr + cols, mask)
    return g, dy


@triton.jit
def _row_moments(x_ptr, dy_ptr, w_ptr, n_cols, CENTERED: tl.constexpr, GRAD: tl.constexpr, HAS_WEIGHT: tl.constexpr,
              BLOCK_N: tl.constexpr):  # fmt: skip
    """_pivoted_moments of the row at x_ptr (and dy_ptr): its first chunk, then the others."""
    cols, mask, count = _chunk_at(0, n_cols, BLOCK_N)
    return _pivoted_moments(x_ptr, dy_ptr, w_ptr, cols, mask, count, BLOCK_N, n_cols, n_cols, 0, CENTERED, GRAD,
                            HAS_WEIGHT, BLOCK_N)  # fmt: skip


@triton.jit
def _framed_row_moments(x_ptr, dy_ptr, w_ptr, skew, body_end, n_cols, CENTERED: tl.constexpr, GRAD: tl.constexpr,
                     HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr, FRAME: tl.constexpr):  # fmt: skip
    """_row_moments of the framed row whose frame starts at x_ptr (and dy_ptr; w_ptr the copy of w shifted by
    the row's skew, place p: column p - skew): the two partial runs first (they hold the row's first
    element, so they count at least one), then the whole runs chunk by chunk."""
    edges, in_row = frame_edges(skew, body_end, n_cols, FRAME)
    count = tl.sum(in_row.to(tl.int32), axis=0)
    return _pivoted_moments(x_ptr, dy_ptr, w_ptr, edges, in_row, count, 0, body_end, n_cols, FRAME, CENTERED, GRAD,
                            HAS_WEIGHT, BLOCK_N)  # fmt: skip


@triton.jit
def _pivoted_moments(x_ptr, dy_ptr, w_ptr, first_places, first_mask, first_count, start, end, n_cols,
                     LOW: tl.constexpr, CENTERED: tl.constexpr, GRAD: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                     BLOCK_N: tl.constexpr):  # fmt: skip
    """(mean x, mean g, M2 of x, sum((x - mean x) * g)) of a row of n_cols columns: its first block of places
    (at least one in the mask), then its places [start, end) at or past LOW (0: all), BLOCK_N at a time.
    Without GRAD, g is 0 (the forward).  Uncentered (RMS norm): (0, 0, sum(x^2), sum(x * g)).

    Layer norm sums d = x - p, d^2, g and d * g about a pivot p in one sweep (_pivoted_sums), and takes,
    with mean d = sum d / n,
        mean x = p + mean d,  M2 = sum d^2 - mean d * sum d,  sum((x - mean x) g) = sum d g - mean d * sum g.
    p is the first block's mean (_center's, exact on a constant block): on a constant row every d is
    exactly 0, and so are M2 and the co-moment.  M2 cancels where the row's mean is far from p next to its
    spread: where it comes out below 1/16 of sum d^2 (p more than 4 standard deviations off, a row whose
    first block is unlike the rest), or not a number (the sums overflowed), the row is swept again about
    the mean just found, so M2 loses at most 4 bits whatever the row (float32 errors of up to 1e-6 of y
    with p 3-4 standard deviations off, against 1e-7 with Chan's merge).  This replaced Chan's merge of
    per-chunk moments, which cost three reductions across the program's warps a chunk and ran layer norm's
    statistics sweep at 2/3 of RMS norm's rate on the same bytes (perf-notes, versions 57 and 59)."""
    pivot = 0.0
    if CENTERED:
        x = _load(x_ptr + first_places, first_mask)
        pivot = _center(x, first_mask, first_count.to(x.dtype), 0)[1]
    sum_d, sum_dd, sum_g, sum_dg = _pivoted_sums(x_ptr, dy_ptr, w_ptr, pivot, first_places, first_mask, start, end,
                                                 LOW, CENTERED, GRAD, HAS_WEIGHT, BLOCK_N)  # fmt: skip
    mean_x = 0.0
    mean_g = 0.0
    m2 = sum_dd
    comoment = sum_dg
    if CENTERED:
        mean_d = exact_div(sum_d, n_cols)
        # (never on a constant row, 0 >= 0; written so that a NaN M2 sweeps again: sums about a pivot far off
        # can overflow where M2 about the mean does not, and a row holding an infinity stays NaN either way)
        if not (16 * (sum_dd - mean_d * sum_d) >= sum_dd):
            pivot += mean_d
            sum_d, sum_dd, sum_g, sum_dg = _pivoted_sums(x_ptr, dy_ptr, w_ptr, pivot, first_places, first_mask,
                                                         start, end, LOW, CENTERED, GRAD, HAS_WEIGHT,
                                                         BLOCK_N)  # fmt: skip
            mean_d = exact_div(sum_d, n_cols)
        mean_x = pivot + mean_d
        mean_g = exact_div(sum_g, n_cols)
        m2 = sum_dd - mean_d * sum_d
        # Rounding may leave a spread of ~0 below 0.  (tl.where, not tl.maximum, whose max.f32 would turn the
        # NaN of a row holding an infinity into 0 and its y into infinities where PyTorch gives NaN.)
        m2 = tl.where(m2 < 0.0, 0.0, m2)
        comoment = sum_dg - mean_d * sum_g
    return mean_x, mean_g, m2, comoment


@triton.jit
def _pivoted_sums(x_ptr, dy_ptr, w_ptr, pivot, first_places, first_mask, start, end, LOW: tl.constexpr,
                  CENTERED: tl.constexpr, GRAD: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                  BLOCK_N: tl.constexpr):  # fmt: skip
    """(sum d, sum d^2, sum g, sum d * g) over a row's first block of places and its places [start, end) at or
    past LOW: d = x - pivot (x for RMS norm, whose sum d is then unused), g = dy * w (0 without GRAD).
    Through the sweep each lane keeps its own sums, reduced across the program once at the end: a chunk
    costs its loads and four FMAs an element, and no warp waits on another's."""
    d, g = _shifted_block(x_ptr, dy_ptr, w_ptr, pivot, first_places, first_mask, CENTERED, GRAD, HAS_WEIGHT)
    first_d, first_dd = tl.sum(d, axis=0), tl.sum(d * d, axis=0)
    first_g, first_dg = tl.sum(g, axis=0), tl.sum(d * g, axis=0)
    acc_d = _zeros_1d(x_ptr, BLOCK_N)
    acc_dd = _zeros_1d(x_ptr, BLOCK_N)
    acc_g = _zeros_1d(x_ptr, BLOCK_N)
    acc_dg = _zeros_1d(x_ptr, BLOCK_N)
    for first in range(start, end, BLOCK_N):
        places, mask = _places_at(first, end, BLOCK_N, LOW)
        # (names of their own: a loop may not change the shape of a variable from before it)
        d_chunk, g_chunk = _shifted_block(x_ptr, dy_ptr, w_ptr, pivot, places, mask, CENTERED, GRAD, HAS_WEIGHT)
        acc_d += d_chunk
        acc_dd += d_chunk * d_chunk
        if GRAD:
            acc_g += g_chunk
            acc_dg += d_chunk * g_chunk
    return (
        first_d + tl.sum(acc_d, axis=0), first_dd + tl.sum(acc_dd, axis=0),
        first_g + tl.sum(acc_g, axis=0), first_dg + tl.sum(acc_dg, axis=0),
    )  # fmt: skip


@triton.jit
def _shifted_block(x_ptr, dy_ptr, w_ptr, pivot, places, mask, CENTERED: tl.constexpr, GRAD: tl.constexpr,
                   HAS_WEIGHT: tl.constexpr):  # fmt: skip
    """(d, g) at `places`, 0 where masked: d = x - pivot (x uncentered), g = dy * w (0 without GRAD, and
    nothing loaded for it)."""
    d = _load(x_ptr + places, mask)
    if CENTERED:
        d = tl.where(mask, d - pivot, 0.0)
    g = tl.zeros_like(d)
    if GRAD:
        g = _load_g(dy_ptr, w_ptr, places, mask, HAS_WEIGHT)[0]
    return d, g


# --------------------------------------------------------------------------
# The kernels' bodies, for either op (CENTERED: layer norm; not: RMS norm).
# Every op launches them through thin kernels that fix CENTERED, with one
# signature for both ops (RMS norm passes HAS_BIAS=False, BIAS_GRAD=False).
# --------------------------------------------------------------------------


@triton.jit
def normalize_rows(
    x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps,
    CENTERED: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, COL_MULTIPLE: tl.constexpr, AFFINE_FIRST: tl.constexpr,
    PIVOTED: tl.constexpr, PLAIN: tl.constexpr,
):  # fmt: skip
    """Short rows: a tile of BLOCK_M whole rows per program, one read and one write.
    AFFINE_FIRST: w and b are loaded beside x, their latency hidden under x's, rather
    than after the reductions (where they wait in the tile's critical path but take
    no registers during the reductions).  PIVOTED: layer norm's rows shifted by their
    pivots (_standardize_pivoted); PLAIN: their plain two-pass mean (_standardize_plain);
    neither: centered by _center."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    # int64 rows: row * n_cols passes 2**31 on tensors of 2**31+ elements.
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    cols = tl.arange(0, BLOCK_N)[None, :]
    mask = (rows < n_rows) & (cols < n_cols)  # the last tile and every row's end hang over
    offsets = rows * n_cols + cols
    if AFFINE_FIRST:
        w, b = _load_affine(w_ptr, b_ptr, cols, cols < n_cols, HAS_WEIGHT, HAS_BIAS, "evict_last")
    x = _load(x_ptr + offsets, mask)
    if PLAIN:
        xhat, _ = _standardize_plain(x, mask, n_cols, eps, CENTERED)
    elif PIVOTED:
        pivot = _pivots(x_ptr, rows, n_rows, n_cols, CENTERED)
        xhat, _ = _standardize_pivoted(x, pivot, mask, n_cols, eps, CENTERED)
    else:
        xhat, _ = _standardize(x, mask, n_cols, eps, CENTERED)
    if not AFFINE_FIRST:
        w, b = _load_affine(w_ptr, b_ptr, cols, cols < n_cols, HAS_WEIGHT, HAS_BIAS, "")
    y = _affine(xhat, w, b, HAS_WEIGHT, HAS_BIAS)
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def normalize_long_rows(
    x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps,
    CENTERED: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, COL_MULTIPLE: tl.constexpr, FRAME: tl.constexpr,
):  # fmt: skip
    """Long rows: one program per row; a sweep for the statistics, a sweep to write.
    (BLOCK_M is 1 and n_rows unused: the signature is normalize_rows' less AFFINE_FIRST.)
    FRAME (the elements in a 16-byte run, or 0): the row starts off a 16-byte boundary and
    is swept from the boundary before it (_normalize_framed_row)."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    start = tl.program_id(0).to(tl.int64) * n_cols
    if FRAME:
        _normalize_framed_row(x_ptr, w_ptr, b_ptr, y_ptr, start, n_cols, eps, CENTERED, HAS_WEIGHT, HAS_BIAS,
                              BLOCK_N, FRAME)  # fmt: skip
    else:
        mean, _mean_g, m2, _comoment = _row_moments(x_ptr + start, x_ptr, x_ptr, n_cols, CENTERED, False, False,
                                                    BLOCK_N)  # fmt: skip
        rstd = _rstd(m2, n_cols, eps)
        for first in range(0, n_cols, BLOCK_N):
            cols, mask, _ = _chunk_at(first, n_cols, BLOCK_N)
            x = _load(x_ptr + start + cols, mask)
            y = _scale_shift((x - mean) * rstd, w_ptr, b_ptr, cols, mask, HAS_WEIGHT, HAS_BIAS)
            tl.store(y_ptr + start + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


# A long row framed at a 16-byte boundary (ops/blocks/alignment.py): its whole runs are swept in
# chunks of frame places under masks whose bounds are multiples of FRAME (16 bytes an access), its
# two partial runs apart, element by element.  A row of 50257 16-bit columns starts off a boundary
# in seven rows of eight; swept from its first element it moved 2 bytes an access.


@triton.jit
def _normalize_framed_row(x_ptr, w_ptr, b_ptr, y_ptr, start, n_cols, eps, CENTERED: tl.constexpr,
                          HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
                          FRAME: tl.constexpr):  # fmt: skip
    """normalize_long_rows' two sweeps over the row at element `start`, framed.  w and b are read
    at the row's columns (place - skew), element by element: they sit in L2 for every row."""
    frame, skew, body_end = peeled_frame(start, n_cols, FRAME)
    x_ptr += frame
    y_ptr += frame
    mean, _mean_g, m2, _comoment = _framed_row_moments(x_ptr, x_ptr, x_ptr, skew, body_end, n_cols, CENTERED, False,
                                                    False, BLOCK_N, FRAME)  # fmt: skip
    rstd = _rstd(m2, n_cols, eps)
    for first in range(0, body_end, BLOCK_N):
        places, inside = _places_at(first, body_end, BLOCK_N, FRAME)
        x = _load(x_ptr + places, inside)
        y = _scale_shift((x - mean) * rstd, w_ptr, b_ptr, places - skew, inside, HAS_WEIGHT, HAS_BIAS)
        tl.store(y_ptr + places, y.to(y_ptr.dtype.element_ty), mask=inside)
    edges, in_row = frame_edges(skew, body_end, n_cols, FRAME)
    x_edges = _load(x_ptr + edges, in_row)
    y_edges = _scale_shift((x_edges - mean) * rstd, w_ptr, b_ptr, edges - skew, in_row, HAS_WEIGHT, HAS_BIAS)
    tl.store(y_ptr + edges, y_edges.to(y_ptr.dtype.element_ty), mask=in_row)


# Short rows off 16-byte boundaries, read once and 16 bytes an access.  A tile's rows share one skew (their
# first column's place in their frames): rows SKEWS apart, SKEWS = FRAME / gcd(n_cols, FRAME), start the same
# distance past a boundary.  So the tile's rows are framed alike, and w and b, read at the rows' columns
# (place - skew, an element an access), are read once for all of them.


@triton.jit
def _framed_standardize(x, in_body, x_edges, in_edges, pivot, n_cols, eps, CENTERED: tl.constexpr,
                        PIVOTED: tl.constexpr):  # fmt: skip
    """(xhat, xhat_edges) of framed rows held as two pieces, the whole runs (x) and the partial ones
    (x_edges), 0 where masked: _standardize_pivoted's statistics (PIVOTED) or _standardize's (_center's
    corrected mean), each sum over a row the sum of its two pieces'."""
    if CENTERED:
        if PIVOTED:
            x = tl.where(in_body, x - pivot, 0.0)
            x_edges = tl.where(in_edges, x_edges - pivot, 0.0)
        mean = exact_div(tl.sum(x, axis=1) + tl.sum(x_edges, axis=1), n_cols)[:, None]
        x = tl.where(in_body, x - mean, 0.0)
        x_edges = tl.where(in_edges, x_edges - mean, 0.0)
        if not PIVOTED:  # _center's correction
            shift = exact_div(tl.sum(x, axis=1) + tl.sum(x_edges, axis=1), n_cols)[:, None]
            x = tl.where(in_body, x - shift, 0.0)
            x_edges = tl.where(in_edges, x_edges - shift, 0.0)
    rstd = _rstd(tl.sum(x * x, axis=1) + tl.sum(x_edges * x_edges, axis=1), n_cols, eps)[:, None]
    return x * rstd, x_edges * rstd


@triton.jit
def normalize_framed_rows(
    x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps,
    CENTERED: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, AFFINE_FIRST: tl.constexpr, PIVOTED: tl.constexpr,
    FRAME: tl.constexpr, SKEWS: tl.constexpr,
):  # fmt: skip
    """Short rows off 16-byte boundaries: a tile of BLOCK_M whole rows of one skew a program (program p
    takes rows p % SKEWS + SKEWS k), each read once in its frame: the whole runs as a (BLOCK_M, BLOCK_N)
    block of places [FRAME, FRAME + BLOCK_N) under masks whose bounds are multiples of FRAME (16 bytes an
    access), the two partial runs apart (ops/blocks/alignment.py).  BLOCK_N is at least the row's length:
    its whole runs end before FRAME + n_cols."""
    skew_class = tl.program_id(0) % SKEWS
    _, skew, body_end = peeled_frame(skew_class.to(tl.int64) * n_cols, n_cols, FRAME)  # every row's of the tile
    # int64 rows: row * n_cols passes 2**31 on tensors of 2**31+ elements.
    tile = (tl.program_id(0) // SKEWS).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    rows = skew_class + SKEWS * tile
    frames = known_multiple(rows * n_cols, FRAME)  # each row's frame: its start less the skew
    places = FRAME + tl.arange(0, BLOCK_N)[None, :]
    edges, edge_in_row = frame_edges(skew, body_end, n_cols, FRAME)
    edges, edge_in_row = edges[None, :], edge_in_row[None, :]
    in_body = (rows < n_rows) & (places < body_end)
    in_edges = (rows < n_rows) & edge_in_row
    # w and b once for the tile's rows, at their columns (place - skew); AFFINE_FIRST as normalize_rows'.
    if AFFINE_FIRST:
        w, b = _load_affine(w_ptr, b_ptr, places - skew, places < body_end, HAS_WEIGHT, HAS_BIAS, "evict_last")
        w_edges, b_edges = _load_affine(w_ptr, b_ptr, edges - skew, edge_in_row, HAS_WEIGHT, HAS_BIAS, "evict_last")
    x = _load(x_ptr + frames + places, in_body)
    x_edges = _load(x_ptr + frames + edges, in_edges)
    pivot = 0.0
    if PIVOTED:
        pivot = _pivots(x_ptr, rows, n_rows, n_cols, CENTERED)
    xhat, xhat_edges = _framed_standardize(x, in_body, x_edges, in_edges, pivot, n_cols, eps, CENTERED, PIVOTED)
    if not AFFINE_FIRST:
        w, b = _load_affine(w_ptr, b_ptr, places - skew, places < body_end, HAS_WEIGHT, HAS_BIAS, "")
        w_edges, b_edges = _load_affine(w_ptr, b_ptr, edges - skew, edge_in_row, HAS_WEIGHT, HAS_BIAS, "")
    y = _affine(xhat, w, b, HAS_WEIGHT, HAS_BIAS)
    tl.store(y_ptr + frames + places, y.to(y_ptr.dtype.element_ty), mask=in_body)
    y_edges = _affine(xhat_edges, w_edges, b_edges, HAS_WEIGHT, HAS_BIAS)
    tl.store(y_ptr + frames + edges, y_edges.to(y_ptr.dtype.element_ty), mask=in_edges)


@triton.jit
def _add_pairs(a0, b0, a1, b1):
    return a0 + a1, b0 + b1


@triton.jit
def _add_triples(a0, b0, c0, a1, b1, c1):
    return a0 + a1, b0 + b1, c0 + c1


@triton.jit
def _backward_row_sums(x, g, mask, n_cols, eps, CENTERED: tl.constexpr, PLAIN: tl.constexpr):
    """(xhat, rstd, mean(g * xhat), mean(g)) of a tile of whole rows: xhat the tile's shape, rstd (BLOCK_M,), the
    means (BLOCK_M, 1); mean(g) is 0 for RMS norm.

    After the mean, the three sums a row needs (d^2, g d and g, with d = x - mean) are one reduction: a
    reduction across a program's warps is a round through shared memory on the row's critical path, and at
    hidden sizes the rounds, not the arithmetic, are what a program's row waits on.  mean(g * xhat) =
    rstd * sum(g d) / n.  Measured in the harness: layer norm's backward 1.19-1.30x faster at hidden sizes,
    except on the tiles that keep the sums apart (perf-notes version 63).

    PLAIN: 16-bit rows' plain mean, sum(x) / n rounded once (exact on a constant row of at most 2**13 values);
    else _center's corrected one, a reduction more.  The plain mean is not _row_means: its second sum for rows
    whose sum overflows keeps x live across a branch, which took the 16-bit tiles of 2048 and 4096 columns
    from 128 registers to 139 and 154 (ptxas, sm_90, Triton 3.9), past what their programs an SM leave each
    thread (four on 4 warps, two on 8).  Such rows overflowed _center's sum as well.  The products g d can
    overflow float32 where g xhat did not (|x - mean| near 1e15 with |dy| near 1e25): dx is then not finite,
    as PyTorch's float32 backward is."""
    d = x
    if CENTERED:
        if PLAIN:
            d = tl.where(mask, x - exact_div(tl.sum(x, axis=1), n_cols)[:, None], 0.0)
        else:
            d, _ = _center(x, mask, n_cols, 1)
        sum_dd, sum_gd, sum_g = tl.reduce((d * d, g * d, g), 1, _add_triples)
        mean_g = sum_g[:, None] / n_cols
    else:
        sum_dd, sum_gd = tl.reduce((d * d, g * d), 1, _add_pairs)
        mean_g = 0.0
    rstd = _rstd(sum_dd, n_cols, eps)
    return d * rstd[:, None], rstd, (sum_gd * rstd)[:, None] / n_cols, mean_g


@triton.jit
def _load_tile(ptr, rows, cols, n_rows, n_cols):
    """A (BLOCK_M, BLOCK_N) tile of whole rows as stored (0 past the edges)."""
    return tl.load(ptr + rows * n_cols + cols, mask=(rows < n_rows) & (cols < n_cols), other=0.0)


@triton.jit
def normalize_rows_backward(
    dy_ptr, x_ptr, w_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, n_rows, n_cols, eps,
    CENTERED: tl.constexpr, HAS_WEIGHT: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOAD_AHEAD: tl.constexpr, COL_MULTIPLE: tl.constexpr,
    PLAIN: tl.constexpr, ONE_REDUCTION: tl.constexpr,
):  # fmt: skip
    """Short rows: each program loops over the tiles pid, pid + n_programs, ...;
    it writes dx, and its sums of dy * xhat and dy as row pid of the scratches.

    LOAD_AHEAD issues the next tile's loads before this tile's math, so that they
    are in flight while it runs (the program then holds two tiles of x and dy);
    otherwise they are issued after this tile's store."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    cols = tl.arange(0, BLOCK_N)[None, :]
    if HAS_WEIGHT:
        w = _load(w_ptr + cols, cols < n_cols)  # once per program, reused by every row
    dw_acc = _zeros_2d(x_ptr, BLOCK_M, BLOCK_N)  # summed over the tile's rows only at the end
    db_acc = _zeros_2d(x_ptr, BLOCK_M, BLOCK_N)
    step = tl.num_programs(0) * BLOCK_M
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    x_stored = _load_tile(x_ptr, rows, cols, n_rows, n_cols)
    dy_stored = _load_tile(dy_ptr, rows, cols, n_rows, n_cols)
    for _tile in range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0)):
        if LOAD_AHEAD:
            x_next = _load_tile(x_ptr, rows + step, cols, n_rows, n_cols)
            dy_next = _load_tile(dy_ptr, rows + step, cols, n_rows, n_cols)
        mask = (rows < n_rows) & (cols < n_cols)
        x = _widen(x_stored)
        dy = _widen(dy_stored)
        if ONE_REDUCTION:
            g = dy
            if HAS_WEIGHT:
                g = dy * w
            xhat, rstd, mean_g_xhat, mean_g = _backward_row_sums(x, g, mask, n_cols, eps, CENTERED, PLAIN)
            dx = (g - mean_g - xhat * mean_g_xhat) * rstd[:, None]
        else:
            # The sums apart, each its own reduction, written as before version 63 down to the order of its lines:
            # on Triton 3.6 the same math with g formed first took layer norm's 16-bit tiles of 2048 and 4096
            # columns from 128 registers to 148 (ptxas, sm_90), past their programs an SM (BackwardPlan.one_reduction).
            xhat, rstd = _standardize(x, mask, n_cols, eps, CENTERED)
            g = dy
            if HAS_WEIGHT:
                g = dy * w
            mean_g_xhat = tl.sum(g * xhat, axis=1)[:, None] / n_cols
            if CENTERED:
                dx = (g - tl.sum(g, axis=1)[:, None] / n_cols - xhat * mean_g_xhat) * rstd[:, None]
            else:
                dx = (g - xhat * mean_g_xhat) * rstd[:, None]
        # dx's offsets computed here, not taken from x's load: PyTorch's analysis of which arguments a kernel
        # writes (torch.compile, wrap_triton) follows a store's address back through the helper that loaded x
        # and counted x as written, so compiled graphs copied x back into their input (and FSDP2 refused it).
        tl.store(dx_ptr + rows * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        # Padding rows can have rstd = inf (eps = 0 and var = 0), so xhat NaN:
        # the mask keeps them out of the sum.
        if WEIGHT_GRAD:
            dw_acc += tl.where(mask, dy * xhat, 0.0)
        if BIAS_GRAD:
            db_acc += dy
        if not LOAD_AHEAD:
            x_next = _load_tile(x_ptr, rows + step, cols, n_rows, n_cols)
            dy_next = _load_tile(dy_ptr, rows + step, cols, n_rows, n_cols)
        rows, x_stored, dy_stored = rows + step, x_next, dy_next
    partial = tl.program_id(0).to(tl.int64) * n_cols + tl.arange(0, BLOCK_N)
    in_row = tl.arange(0, BLOCK_N) < n_cols
    if WEIGHT_GRAD:
        tl.store(dw_partial_ptr + partial, tl.sum(dw_acc, axis=0), mask=in_row)
    if BIAS_GRAD:
        tl.store(db_partial_ptr + partial, tl.sum(db_acc, axis=0), mask=in_row)


# Long rows: per-row statistics, then a (row group, column chunk) grid.  Rows off 16-byte boundaries (FRAME > 0)
# are read in their frames, 16 bytes an access: the statistics sweep as the forward's framed sweeps, w from its copy
# shifted by the row's skew (launch.py's shifted_weights: aligned loads, as x's); in the grid every row of a group
# shares one skew (the plan makes the groups a multiple of the skews), so a program's chunk of places is the same
# columns in each of its rows and its dw/db accumulators stay on them.
_STATS = 4  # per row: mean, rstd, mean(g * xhat), mean(g)


@triton.jit
def _shifted_w(w_ptr, w_stride, skew, FRAME: tl.constexpr):
    """The row of launch.py's shifted_weights whose place p holds column p - skew.  Its rows are whole runs: told
    so, the compiler loads w 16 bytes an access, as x (rows of 50265 bf16 are 50272 places, not a multiple of 16).
    int64: frame rows of a very long w pass 2**31 elements."""
    return w_ptr + (FRAME - 1 - skew).to(tl.int64) * known_multiple(w_stride, FRAME)


@triton.jit
def row_statistics_backward(
    dy_ptr, x_ptr, w_ptr, stats_ptr, n_cols, eps, w_stride,
    CENTERED: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr, COL_MULTIPLE: tl.constexpr,
    FRAME: tl.constexpr,
):  # fmt: skip
    """Long rows, pass 1: one sweep over a row for what dx needs (see _STATS)."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    row = tl.program_id(0).to(tl.int64)
    start = row * n_cols
    if FRAME:
        frame, skew, body_end = peeled_frame(start, n_cols, FRAME)
        w_row = _shifted_w(w_ptr, w_stride, skew, FRAME)
        mean_x, mean_g, m2, c = _framed_row_moments(
            x_ptr + frame, dy_ptr + frame, w_row, skew, body_end, n_cols, CENTERED, True, HAS_WEIGHT, BLOCK_N, FRAME
        )
    else:
        mean_x, mean_g, m2, c = _row_moments(x_ptr + start, dy_ptr + start, w_ptr, n_cols, CENTERED, True, HAS_WEIGHT,
                                          BLOCK_N)  # fmt: skip
    rstd = _rstd(m2, n_cols, eps)
    stats = stats_ptr + row * 4  # _STATS values a row
    tl.store(stats + 1, rstd.to(stats_ptr.dtype.element_ty))
    tl.store(stats + 2, (rstd * c / n_cols).to(stats_ptr.dtype.element_ty))  # mean(g * xhat)
    if CENTERED:  # RMS norm reads neither
        tl.store(stats + 0, mean_x.to(stats_ptr.dtype.element_ty))
        tl.store(stats + 3, mean_g.to(stats_ptr.dtype.element_ty))


@triton.jit
def columns_backward(
    dy_ptr, x_ptr, w_ptr, stats_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, n_rows, n_cols, w_stride,
    CENTERED: tl.constexpr, HAS_WEIGHT: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr,
    BLOCK_N: tl.constexpr, COL_MULTIPLE: tl.constexpr, FRAME: tl.constexpr,
):  # fmt: skip
    """Long rows, pass 2: program (group, chunk) writes dx on one chunk of places of the rows group,
    group + n_groups, ..., and that chunk of its partial dw/db.  Framed, the chunks cover the rows' whole
    runs, and the first chunk's programs also take the two partial runs."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    group = tl.program_id(0)
    first = tl.program_id(1).to(tl.int64) * BLOCK_N
    if FRAME:
        # the group's first row: its skew is every row's of the group
        _, skew, body_end = peeled_frame(group.to(tl.int64) * n_cols, n_cols, FRAME)
        w_row = _shifted_w(w_ptr, w_stride, skew, FRAME)
        places, body = _places_at(first, body_end, BLOCK_N, FRAME)
        _columns_of_group(dy_ptr, x_ptr, w_row, stats_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, group, n_rows,
                          n_cols, places, body, skew, CENTERED, HAS_WEIGHT, WEIGHT_GRAD, BIAS_GRAD, BLOCK_N, FRAME)
        if tl.program_id(1) == 0:
            edges, in_row = frame_edges(skew, body_end, n_cols, FRAME)
            _columns_of_group(dy_ptr, x_ptr, w_row, stats_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, group,
                              n_rows, n_cols, edges, in_row, skew, CENTERED, HAS_WEIGHT, WEIGHT_GRAD, BIAS_GRAD,
                              2 * FRAME, FRAME)  # fmt: skip
    else:
        places, mask = _places_at(first, n_cols, BLOCK_N, 0)
        _columns_of_group(dy_ptr, x_ptr, w_ptr, stats_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, group, n_rows,
                          n_cols, places, mask, 0, CENTERED, HAS_WEIGHT, WEIGHT_GRAD, BIAS_GRAD, BLOCK_N,
                          FRAME)  # fmt: skip


@triton.jit
def _columns_of_group(
    dy_ptr, x_ptr, w_ptr, stats_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, group, n_rows, n_cols, places, mask,
    skew, CENTERED: tl.constexpr, HAS_WEIGHT: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr,
    LANES: tl.constexpr, FRAME: tl.constexpr,
):  # fmt: skip
    """columns_backward on LANES places of every row of the group (where `mask`), each row's frame starting
    `skew` before it (0 unframed), w_ptr's place p at column p - skew; then the places' partial dw/db."""
    if HAS_WEIGHT:
        w = _load(w_ptr + places, mask)
    dw_acc = _zeros_1d(x_ptr, LANES)
    db_acc = _zeros_1d(x_ptr, LANES)
    for row in range(group, n_rows, tl.num_programs(0)):
        row64 = tl.cast(row, tl.int64)  # not .to: the interpreter hands the loop a Python int
        start = known_multiple(row64 * n_cols - skew, FRAME)  # the row's frame (its first element unframed)
        stats = stats_ptr + row64 * 4  # _STATS values a row
        rstd = tl.load(stats + 1)
        mean_g_xhat = tl.load(stats + 2)
        x = _load(x_ptr + start + places, mask)
        dy = _load(dy_ptr + start + places, mask)
        g = dy
        if HAS_WEIGHT:
            g = dy * w
        if CENTERED:
            xhat = (x - tl.load(stats + 0)) * rstd
            dx = (g - tl.load(stats + 3) - xhat * mean_g_xhat) * rstd
        else:
            xhat = x * rstd
            dx = (g - xhat * mean_g_xhat) * rstd
        tl.store(dx_ptr + start + places, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if WEIGHT_GRAD:
            dw_acc += tl.where(mask, dy * xhat, 0.0)
        if BIAS_GRAD:
            db_acc += dy
    partial = group.to(tl.int64) * n_cols + places - skew  # the places' columns
    if WEIGHT_GRAD:
        tl.store(dw_partial_ptr + partial, dw_acc, mask=mask)
    if BIAS_GRAD:
        tl.store(db_partial_ptr + partial, db_acc, mask=mask)


@triton.jit
def column_sum_kernel(
    first_partial_ptr, second_partial_ptr, first_out_ptr, second_out_ptr, n_partials, n_cols,
    TWO_SUMS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, COL_MULTIPLE: tl.constexpr,
):  # fmt: skip
    """The second stage of the dw/db reduction, both gradients in one launch: program (c, s)
    sums the columns c * BLOCK_N, ... of the first (n_partials, n_cols) scratch into the
    first output (s = 0), or of the second into the second (s = 1), walking down the
    partial rows BLOCK_P at a time.  Without TWO_SUMS the second pair is not touched."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    partial_ptr, out_ptr = first_partial_ptr, first_out_ptr
    if TWO_SUMS:
        first = tl.program_id(1) == 0
        partial_ptr = tl.where(first, first_partial_ptr, second_partial_ptr)
        out_ptr = tl.where(first, first_out_ptr, second_out_ptr)  # dw and db: one dtype
    cols = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _zeros_2d(partial_ptr, BLOCK_P, BLOCK_N)
    for start in range(0, n_partials, BLOCK_P):
        parts = start + tl.arange(0, BLOCK_P)
        mask = (parts[:, None] < n_partials) & (cols[None, :] < n_cols)
        acc += tl.load(partial_ptr + parts[:, None].to(tl.int64) * n_cols + cols[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=cols < n_cols)


# --------------------------------------------------------------------------
# Layer norm's own kernels: the bodies above with CENTERED on.
# --------------------------------------------------------------------------


@triton.jit
def layer_norm_forward_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    COL_MULTIPLE: tl.constexpr, AFFINE_FIRST: tl.constexpr, PIVOTED: tl.constexpr, PLAIN: tl.constexpr,
):  # fmt: skip
    normalize_rows(
        x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps, True, HAS_WEIGHT, HAS_BIAS, BLOCK_M, BLOCK_N, COL_MULTIPLE,
        AFFINE_FIRST, PIVOTED, PLAIN,
    )  # fmt: skip


@triton.jit
def layer_norm_forward_long_rows_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    COL_MULTIPLE: tl.constexpr, FRAME: tl.constexpr = 0,
):  # fmt: skip
    normalize_long_rows(
        x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps, True, HAS_WEIGHT, HAS_BIAS, BLOCK_M, BLOCK_N, COL_MULTIPLE,
        FRAME,
    )


@triton.jit
def layer_norm_forward_framed_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    AFFINE_FIRST: tl.constexpr, PIVOTED: tl.constexpr, FRAME: tl.constexpr, SKEWS: tl.constexpr,
):  # fmt: skip
    normalize_framed_rows(
        x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps, True, HAS_WEIGHT, HAS_BIAS, BLOCK_M, BLOCK_N,
        AFFINE_FIRST, PIVOTED, FRAME, SKEWS,
    )


@triton.jit
def layer_norm_backward_kernel(
    dy_ptr, x_ptr, w_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, n_rows, n_cols, eps,
    HAS_WEIGHT: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOAD_AHEAD: tl.constexpr, COL_MULTIPLE: tl.constexpr,
    PLAIN: tl.constexpr, ONE_REDUCTION: tl.constexpr,
):  # fmt: skip
    normalize_rows_backward(
        dy_ptr, x_ptr, w_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, n_rows, n_cols, eps,
        True, HAS_WEIGHT, WEIGHT_GRAD, BIAS_GRAD, BLOCK_M, BLOCK_N, LOAD_AHEAD, COL_MULTIPLE, PLAIN,
        ONE_REDUCTION,
    )  # fmt: skip


@triton.jit
def layer_norm_backward_stats_kernel(
    dy_ptr, x_ptr, w_ptr, stats_ptr, n_cols, eps, w_stride, HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr,
    COL_MULTIPLE: tl.constexpr, FRAME: tl.constexpr,
):  # fmt: skip
    row_statistics_backward(
        dy_ptr, x_ptr, w_ptr, stats_ptr, n_cols, eps, w_stride, True, HAS_WEIGHT, BLOCK_N, COL_MULTIPLE, FRAME
    )


@triton.jit
def layer_norm_backward_columns_kernel(
    dy_ptr, x_ptr, w_ptr, stats_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, n_rows, n_cols, w_stride,
    HAS_WEIGHT: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr, BLOCK_N: tl.constexpr,
    COL_MULTIPLE: tl.constexpr, FRAME: tl.constexpr,
):  # fmt: skip
    columns_backward(
        dy_ptr, x_ptr, w_ptr, stats_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, n_rows, n_cols, w_stride,
        True, HAS_WEIGHT, WEIGHT_GRAD, BIAS_GRAD, BLOCK_N, COL_MULTIPLE, FRAME,
    )  # fmt: skip


# --------------------------------------------------------------------------
# The kernels: layer norm's bodies with CENTERED off.  Their signatures are
# layer norm's, so that one launcher serves both ops: RMS norm has no bias,
# and is always launched with HAS_BIAS=False and BIAS_GRAD=False.
# --------------------------------------------------------------------------


@triton.jit
def rms_norm_forward_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    COL_MULTIPLE: tl.constexpr, AFFINE_FIRST: tl.constexpr, PIVOTED: tl.constexpr, PLAIN: tl.constexpr,
):  # fmt: skip
    normalize_rows(
        x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps, False, HAS_WEIGHT, HAS_BIAS, BLOCK_M, BLOCK_N, COL_MULTIPLE,
        AFFINE_FIRST, PIVOTED, PLAIN,
    )  # fmt: skip


@triton.jit
def rms_norm_forward_long_rows_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    COL_MULTIPLE: tl.constexpr, FRAME: tl.constexpr = 0,
):  # fmt: skip
    normalize_long_rows(
        x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps, False, HAS_WEIGHT, HAS_BIAS, BLOCK_M, BLOCK_N, COL_MULTIPLE,
        FRAME,
    )


@triton.jit
def rms_norm_forward_framed_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    AFFINE_FIRST: tl.constexpr, PIVOTED: tl.constexpr, FRAME: tl.constexpr, SKEWS: tl.constexpr,
):  # fmt: skip
    normalize_framed_rows(
        x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps, False, HAS_WEIGHT, HAS_BIAS, BLOCK_M, BLOCK_N,
        AFFINE_FIRST, PIVOTED, FRAME, SKEWS,
    )


@triton.jit
def rms_norm_backward_kernel(
    dy_ptr, x_ptr, w_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, n_rows, n_cols, eps,
    HAS_WEIGHT: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOAD_AHEAD: tl.constexpr, COL_MULTIPLE: tl.constexpr,
    PLAIN: tl.constexpr, ONE_REDUCTION: tl.constexpr,
):  # fmt: skip
    normalize_rows_backward(
        dy_ptr, x_ptr, w_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, n_rows, n_cols, eps,
        False, HAS_WEIGHT, WEIGHT_GRAD, BIAS_GRAD, BLOCK_M, BLOCK_N, LOAD_AHEAD, COL_MULTIPLE, PLAIN,
        ONE_REDUCTION,
    )  # fmt: skip


@triton.jit
def rms_norm_backward_stats_kernel(
    dy_ptr, x_ptr, w_ptr, stats_ptr, n_cols, eps, w_stride, HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr,
    COL_MULTIPLE: tl.constexpr, FRAME: tl.constexpr,
):  # fmt: skip
    row_statistics_backward(
        dy_ptr, x_ptr, w_ptr, stats_ptr, n_cols, eps, w_stride, False, HAS_WEIGHT, BLOCK_N, COL_MULTIPLE, FRAME
    )


@triton.jit
def rms_norm_backward_columns_kernel(
    dy_ptr, x_ptr, w_ptr, stats_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, n_rows, n_cols, w_stride,
    HAS_WEIGHT: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr, BLOCK_N: tl.constexpr,
    COL_MULTIPLE: tl.constexpr, FRAME: tl.constexpr,
):  # fmt: skip
    columns_backward(
        dy_ptr, x_ptr, w_ptr, stats_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, n_rows, n_cols, w_stride,
        False, HAS_WEIGHT, WEIGHT_GRAD, BIAS_GRAD, BLOCK_N, COL_MULTIPLE, FRAME,
    )  # fmt: skip
