"""Layer norm over the trailing dims, forward and backward, rows of any length.

For each row of N elements (the normalized dims flattened into one):

    mean = sum(x) / N,   var = sum((x - mean)^2) / N,   rstd = 1 / sqrt(var + eps)
    xhat = (x - mean) * rstd,                            y = xhat * w + b
    g = dy * w,   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
    dw = sum over rows of dy * xhat,                     db = sum over rows of dy

RMS norm (ops/rms_norm.py) is the same computation without the centering:
mean = 0 (var is then the mean square), no bias, no mean(g) term.  So the
kernels below take a CENTERED flag, both ops launch them through the same
Python code, and each op's own kernels are thin wrappers that fix the flag.
Statistics are computed in float32 (float64 for float64 inputs) whatever
the storage dtype.

Forward, two designs, by row length:

* short rows (next_power_of_2(N) <= _MAX_BLOCK): a program normalizes a tile
  of BLOCK_M whole rows, loaded once and reduced in registers: one read and
  one write per element, the minimum.  Rows much shorter than a block are
  stacked BLOCK_M to a tile so that each program still moves about _TILE
  elements (one 128-column row per program would leave most lanes idle).
* long rows: one program per row, two sweeps over BLOCK_N-column chunks.
  The first gathers the statistics, the second writes y (its reads mostly
  hit L2, which has just seen the row).  Mean and variance come out of the
  single first sweep by merging per-chunk moments (Chan et al.): with each
  chunk's mean and M2 = sum((x - mean)^2),

      delta = mean_b - mean_a,   n = n_a + n_b,   mean = mean_a + delta * n_b / n
      M2 = M2_a + M2_b + delta^2 * n_a * n_b / n

  which, unlike sum(x^2) / N - mean^2, does not cancel when |mean| >> std.

Backward, two designs, by row length:

* short rows: a fixed number of programs (one an SM, see
  _backward_tile for the exceptions), each looping over row tiles, the next
  tile's loads in flight during this one's math.  A program loads a
  tile of x and dy once, recomputes mean and rstd, writes dx, and adds
  dy * xhat (and dy) to dw/db accumulators held in registers for its whole
  run.  At the end it writes them as its own row of a (n_programs, N)
  scratch; a second kernel sums the scratch's columns (dw's and db's in one
  launch).  No atomics: each scratch row has one writer, the result is the
  same bits on every run, and the column sum reads a few hundred partial
  rows, little next to x.
* long rows: neither a row nor its dw accumulator fits in registers.  A
  first kernel sweeps each row once for mean, rstd, mean(g) and
  mean(g * xhat) (merged chunk by chunk as above, the last through the
  co-moment of x and g); a second runs over a (row group, column chunk)
  grid, writes dx for its chunk of each row of its group and accumulates
  that chunk of dw/db in registers into the scratch; then the same column
  sum.  x and dy are read twice, the price of rows longer than a block.
  On CUDA the rows are instead held on chip across programs, where a setup
  takes them (see HeldRows): read once.

Saved statistics or recomputed ones: recomputed.  The backward reads every
row of x and dy anyway, and mean and rstd come out of the very pass that
computes the row sums the gradient needs (in registers for short rows, in
the statistics sweep for long ones), so recomputing costs a few flops per
element in a memory-bound kernel and no extra memory traffic.  Saving them
would make the forward write, and the backward read, two more tensors, and
the op return three outputs (or be split into a second registered op) for
no measurable gain.  The autograd therefore keeps x and weight only.
"""

from dataclasses import dataclass, field
import math
from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._alignment import column_multiple, known_multiple
from ._cooperative import (
    held_rows_scratch,
    pack,
    plan,
    poll,
    program_segment,
    programs_at_once,
    publish,
    register_capped,
    unpack,
    wait_for_fill,
    words_block,
)
from ._device import kind as _kind, sm_count as _sm_count
from ._launch import at_most, cdiv, next_power_of_2, rows_in_tile, warps_for
from ._registry import (
    FLOAT32_RESULT,
    GRAD,
    OpSpec,
    check_tensor,
    follow_autocast,
    launcher,
    needs_grad,
    reads_as_float32,
    register_formula,
    register_op,
    register_spec,
)

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
def _load_affine(w_ptr, b_ptr, cols, n_cols, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, EVICTION: tl.constexpr):
    """(w, b) at `cols` in the compute dtype, loaded with `EVICTION` ("" for the default,
    "evict_last" to keep them in L2 for the other programs); 0 stands in for one that is
    absent, and the flags keep it unused."""
    w = 0.0
    b = 0.0
    if HAS_WEIGHT:
        w = _widen(tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0, eviction_policy=EVICTION))
    if HAS_BIAS:
        b = _widen(tl.load(b_ptr + cols, mask=cols < n_cols, other=0.0, eviction_policy=EVICTION))
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
def _scale_shift(xhat, w_ptr, b_ptr, cols, n_cols, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """xhat * w + b, w and b loaded now.  `cols` has xhat's rank: (1, BLOCK_N) for a
    tile, so that w and b broadcast over its rows; (BLOCK_N,) for a chunk of one row."""
    w, b = _load_affine(w_ptr, b_ptr, cols, n_cols, HAS_WEIGHT, HAS_BIAS, "")
    return _affine(xhat, w, b, HAS_WEIGHT, HAS_BIAS)


@triton.jit
def _standardize(x, mask, n_cols, eps, CENTERED: tl.constexpr):
    """(xhat, rstd) of a (BLOCK_M, BLOCK_N) tile of whole rows, reduced in registers.

    Padding lanes of x are 0 and stay 0 after centering, so they add nothing
    to the sums.  The whole row is at hand, so the variance takes the
    two-pass form: the mean first, then the squares of x - mean."""
    if CENTERED:
        mean = tl.sum(x, axis=1) / n_cols
        x = tl.where(mask, x - mean[:, None], 0.0)
    rstd = _rstd(tl.sum(x * x, axis=1), n_cols, eps)
    return x * rstd[:, None], rstd


# Long rows: statistics merged chunk by chunk (see the module docstring).


@triton.jit
def _chunk_moments(x, mask, count):
    """(mean, M2) of one chunk; masked lanes (x = 0 there) are left out."""
    mean = tl.sum(x, axis=0) / count
    centered = tl.where(mask, x - mean, 0.0)
    return mean, tl.sum(centered * centered, axis=0)


@triton.jit
def _merge_moments(mean_a, m2_a, n_a, mean_b, m2_b, n_b):
    """Moments of two disjoint parts merged into those of their union."""
    n = n_a + n_b
    delta = mean_b - mean_a
    mean = mean_a + delta * (n_b / n)
    m2 = m2_a + m2_b + delta * delta * (n_a * n_b / n)
    return mean, m2, n


@triton.jit
def _chunk_at(first, n_cols, BLOCK_N: tl.constexpr):
    """Columns [first, first + BLOCK_N) of a row, the mask of those inside it, and their count."""
    cols = first + tl.arange(0, BLOCK_N)
    return cols, cols < n_cols, tl.minimum(n_cols - first, BLOCK_N)


@triton.jit
def _row_moments(x_ptr, n_cols, CENTERED: tl.constexpr, BLOCK_N: tl.constexpr):
    """(mean, M2) of the row at x_ptr in one sweep; uncentered (RMS norm): (0, sum(x^2))."""
    cols, mask, count = _chunk_at(0, n_cols, BLOCK_N)
    x = _load(x_ptr + cols, mask)
    if CENTERED:
        # The first chunk starts the running moments, so they take the compute
        # dtype from the data (a loop variable may not change dtype in the loop).
        n_seen = count.to(x.dtype)
        mean, m2 = _chunk_moments(x, mask, n_seen)
        for first in range(BLOCK_N, n_cols, BLOCK_N):
            cols, mask, count = _chunk_at(first, n_cols, BLOCK_N)
            x = _load(x_ptr + cols, mask)
            n_chunk = count.to(x.dtype)
            chunk_mean, chunk_m2 = _chunk_moments(x, mask, n_chunk)
            mean, m2, n_seen = _merge_moments(mean, m2, n_seen, chunk_mean, chunk_m2, n_chunk)
    else:
        mean = 0.0
        m2 = tl.sum(x * x, axis=0)
        for first in range(BLOCK_N, n_cols, BLOCK_N):
            cols, mask, count = _chunk_at(first, n_cols, BLOCK_N)
            x = _load(x_ptr + cols, mask)
            m2 += tl.sum(x * x, axis=0)
    return mean, m2


@triton.jit
def _chunk_comoments(x, g, mask, count):
    """(mean x, mean g, M2 of x, co-moment sum((x - mean x) * (g - mean g))) of one chunk."""
    mean_x = tl.sum(x, axis=0) / count
    mean_g = tl.sum(g, axis=0) / count
    dx = tl.where(mask, x - mean_x, 0.0)
    dg = tl.where(mask, g - mean_g, 0.0)
    return mean_x, mean_g, tl.sum(dx * dx, axis=0), tl.sum(dx * dg, axis=0)


@triton.jit
def _merge_comoments(mean_x_a, mean_g_a, m2_a, c_a, n_a, mean_x_b, mean_g_b, m2_b, c_b, n_b):
    """The co-moment merges like M2, with the product of the two means' deltas."""
    n = n_a + n_b
    delta_x = mean_x_b - mean_x_a
    delta_g = mean_g_b - mean_g_a
    weight = n_a * n_b / n
    mean_x = mean_x_a + delta_x * (n_b / n)
    mean_g = mean_g_a + delta_g * (n_b / n)
    return mean_x, mean_g, m2_a + m2_b + delta_x * delta_x * weight, c_a + c_b + delta_x * delta_g * weight, n


@triton.jit
def _load_g(dy_ptr, w_ptr, cols, mask, HAS_WEIGHT: tl.constexpr):
    """g = dy * w, the gradient reaching xhat; and dy itself."""
    dy = _load(dy_ptr + cols, mask)
    g = dy
    if HAS_WEIGHT:
        g = dy * _load(w_ptr + cols, mask)
    return g, dy


@triton.jit
def _row_comoments(x_ptr, dy_ptr, w_ptr, n_cols, CENTERED: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr):
    """One sweep over a row of x and g: (mean x, mean g, M2 of x, sum((x - mean x) * g)).

    sum((x - mean x) * g) equals the co-moment, as sum(x - mean x) = 0.
    Uncentered (RMS norm): (0, 0, sum(x^2), sum(x * g))."""
    cols, mask, count = _chunk_at(0, n_cols, BLOCK_N)
    x = _load(x_ptr + cols, mask)
    g, _ = _load_g(dy_ptr, w_ptr, cols, mask, HAS_WEIGHT)
    if CENTERED:
        n_seen = count.to(x.dtype)
        mean_x, mean_g, m2, c = _chunk_comoments(x, g, mask, n_seen)
        for first in range(BLOCK_N, n_cols, BLOCK_N):
            cols, mask, count = _chunk_at(first, n_cols, BLOCK_N)
            x = _load(x_ptr + cols, mask)
            g, _ = _load_g(dy_ptr, w_ptr, cols, mask, HAS_WEIGHT)
            n_chunk = count.to(x.dtype)
            chunk_x, chunk_g, chunk_m2, chunk_c = _chunk_comoments(x, g, mask, n_chunk)
            mean_x, mean_g, m2, c, n_seen = _merge_comoments(
                mean_x, mean_g, m2, c, n_seen, chunk_x, chunk_g, chunk_m2, chunk_c, n_chunk
            )
    else:
        mean_x = 0.0
        mean_g = 0.0
        m2 = tl.sum(x * x, axis=0)
        c = tl.sum(x * g, axis=0)
        for first in range(BLOCK_N, n_cols, BLOCK_N):
            cols, mask, count = _chunk_at(first, n_cols, BLOCK_N)
            x = _load(x_ptr + cols, mask)
            g, _ = _load_g(dy_ptr, w_ptr, cols, mask, HAS_WEIGHT)
            m2 += tl.sum(x * x, axis=0)
            c += tl.sum(x * g, axis=0)
    return mean_x, mean_g, m2, c


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
):  # fmt: skip
    """Short rows: a tile of BLOCK_M whole rows per program, one read and one write.
    AFFINE_FIRST: w and b are loaded beside x, their latency hidden under x's, rather
    than after the reductions (where they wait in the tile's critical path but take
    no registers during the reductions)."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    # int64 rows: row * n_cols passes 2**31 on tensors of 2**31+ elements.
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    cols = tl.arange(0, BLOCK_N)[None, :]
    mask = (rows < n_rows) & (cols < n_cols)  # the last tile and every row's end hang over
    offsets = rows * n_cols + cols
    if AFFINE_FIRST:
        w, b = _load_affine(w_ptr, b_ptr, cols, n_cols, HAS_WEIGHT, HAS_BIAS, "evict_last")
    x = _load(x_ptr + offsets, mask)
    xhat, _ = _standardize(x, mask, n_cols, eps, CENTERED)
    if not AFFINE_FIRST:
        w, b = _load_affine(w_ptr, b_ptr, cols, n_cols, HAS_WEIGHT, HAS_BIAS, "")
    y = _affine(xhat, w, b, HAS_WEIGHT, HAS_BIAS)
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def normalize_long_rows(
    x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps,
    CENTERED: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, COL_MULTIPLE: tl.constexpr,
):  # fmt: skip
    """Long rows: one program per row; a sweep for the statistics, a sweep to write.
    (BLOCK_M is 1 and n_rows unused: the signature is normalize_rows' less AFFINE_FIRST.)"""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    start = tl.program_id(0).to(tl.int64) * n_cols
    mean, m2 = _row_moments(x_ptr + start, n_cols, CENTERED, BLOCK_N)
    rstd = _rstd(m2, n_cols, eps)
    for first in range(0, n_cols, BLOCK_N):
        cols, mask, _ = _chunk_at(first, n_cols, BLOCK_N)
        x = _load(x_ptr + start + cols, mask)
        y = _scale_shift((x - mean) * rstd, w_ptr, b_ptr, cols, n_cols, HAS_WEIGHT, HAS_BIAS)
        tl.store(y_ptr + start + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _load_tile(ptr, rows, cols, n_rows, n_cols):
    """A (BLOCK_M, BLOCK_N) tile of whole rows as stored (0 past the edges), and its offsets."""
    offsets = rows * n_cols + cols
    return tl.load(ptr + offsets, mask=(rows < n_rows) & (cols < n_cols), other=0.0), offsets


@triton.jit
def normalize_rows_backward(
    dy_ptr, x_ptr, w_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, n_rows, n_cols, eps,
    CENTERED: tl.constexpr, HAS_WEIGHT: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOAD_AHEAD: tl.constexpr, COL_MULTIPLE: tl.constexpr,
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
    x_stored, offsets = _load_tile(x_ptr, rows, cols, n_rows, n_cols)
    dy_stored, _ = _load_tile(dy_ptr, rows, cols, n_rows, n_cols)
    for _tile in range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0)):
        if LOAD_AHEAD:
            x_next, next_offsets = _load_tile(x_ptr, rows + step, cols, n_rows, n_cols)
            dy_next, _ = _load_tile(dy_ptr, rows + step, cols, n_rows, n_cols)
        mask = (rows < n_rows) & (cols < n_cols)
        x = _widen(x_stored)
        dy = _widen(dy_stored)
        xhat, rstd = _standardize(x, mask, n_cols, eps, CENTERED)
        g = dy
        if HAS_WEIGHT:
            g = dy * w
        mean_g_xhat = tl.sum(g * xhat, axis=1)[:, None] / n_cols
        if CENTERED:
            dx = (g - tl.sum(g, axis=1)[:, None] / n_cols - xhat * mean_g_xhat) * rstd[:, None]
        else:
            dx = (g - xhat * mean_g_xhat) * rstd[:, None]
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        # Padding rows can have rstd = inf (eps = 0 and var = 0), so xhat NaN:
        # the mask keeps them out of the sum.
        if WEIGHT_GRAD:
            dw_acc += tl.where(mask, dy * xhat, 0.0)
        if BIAS_GRAD:
            db_acc += dy
        if not LOAD_AHEAD:
            x_next, next_offsets = _load_tile(x_ptr, rows + step, cols, n_rows, n_cols)
            dy_next, _ = _load_tile(dy_ptr, rows + step, cols, n_rows, n_cols)
        rows, offsets, x_stored, dy_stored = rows + step, next_offsets, x_next, dy_next
    partial = tl.program_id(0).to(tl.int64) * n_cols + tl.arange(0, BLOCK_N)
    in_row = tl.arange(0, BLOCK_N) < n_cols
    if WEIGHT_GRAD:
        tl.store(dw_partial_ptr + partial, tl.sum(dw_acc, axis=0), mask=in_row)
    if BIAS_GRAD:
        tl.store(db_partial_ptr + partial, tl.sum(db_acc, axis=0), mask=in_row)


# Long rows: per-row statistics, then a (row group, column chunk) grid.
_STATS = 4  # per row: mean, rstd, mean(g * xhat), mean(g)


@triton.jit
def row_statistics_backward(
    dy_ptr, x_ptr, w_ptr, stats_ptr, n_cols, eps,
    CENTERED: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr, COL_MULTIPLE: tl.constexpr,
):  # fmt: skip
    """Long rows, pass 1: one sweep over a row for what dx needs (see _STATS)."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    row = tl.program_id(0).to(tl.int64)
    start = row * n_cols
    mean_x, mean_g, m2, c = _row_comoments(x_ptr + start, dy_ptr + start, w_ptr, n_cols, CENTERED, HAS_WEIGHT, BLOCK_N)
    rstd = _rstd(m2, n_cols, eps)
    stats = stats_ptr + row * 4  # _STATS values a row
    tl.store(stats + 1, rstd.to(stats_ptr.dtype.element_ty))
    tl.store(stats + 2, (rstd * c / n_cols).to(stats_ptr.dtype.element_ty))  # mean(g * xhat)
    if CENTERED:  # RMS norm reads neither
        tl.store(stats + 0, mean_x.to(stats_ptr.dtype.element_ty))
        tl.store(stats + 3, mean_g.to(stats_ptr.dtype.element_ty))


@triton.jit
def columns_backward(
    dy_ptr, x_ptr, w_ptr, stats_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, n_rows, n_cols,
    CENTERED: tl.constexpr, HAS_WEIGHT: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr,
    BLOCK_N: tl.constexpr, COL_MULTIPLE: tl.constexpr,
):  # fmt: skip
    """Long rows, pass 2: program (group, chunk) writes dx on one column chunk of
    the rows group, group + n_groups, ..., and that chunk of its partial dw/db."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    group = tl.program_id(0)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    if HAS_WEIGHT:
        w = _load(w_ptr + cols, mask)
    dw_acc = _zeros_1d(x_ptr, BLOCK_N)
    db_acc = _zeros_1d(x_ptr, BLOCK_N)
    for row in range(group, n_rows, tl.num_programs(0)):
        row64 = tl.cast(row, tl.int64)  # not .to: the interpreter hands the loop a Python int
        start = row64 * n_cols
        stats = stats_ptr + row64 * 4  # _STATS values a row
        rstd = tl.load(stats + 1)
        mean_g_xhat = tl.load(stats + 2)
        x = _load(x_ptr + start + cols, mask)
        dy = _load(dy_ptr + start + cols, mask)
        g = dy
        if HAS_WEIGHT:
            g = dy * w
        if CENTERED:
            xhat = (x - tl.load(stats + 0)) * rstd
            dx = (g - tl.load(stats + 3) - xhat * mean_g_xhat) * rstd
        else:
            xhat = x * rstd
            dx = (g - xhat * mean_g_xhat) * rstd
        tl.store(dx_ptr + start + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if WEIGHT_GRAD:
            dw_acc += tl.where(mask, dy * xhat, 0.0)
        if BIAS_GRAD:
            db_acc += dy
    partial = group.to(tl.int64) * n_cols + cols
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
# Backward rows past a block, held on chip across programs (CUDA; the protocol:
# ops/_cooperative.py).  A program keeps one segment of x and dy of a row in
# registers, and the dw (and db) accumulator of its segment's columns over all
# the rows it takes.  RMS norm's kernel is in ops/rms_norm.py.
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
        # The segments' moments merged (Chan et al., as _merge_comoments, over all segments at once).
        mean = tl.sum(tl.where(inside, counts * means_x, 0.0), axis=0) / n_cols
        deltas = tl.where(inside, means_x - mean, 0.0)
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
# Layer norm's own kernels: the bodies above with CENTERED on.
# --------------------------------------------------------------------------


@triton.jit
def layer_norm_forward_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    COL_MULTIPLE: tl.constexpr, AFFINE_FIRST: tl.constexpr,
):  # fmt: skip
    normalize_rows(
        x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps, True, HAS_WEIGHT, HAS_BIAS, BLOCK_M, BLOCK_N, COL_MULTIPLE,
        AFFINE_FIRST,
    )  # fmt: skip


@triton.jit
def layer_norm_forward_long_rows_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    COL_MULTIPLE: tl.constexpr,
):  # fmt: skip
    normalize_long_rows(
        x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps, True, HAS_WEIGHT, HAS_BIAS, BLOCK_M, BLOCK_N, COL_MULTIPLE
    )


@triton.jit
def layer_norm_backward_kernel(
    dy_ptr, x_ptr, w_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, n_rows, n_cols, eps,
    HAS_WEIGHT: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOAD_AHEAD: tl.constexpr, COL_MULTIPLE: tl.constexpr,
):  # fmt: skip
    normalize_rows_backward(
        dy_ptr, x_ptr, w_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, n_rows, n_cols, eps,
        True, HAS_WEIGHT, WEIGHT_GRAD, BIAS_GRAD, BLOCK_M, BLOCK_N, LOAD_AHEAD, COL_MULTIPLE,
    )  # fmt: skip


@triton.jit
def layer_norm_backward_stats_kernel(
    dy_ptr, x_ptr, w_ptr, stats_ptr, n_cols, eps, HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr,
    COL_MULTIPLE: tl.constexpr,
):  # fmt: skip
    row_statistics_backward(
        dy_ptr, x_ptr, w_ptr, stats_ptr, n_cols, eps, True, HAS_WEIGHT, BLOCK_N, COL_MULTIPLE
    )


@triton.jit
def layer_norm_backward_columns_kernel(
    dy_ptr, x_ptr, w_ptr, stats_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, n_rows, n_cols,
    HAS_WEIGHT: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr, BLOCK_N: tl.constexpr,
    COL_MULTIPLE: tl.constexpr,
):  # fmt: skip
    columns_backward(
        dy_ptr, x_ptr, w_ptr, stats_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr, n_rows, n_cols,
        True, HAS_WEIGHT, WEIGHT_GRAD, BIAS_GRAD, BLOCK_N, COL_MULTIPLE,
    )  # fmt: skip


# Backward rows past _MAX_BLOCK_BACKWARD held on chip across programs, for an
# op that has that kernel, by the setups in its NormKernels (keyed by the widest
# input's element size); float64, and rows no setup takes, keep the two-sweep
# design.  A program holds `segment` columns of x and dy, twice (this row's and
# the next's; three times with rows_ahead 2), and of its accumulators, on
# `warps` warps at most `registers` registers a thread, `programs_per_sm` an SM, for rows of at most
# `max_segments` segments (None: as many as the grid holds).  One warp a
# program reduces and polls without a barrier: up to 128 segments a row it won
# everywhere.  H100, % of a copy of the same bytes at 8192x12288 / 4096x32768
# / 1024x65536 / 256x262144 (docs/perf-notes.md, versions 30, 32 and 38):
#   rms bf16: two sweeps 59 / 59 / 50 / 48; 2048 / 4 / 96 / 5: 79 / 79 / 73 / 64;
#     512 / 1 / 96 / 20: 90 / 89 / 82 / 18 (a row of 512 segments waits on 512 programs).
#   rms float32: 59 / 59 / 56 / 55; 1024 / 2 / 128 / 8: 87 / 86 / 82 / 71; 512 / 1 / 128 / 16:
#     91 / 94 / 93 / 61.
#   layer norm (two words a segment, two accumulators): two sweeps bf16 51 / 51 / 43 / 39,
#     float32 59 / 59 / 52 / 49; 512 / 1 / 128 / 16: bf16 69 / 69 / 60 / 10, float32 88 / 83 /
#     75 / 20; the setups of 2-8 warps 35-54 in bf16 (spills).  Version 38: both words of a
#     segment in one poll, bf16 73 / 72 / 55; then bf16 with a third row's segment in flight
#     (rows_ahead 2) at 160 registers, 12 an SM, 77 / 74 / 55 (at 144 planned as 14 an SM, 46-66:
#     12 run, see resident_programs_per_sm); float32 at 160 registers (no spill), 12 an SM, 92 / 87 / 78.
#     RMS norm with rows_ahead 2 lost (bf16 needs 144 registers, float32 192).  Version 39: the
#     moments unmasked on rows of whole segments, bf16 4096x32768 74 -> 77; rows past 128 segments
#     of 512 (65537 to 131072 columns) on 1024 / 2 / 160 / 6, 512x131072 bf16 328 -> 280 us,
#     float32 527 -> 401 us against two sweeps (at 4096x32768 and 1024x65536 it lost to 512 / 1).
#     At 2000x20001, rows of no 16-element multiple (loads of one element), float32 fell from 54
#     to 39 (bf16 33 both): layer norm holds only rows of a length that is a multiple of `col_multiple`.
# The interpreter runs one program after another: off on CPU, except in
# tests, which then take the path that computes the partials itself, over
# _CPU_HELD_SEGMENT columns.
@dataclass(frozen=True)
class HeldRows:
    segment: int
    warps: int
    registers: int
    programs_per_sm: int
    max_segments: Optional[int] = None
    col_multiple: int = 1  # rows of a length that is a multiple of this (see ops/_alignment.py)
    rows_ahead: int = 1  # 2: a third row's segment in flight while the program polls (ROWS_AHEAD)

    def __post_init__(self):
        if self.rows_ahead not in (1, 2):
            raise ValueError(f"HeldRows: rows_ahead is 1 or 2 (rows the kernels load ahead), got {self.rows_ahead}")


@dataclass(frozen=True)
class NormKernels:
    """One op's kernels, a design each (see the module docstring)."""

    forward: object  # short rows, a tile per program
    forward_long_rows: object  # a row per program, two sweeps
    backward: object  # short rows, persistent programs, partial dw/db
    backward_stats: object  # long rows, pass 1
    backward_columns: object  # long rows, pass 2
    backward_held: object = None  # long rows held on chip across programs (CUDA), where the op has it
    # The widest input's element size -> HeldRows, the first that takes a row (none: no held kernel).
    held_setups: dict = field(default_factory=dict)
    held_words: int = 1  # words a segment publishes
    held_full_rows: bool = False  # the held kernel takes FULL: rows of whole segments, unmasked moments

    def __post_init__(self):
        if self.held_setups and self.backward_held is None:
            raise ValueError("NormKernels: held_setups name setups for a backward_held kernel, and there is none")


def held_layout(kernels: NormKernels, setup: HeldRows, n_cols: int, segment: int) -> dict:
    """The held kernel's constexprs that follow from its setup and the row: ROWS_AHEAD, and FULL
    (rows of whole segments) where the kernel takes it."""
    layout = {"ROWS_AHEAD": setup.rows_ahead}
    if kernels.held_full_rows:
        layout["FULL"] = n_cols % segment == 0
    return layout


LAYER_NORM_KERNELS = NormKernels(
    forward=layer_norm_forward_kernel,
    forward_long_rows=layer_norm_forward_long_rows_kernel,
    backward=layer_norm_backward_kernel,
    backward_stats=layer_norm_backward_stats_kernel,
    backward_columns=layer_norm_backward_columns_kernel,
    backward_held=layer_norm_backward_held_kernel,
    held_setups={  # see HeldRows
        2: (HeldRows(512, 1, 160, 12, 128, 16, rows_ahead=2), HeldRows(1024, 2, 160, 6, 128, 16, rows_ahead=2)),
        4: (HeldRows(512, 1, 160, 12, 128, 16), HeldRows(1024, 2, 160, 6, 128, 16)),
    },
    held_words=2,
    held_full_rows=True,
)

# --------------------------------------------------------------------------
# Picking a design and launching it.
# --------------------------------------------------------------------------

# Longest row normalized in one block, and how many warps share it.  A
# thread has at most 64K / threads registers (128 with 16 warps, 64 with
# 32).  The forward keeps x, w, b and y live: a 16384-column row on 32
# warps takes about 55 registers (ptxas, sm_90), on 16 warps it spills.  A
# 32768-column row on 32 warps (32 elements a thread) ran at 97% of copy
# bandwidth on an H100 (rms_norm bf16 4096x32768; 94% layer_norm), where
# the two-sweep long-row kernel got 64%; at 65536 it spills (48%).  The
# backward keeps x, dy, w, xhat, g and two accumulators live: see
# _BACKWARD_TILE_BYTES for its tiles.  float64 values take two registers: half
# the blocks and tiles on the GPU (float64 on CUDA is for tests, not speed).
# The interpreter has no registers, only a Python cost per program and step.
_MAX_BLOCK = {"cuda": 32768, "cpu": 1 << 16}
_MAX_BLOCK_BACKWARD = {"cuda": 8192, "cpu": 1 << 16}
# Short rows are stacked up to about _TILE elements a program (float32; half that for 16-bit
# rows on the GPU), 16 a thread.  H100, forward, % of a copy, tiles of 4096 elements (before)
# against 2048 and 1024 (docs/perf-notes.md, version 29): bf16 layer_norm at 262144x128 /
# 65536x256 / 16384x768 / 32768x1000 / 16384x1536: 96 / 93 / 86 / 95 / 96, 94 / 94 / 99 / 98
# / 98, 97 / 98 / 99 / 97 / 98; float32 at 65536x256 / 16384x768 / 16384x1536: 96 / 99 / 99,
# 97 / 99 / 97, 98 / 96 / 97.
_TILE = {"cuda": 2048, "cpu": 1 << 14}
# The forward loads w and b beside x (AFFINE_FIRST) for blocks of at most this many columns.
# H100, % of a copy, w and b after the reductions -> beside x, kept in L2: layer_norm
# float32 65536x256 / 16384x2048 / 16384x4096 98.0 / 97.2 / 97.5 -> 99.1 / 98.8 / 99.6, bf16
# 65536x256 / 32768x1000 / 16384x4096 92.6 / 94.1 / 99.1 -> 98.3 / 97.4 / 100.8; rms_norm
# fp16 16384x4096 99.7 -> 100.5.  Rows of 8192 columns and more (16-32 warps, 16 a thread)
# lost 10-30 points: w and b held through the reductions take a program an SM away, or spill.
# (docs/perf-notes.md, version 34.)
_AFFINE_FIRST_MAX_BLOCK = 4096
_CHUNK = {"cuda": 4096, "cpu": 1 << 14}  # long rows: columns per step

# The backward's programs (see _backward_programs).  Module-level so that a
# test can shrink them and reach every design with small tensors.
_PROGRAMS_PER_SM = 2  # CUDA, the long-row design's (row group, chunk) programs
# The short-row backward, one program an SM, each loading its next tile during this
# tile's math where a tile of the widest input is at most _LOAD_AHEAD_BYTES (the
# program then holds two tiles: 81-128 registers a thread, so a second program an SM
# would only queue behind the first).  A tile is about 16 KB of the widest input, 32
# bytes of it a thread: float32 4096 elements on 16 warps, 16-bit 8192 on 16 warps.
# Float32 tiles of 8192 columns (32 warps at their 64-register limit) spill loading
# ahead, and load after the store.  H100, layer_norm, % of a same-size copy:
#   version 27, loading ahead, one an SM (two an SM loading after the store before):
#   65536x256 / 4096x4096 / 16384x4096 / 8192x8192 / 16384x8192 / 262144x128 bf16
#   54 / 60 / 71 / 63 / 67 / 75 -> 61 / 67 / 76 / 82 / 84 / 73; float32 77 / 82 / 92
#   / 87 / 90 / 84 -> 84 / 88 / 93 / 82 / 84 / 91 (8192 columns after the store: 89 / 91);
#   version 28, 16-bit tiles of 4096 at 8 a thread -> 8192 at 16 a thread, bf16 at
#   262144x128 / 65536x256 / 65536x512 / 32768x1000 / 65536x1024 / 16384x3072 /
#   16384x4096 / 8192x8192: 73 / 61 / 70 / 67 / 75 / 60 / 76 / 86 -> 85 / 69 / 78 /
#   77 / 87 / 78 / 91 / 90.  Float32 tiles of 4096 at 16 a thread (8 warps, 160-188
#   registers) lost 1-23 points.
# 16-bit rows of a 2048-column block are the exception: 4 rows a tile on 16 warps ran at
# 50-63%, 2 rows on 8 warps at 63-78 one an SM (versions 27 and 28), and **two an SM** at 86-93
# (version 31: bf16 16384x2048 rms 81 -> 92, layer norm 75 -> 86).
# An input of fewer tiles than programs (a small one) leaves SMs idle and each program's one
# tile unhidden: its tiles are halved, down to _MIN_BACKWARD_TILE_BYTES.  Version 31, bf16
# 1024x1024, CUDA-graph time: rms 12.4 -> 8.2 µs (eager 9.4), layer norm 19.5 -> 12.8.
# (docs/perf-notes.md, versions 27, 28 and 31.)
_SHORT_ROW_PROGRAMS_PER_SM = 1
_LOAD_AHEAD_BYTES = 16384
_BACKWARD_TILE_BYTES = 16384
_MIN_BACKWARD_TILE_BYTES = 8192
_BACKWARD_THREAD_BYTES = 32
# (widest element's bytes, BLOCK_N): (tile elements, programs an SM), where the rule's setup measured worse
_BACKWARD_EXCEPTIONS = {(2, 2048): (4096, 2)}
_HELD_ROWS = {"cuda": True, "cpu": False}
_CPU_HELD_SEGMENT = 32
_MAX_SPINS = {"cuda": 1 << 16, "cpu": 0}  # polls of a row's words before computing its partials here
_CPU_PROGRAMS = 4  # the interpreter: few, as each costs Python time
_MIN_ROWS_PER_PROGRAM = 8  # keeps the scratch (rows of N float32) small next to x
# (BLOCK_P, BLOCK_N) of column_sum_kernel.  H100, µs for 132 / 264 partial rows of 1024 columns:
# (64, 32) 2.6 / 3.4, (256, 8) 2.2 / 2.4; of 4096 columns 3.6 / 6.5 against 3.0 / 4.6 (version 31).
_COLUMN_SUM_BLOCK = {"cuda": (256, 8), "cpu": (64, 1 << 12)}


def _register_limit(limits: dict, kind: str, dtype: torch.dtype) -> int:
    """An element limit from `limits`, halved for float64 on the GPU (two registers a value)."""
    return limits[kind] // 2 if kind == "cuda" and dtype == torch.float64 else limits[kind]


def _fits_a_block(n_cols: int, limits: dict, x: torch.Tensor) -> bool:
    """Whether a row of n_cols is held in one block (the short-row designs)."""
    return next_power_of_2(n_cols) <= _register_limit(limits, _kind(x.device), x.dtype)


def _row_tile(n_rows, n_cols: int, kind: str, dtype: torch.dtype = torch.float32) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) for short rows: a whole row across, rows stacked to about _TILE elements
    (half that for 16-bit rows on the GPU)."""
    block_n = next_power_of_2(n_cols)
    tile = _register_limit(_TILE, kind, dtype)
    if kind == "cuda" and dtype.itemsize == 2:
        tile //= 2  # measured, see _TILE
    return rows_in_tile(n_rows, block_n, tile), block_n


def _backward_tile(n_rows, n_cols: int, kind: str, widest: int, sms: int = 0) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, programs an SM) of the short-row backward, whose widest input
    has elements of `widest` bytes: about _BACKWARD_TILE_BYTES of it, _BACKWARD_THREAD_BYTES a
    thread, _SHORT_ROW_PROGRAMS_PER_SM, but for _BACKWARD_EXCEPTIONS; halved while the tiles are
    fewer than the programs `sms` SMs run."""
    if kind != "cuda":
        return (*_row_tile(n_rows, n_cols, kind), 1, _SHORT_ROW_PROGRAMS_PER_SM)
    block_n = next_power_of_2(n_cols)
    rule = (_BACKWARD_TILE_BYTES // widest, _SHORT_ROW_PROGRAMS_PER_SM)
    tile, per_sm = _BACKWARD_EXCEPTIONS.get((widest, block_n), rule)
    block_m = rows_in_tile(n_rows, block_n, tile)
    while block_m > 1 and block_m * block_n * widest > _MIN_BACKWARD_TILE_BYTES and cdiv(n_rows, block_m) < sms * per_sm:
        block_m //= 2
    return block_m, block_n, warps_for(block_m * block_n, per_thread=_BACKWARD_THREAD_BYTES // widest), per_sm


def _backward_programs(work_items, n_rows, device: torch.device, per_sm: int = _PROGRAMS_PER_SM) -> int:
    """How many programs share the backward, each writing one partial row.

    `per_sm` per SM, never more than the work items (tiles, or row groups),
    and at least _MIN_ROWS_PER_PROGRAM rows each: a program with one row
    would write a float32 partial as large as the row it read, and the
    column sum would read it all again."""
    bound = at_most(n_rows // _MIN_ROWS_PER_PROGRAM, _target_programs(device, per_sm))
    return max(1, at_most(work_items, bound))


def _target_programs(device: torch.device, per_sm: int = _PROGRAMS_PER_SM) -> int:
    return per_sm * _sm_count(device.index) if device.type == "cuda" else _CPU_PROGRAMS


def _launch(kernel, grid, *args, **constexprs):
    """Every launch goes through here (tests spy on it to see which design ran)."""
    launcher(kernel, args[0])[grid](*args, **constexprs)


def _rows(x: torch.Tensor, n_cols: int) -> int:
    return x.numel() // n_cols if n_cols else 0


def normalize(kernels: NormKernels, x, weight, bias, eps: float, n_cols: int, dtype: torch.dtype) -> torch.Tensor:
    """y, of `dtype`, for a contiguous x seen as rows of n_cols; weight and bias contiguous, of n_cols
    elements, or None.  The kernels load every input into the compute dtype and store y in its own."""
    y = torch.empty_like(x, dtype=dtype, memory_format=torch.contiguous_format)
    n_rows = _rows(x, n_cols)
    if n_rows == 0 or n_cols == 0:
        return y
    kind = _kind(x.device)
    # An absent weight or bias still takes a pointer argument: x stands in, never read.
    args = (x, x if weight is None else weight, x if bias is None else bias, y, n_rows, n_cols, eps)
    flags = {"HAS_WEIGHT": weight is not None, "HAS_BIAS": bias is not None}
    flags["COL_MULTIPLE"] = column_multiple(n_cols)  # see ops/_alignment.py
    if _fits_a_block(n_cols, _MAX_BLOCK, x):
        block_m, block_n = _row_tile(n_rows, n_cols, kind, x.dtype)
        grid = (cdiv(n_rows, block_m),)
        affine_first = block_n <= _AFFINE_FIRST_MAX_BLOCK
        _launch(
            kernels.forward, grid, *args, **flags, BLOCK_M=block_m, BLOCK_N=block_n, AFFINE_FIRST=affine_first,
            num_warps=warps_for(block_m * block_n),
        )  # fmt: skip
    else:
        chunk = _CHUNK[kind]
        _launch(kernels.forward_long_rows, (n_rows,), *args, **flags, BLOCK_M=1, BLOCK_N=chunk, num_warps=warps_for(chunk))
    return y


def normalize_backward(
    kernels: NormKernels, grad, x, weight, eps: float, n_cols: int, weight_grad: bool, bias_grad: bool, param_shape
) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(dx, dw, db) for contiguous grad and x seen as rows of n_cols; dw/db of
    param_shape and the weight's dtype (x's without one) when asked for, None otherwise."""
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    n_rows = _rows(x, n_cols)
    allocate = torch.zeros if n_rows == 0 else torch.empty  # a sum over no rows is 0
    param_dtype = x.dtype if weight is None else weight.dtype
    dw = allocate(param_shape, dtype=param_dtype, device=x.device) if weight_grad else None
    db = allocate(param_shape, dtype=param_dtype, device=x.device) if bias_grad else None
    if n_rows == 0 or n_cols == 0:
        return dx, dw, db
    kind = _kind(x.device)
    w = x if weight is None else weight
    col_multiple = column_multiple(n_cols)  # see ops/_alignment.py
    flags = {"HAS_WEIGHT": weight is not None, "WEIGHT_GRAD": weight_grad, "BIAS_GRAD": bias_grad}
    flags["COL_MULTIPLE"] = col_multiple

    widest = max(x.element_size(), grad.element_size())  # picks the tiles, or the held setup
    if _fits_a_block(n_cols, _MAX_BLOCK_BACKWARD, x):
        sms = _sm_count(x.device.index) if kind == "cuda" else 0
        block_m, block_n, warps, per_sm = _backward_tile(n_rows, n_cols, kind, widest, sms)
        n_programs = _backward_programs(cdiv(n_rows, block_m), n_rows, x.device, per_sm)
        dw_partial, db_partial = _partials(n_programs, n_cols, x, dx, weight_grad, bias_grad)
        load_ahead = block_m * block_n * widest <= _LOAD_AHEAD_BYTES
        _launch(
            kernels.backward, (n_programs,), grad, x, w, dx, dw_partial, db_partial, n_rows, n_cols, eps,
            **flags, BLOCK_M=block_m, BLOCK_N=block_n, LOAD_AHEAD=load_ahead, num_warps=warps,
        )  # fmt: skip
    elif (held := _held_plan(kernels, n_rows, n_cols, col_multiple, widest, x.device)):
        setup, segment, n_segments, rows_at_once = held
        dw_partial, db_partial = _partials(rows_at_once, n_cols, x, dx, weight_grad, bias_grad)
        words, overlap = held_rows_scratch(x, n_rows, kernels.held_words * n_segments)
        kernel = register_capped(kernels.backward_held, setup.warps, setup.registers)
        _launch(
            kernel, (rows_at_once * n_segments,), grad, x, w, dx, dw_partial, db_partial, words, n_rows, n_cols, eps,
            n_segments, rows_at_once, _MAX_SPINS[kind], **flags, **overlap,
            SEGMENT=segment, SEGMENTS_BLOCK=words_block(setup.warps, n_segments),
            **held_layout(kernels, setup, n_cols, segment),
        )  # fmt: skip
    else:
        chunk = _CHUNK[kind]
        stats = torch.empty(n_rows, _STATS, dtype=_compute_dtype(x), device=x.device)
        _launch(
            kernels.backward_stats, (n_rows,), grad, x, w, stats, n_cols, eps,
            HAS_WEIGHT=weight is not None, BLOCK_N=chunk, COL_MULTIPLE=col_multiple,
            num_warps=warps_for(chunk, per_thread=8),
        )  # fmt: skip
        n_chunks = cdiv(n_cols, chunk)
        # About as many programs as the short-row design, spread over the chunks.
        n_groups = _backward_programs(cdiv(_target_programs(x.device), n_chunks), n_rows, x.device)
        dw_partial, db_partial = _partials(n_groups, n_cols, x, dx, weight_grad, bias_grad)
        _launch(
            kernels.backward_columns, (n_groups, n_chunks), grad, x, w, stats, dx, dw_partial, db_partial,
            n_rows, n_cols, **flags, BLOCK_N=chunk, num_warps=warps_for(chunk, per_thread=8),
        )  # fmt: skip
    _column_sums([(p, t) for p, t in ((dw_partial, dw), (db_partial, db)) if t is not None], n_cols, col_multiple)
    return dx, dw, db


def _held_plan(kernels: NormKernels, n_rows: int, n_cols: int, col_multiple: int, widest: int, device: torch.device):
    """(setup, segment, n_segments, rows_at_once) for backward rows held on chip across
    programs; None where they are not: an op without that kernel, off on this kind of
    device, float64, or a row no setup takes (more segments than its max_segments, a
    row length whose column_multiple is not a multiple of the setup's col_multiple,
    or more segments than the grid holds)."""
    kind = _kind(device)
    setups = kernels.held_setups.get(widest, ())
    if not setups or not _HELD_ROWS[kind]:
        return None
    if kind == "cpu":
        setup, programs, segment = setups[0], _CPU_PROGRAMS, _CPU_HELD_SEGMENT
    else:
        takes = (
            s for s in setups
            if (s.max_segments is None or cdiv(n_cols, s.segment) <= s.max_segments)
            and col_multiple % s.col_multiple == 0
        )  # fmt: skip
        setup = next(takes, None)
        if setup is None:
            return None
        segment = setup.segment
        programs = programs_at_once(device, setup.warps, setup.registers, setup.programs_per_sm)
    found = plan(n_rows, cdiv(n_cols, segment), programs)
    return None if found is None else (setup, segment, *found)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _partials(n_programs: int, n_cols: int, x, dx, weight_grad: bool, bias_grad: bool):
    """The (n_programs, n_cols) scratches of the first reduction stage; dx
    stands in for one not asked for (its pointer is never written)."""

    def scratch(wanted):
        return torch.empty(n_programs, n_cols, dtype=_compute_dtype(x), device=x.device) if wanted else dx

    return scratch(weight_grad), scratch(bias_grad)


def _column_sums(sums: list, n_cols: int, col_multiple: int) -> None:
    """For each (partial, out) of `sums` (one or two), out = the column sums of partial, in one launch.

    With one, the kernel gets it in both slots and TWO_SUMS off, so that it stores to one
    pointer only: under torch.compile a tensor passed to two pointers that a kernel may
    store to is cloned for each, and only one clone's writes are kept."""
    if not sums:
        return
    (first_partial, first_out), (second_partial, second_out) = sums[0], sums[-1]
    block_p, block_n = _COLUMN_SUM_BLOCK[_kind(first_out.device)]
    block_n = min(block_n, next_power_of_2(n_cols))
    _launch(
        column_sum_kernel, (cdiv(n_cols, block_n), len(sums)), first_partial, second_partial, first_out, second_out,
        first_partial.shape[0], n_cols, TWO_SUMS=len(sums) == 2, BLOCK_P=block_p, BLOCK_N=block_n,
        COL_MULTIPLE=col_multiple, num_warps=4,
    )  # fmt: skip


# --------------------------------------------------------------------------
# The op: checks, then the shared launchers.
# --------------------------------------------------------------------------


def check_param(op: str, arg: str, t: Optional[torch.Tensor], x: torch.Tensor, shape: tuple) -> None:
    """A weight or bias: None, or a tensor of `shape` on x's device, of x's dtype or, for a 16-bit
    x, float32: PyTorch's norms take float32 parameters with 16-bit inputs too (mixed-precision
    models keep them so), computing in float32 and returning x's dtype; so do these kernels."""
    if t is None:
        return
    check_tensor(op, arg, t)
    if t.device != x.device:
        raise ValueError(f"tk.{op}: x is on {x.device} but {arg} is on {t.device}")
    if t.dtype not in param_dtypes(x):
        allowed = " or ".join(map(str, param_dtypes(x)))
        raise TypeError(f"tk.{op}: x has dtype {x.dtype}, so {arg} must have dtype {allowed}, not {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"tk.{op}: {arg} has shape {tuple(t.shape)}, expected {tuple(shape)}")


def norm_dtype(op: str, x: torch.Tensor, dtype: Optional[torch.dtype]) -> torch.dtype:
    """A norm's `dtype` argument: x's dtype when None, or float32 for a 16-bit x, which is then
    read as it is (what PyTorch's autocast asks of its norms on CUDA, without its copy of x)."""
    if dtype is None or _can_be_result(x.dtype, dtype):
        return x.dtype if dtype is None else dtype
    raise TypeError(f"tk.{op}: dtype {dtype} is not supported for x of dtype {x.dtype}; {_RESULT_DTYPES}")


_RESULT_DTYPES = "a norm's result has x's dtype, or float32 for a float16 or bfloat16 x"


def _can_be_result(x_dtype: torch.dtype, dtype: torch.dtype) -> bool:
    return dtype == x_dtype or reads_as_float32(x_dtype, dtype)


def check_grad(op: str, grad: torch.Tensor, x: torch.Tensor) -> None:
    """The gradient of a norm's result: x's shape and device, and a dtype the result can have."""
    check_tensor(op, "grad", grad)
    check_tensor(op, "x", x)
    if grad.device != x.device:
        raise ValueError(f"tk.{op}: grad is on {grad.device} but x is on {x.device}")
    if not _can_be_result(x.dtype, grad.dtype):
        raise TypeError(f"tk.{op}: grad has dtype {grad.dtype} but x has dtype {x.dtype}; {_RESULT_DTYPES}")
    if grad.shape != x.shape:
        raise ValueError(f"tk.{op}: grad has shape {tuple(grad.shape)} but x has {tuple(x.shape)}")


def param_dtypes(x: torch.Tensor) -> tuple[torch.dtype, ...]:
    return (x.dtype, torch.float32) if x.dtype in (torch.float16, torch.bfloat16) else (x.dtype,)


def _normalized_size(op: str, x: torch.Tensor, normalized_shape) -> int:
    """N, the product of the normalized dims, after checking they are x's trailing dims."""
    shape = tuple(normalized_shape)
    if len(shape) == 0:
        raise ValueError(f"tk.{op}: normalized_shape must name at least one dim, got []")
    if len(shape) > x.dim() or tuple(x.shape[x.dim() - len(shape) :]) != shape:
        raise ValueError(
            f"tk.{op}: normalized_shape {list(shape)} must be the trailing dims of x, of shape {tuple(x.shape)}"
        )
    n = 1
    for s in shape:
        n *= s
    return int(n)  # under torch.compile, the row length is specialized: it picks the block size


def _contiguous(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.contiguous()


def _layer_norm(
    x: torch.Tensor,
    normalized_shape: list[int],
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
    dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    """As F.layer_norm; `dtype` (None: x's) may be float32 for a 16-bit x, which is then read as it is."""
    check_tensor("layer_norm", "x", x)
    dtype = norm_dtype("layer_norm", x, dtype)
    n_cols = _normalized_size("layer_norm", x, normalized_shape)
    check_param("layer_norm", "weight", weight, x, normalized_shape)
    check_param("layer_norm", "bias", bias, x, normalized_shape)
    if bias is not None and bias.dtype != (x if weight is None else weight).dtype:
        # The backward sees the weight, not the bias, and gives dbias the weight's dtype (x's without one).
        raise TypeError(
            f"tk.layer_norm: bias has dtype {bias.dtype} but "
            + (f"weight has dtype {weight.dtype}" if weight is not None else f"there is no weight and x has dtype {x.dtype}")
            + "; give them one dtype"
        )
    return normalize(LAYER_NORM_KERNELS, x.contiguous(), _contiguous(weight), _contiguous(bias), eps, n_cols, dtype)


def _layer_norm_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    normalized_shape: list[int],
    weight: Optional[torch.Tensor],
    eps: float,
    weight_grad: bool,
    bias_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight, dbias).  dx has x's dtype, grad may be float32 for a 16-bit x (a result asked
    for in float32).  dweight (dbias) has normalized_shape when weight_grad (bias_grad) is True,
    and is an empty tensor otherwise: an op cannot return None."""
    check_grad("layer_norm_backward", grad, x)
    n_cols = _normalized_size("layer_norm_backward", x, normalized_shape)
    check_param("layer_norm_backward", "weight", weight, x, normalized_shape)
    if weight_grad and weight is None:
        raise ValueError("tk.layer_norm_backward: weight_grad=True needs the weight")
    dx, dw, db = normalize_backward(
        LAYER_NORM_KERNELS, grad.contiguous(), x.contiguous(), _contiguous(weight), eps, n_cols,
        weight_grad, bias_grad, tuple(normalized_shape),
    )  # fmt: skip
    return dx, x.new_empty(0) if dw is None else dw, x.new_empty(0) if db is None else db


layer_norm = register_op("layer_norm", _layer_norm)
layer_norm_backward = register_op("layer_norm_backward", _layer_norm_backward)
# Under autocast, as F.layer_norm: a float32 result on CUDA (x read as it is, weight and
# bias cast to float32), inputs as they come on the CPU.
follow_autocast("layer_norm", {"cuda": FLOAT32_RESULT})


# x and weight are saved; mean and rstd are recomputed (see the module docstring).
register_formula(
    layer_norm,
    backward=layer_norm_backward,
    arguments=(GRAD, "x", "normalized_shape", "weight", "eps", needs_grad("weight"), needs_grad("bias")),
    gradients={"x": 0, "weight": 1, "bias": 2},
)


# --------------------------------------------------------------------------
# What the comparison harness reads.
# --------------------------------------------------------------------------

EPS = 1e-5  # F.layer_norm's default


def _make_inputs(shape, dtype, device):
    """x, and a fixed weight and bias near PyTorch's initial ones (1 and 0), not equal to them."""
    n = shape[-1]
    weight = 1 + 0.1 * torch.randn(n, dtype=dtype, device=device)
    bias = 0.1 * torch.randn(n, dtype=dtype, device=device)
    return torch.randn(shape, dtype=dtype, device=device), weight, bias


def _liger_layer_norm():
    from liger_kernel.transformers.functional import liger_layer_norm  # optional peer

    return lambda x, weight, bias: liger_layer_norm(x, weight, bias, EPS)


# cuda: from launch-bound (2 MB in bfloat16) to hundreds of MB; (16384, 8192)
# and (4096, 32768) move the same bytes through the short- and long-row designs.
NORM_SHAPES = {
    "cuda": [(1024, 1024), (65536, 256), (16384, 2048), (4096, 4096), (16384, 4096), (8192, 8192), (16384, 8192), (4096, 32768)],
    "cpu": [(64, 1000), (4, 70_001)],
}
NORM_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float64: 1e-7}

register_spec(
    OpSpec(
        name="layer_norm",
        tk=lambda x, weight, bias: torch.ops.tk.layer_norm(x, [x.shape[-1]], weight, bias, EPS),
        reference=lambda x, weight, bias: F.layer_norm(x, (x.shape[-1],), weight, bias, EPS),
        make_inputs=_make_inputs,
        # read x, write y, read weight and bias
        bytes_moved=lambda shape, dtype: (2 * math.prod(shape) + 2 * shape[-1]) * torch.empty((), dtype=dtype).element_size(),
        # sum; subtract, square, sum; subtract, scale by rstd; times w, plus b
        flops=lambda shape, dtype: 8 * math.prod(shape),
        tolerance=NORM_TOLERANCE,
        shapes=NORM_SHAPES,
        peers={"liger": _liger_layer_norm},
    )
)


def _make_backward_inputs(shape, dtype, device):
    """grad, x, weight, bias, and the mean and rstd PyTorch's forward saves for its backward
    (tk recomputes them: see the module docstring)."""
    x, weight, bias = _make_inputs(shape, dtype, device)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [shape[-1]], weight, bias, EPS)
    return torch.randn(shape, dtype=dtype, device=device), x, weight, bias, mean, rstd


# The backward on its own, every gradient asked for: (dx, dweight, dbias), against the
# aten kernel eager autograd runs (with the statistics its forward saved) and Inductor's.
register_spec(
    OpSpec(
        name="layer_norm_backward",
        tk=lambda grad, x, weight, bias, mean, rstd: torch.ops.tk.layer_norm_backward(
            grad, x, [x.shape[-1]], weight, EPS, True, True
        ),
        reference=lambda grad, x, weight, bias, mean, rstd: torch.ops.aten.native_layer_norm_backward(
            grad, x, [x.shape[-1]], mean, rstd, weight, bias, [True, True, True]
        ),
        make_inputs=_make_backward_inputs,
        # read grad and x, write dx; read weight, write dweight and dbias
        bytes_moved=lambda shape, dtype: (3 * math.prod(shape) + 3 * shape[-1]) * torch.empty((), dtype=dtype).element_size(),
        # xhat (2), g = dy * w, the two row sums (4), dx (4), dweight and dbias (3)
        flops=lambda shape, dtype: 13 * math.prod(shape),
        tolerance=NORM_TOLERANCE,
        shapes=NORM_SHAPES,
    )
)
