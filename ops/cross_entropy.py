"""Cross entropy of logits against class indices, forward and backward, fused.

For a row x of C logits, its target class t and label smoothing s:

    lse    = log(sum_c exp(x_c))                      the row's logsumexp
    loss   = (1 - s) * (lse - x_t) + s * (lse - sum_c x_c / C)
    dx_c   = (exp(x_c - lse) - (1 - s) * [c == t] - s / C) * g

where g is the incoming gradient of the row's loss (divided by the number
of kept rows for reduction="mean").  A row whose target is ``ignore_index``
has loss 0 and gradient 0, and is not even read.  This is
``torch.nn.functional.cross_entropy`` for (N, C) logits (or unbatched (C,)
logits) and int64 targets, without class weights.

The softmax is never materialized.  With vocabularies of 128k+ columns a
row is too long for one block, so the forward runs one program per row
that sweeps the row once in chunks, keeping a running maximum m and a
running sum of exp(x - m), rescaled by exp(m_old - m_new) whenever the
maximum grows (the *online* logsumexp).  x_t is a single extra load.  Rows
of a few hundred classes are stacked several to a program instead, in both
directions.  The forward writes each row's loss and its logsumexp; the
backward reads the logits once more and recomputes exp(x - lse) from the
saved logsumexp, so a training step reads the logits twice and writes the
gradient once, the least a backward that cannot keep the logits on chip can
do.  (Its long rows that start off a 16-byte boundary, as every 50257-class
row but one in eight does, are swept from the boundary: see _sweep_peeled.)

    torch.ops.tk.cross_entropy            the user-facing op; a thin composite
                                          over the two ops below, so that
                                          autograd sees the forward op and can
                                          keep its logsumexp
    torch.ops.tk.cross_entropy_forward    (loss, lse); lse is not differentiable
    torch.ops.tk.cross_entropy_backward   dlogits from (grad, logits, target, lse)

Out-of-range targets (not in [0, C) and not ``ignore_index``): PyTorch raises
on the CPU and asserts on CUDA; an op here cannot read the targets on the
host, so instead the row's loss is NaN (so are a "mean" or "sum" over it) and
so is its gradient.  No memory outside the row is read.

Precision: logits are read in their dtype and every sum, exp and log is done
in float32 (float64 for float64 logits).  The saved logsumexp is a float32
number (as in flash attention), so the recomputed softmax carries a relative
error of about |lse| * 6e-8: 1e-6 for logits of magnitude 20.  On a GPU exp
flushes results under 2**-126 to 0 (ops/_math.py): a gradient's probabilities
that small come out 0.
``label_smoothing`` reaches the kernels as a float32 scalar, as every Python
float argument of a Triton kernel does: exact for values such as 0.25,
within 1e-8 for 0.1.
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._alignment import column_multiple, known_multiple
from ._device import kind as _kind
from ._launch import cdiv, next_power_of_2, rows_in_tile, warps_for
from ._math import exp
from ._registry import (
    FLOAT32_RESULT,
    NAMESPACE,
    OpSpec,
    check_tensor,
    follow_autocast,
    launcher,
    register_op,
    register_spec,
    result_dtype,
)

REDUCTIONS = ("none", "mean", "sum")


# --------------------------------------------------------------------------
# Pieces shared by the kernels.
# --------------------------------------------------------------------------


@triton.jit
def _in_sweep(cols, end, kept, START: tl.constexpr):
    """Which of `cols` a row sweep reads: from START (0, or a peeled row's first whole run) to `end`,
    in kept rows.  (Made as (cols < end) & kept, not cols < where(kept, end, 0): the compiler sees
    through the first that a 16-byte run of a row is all in or all out, not the second.)"""
    inside = (cols < end) & kept
    if START > 0:
        inside = inside & (cols >= START)
    return inside


@triton.jit
def _load_logits(ptrs, inside):
    """The logits at `ptrs` where `inside`; the others read as -inf, which adds exp(-inf) = 0."""
    x = tl.load(ptrs, mask=inside, other=-float("inf"))
    if x.dtype != tl.float64:  # resolved at compile time: half and float32 compute in float32
        x = x.to(tl.float32)
    return x


@triton.jit
def _peeled_frame(row, n_cols, VEC: tl.constexpr):
    """(frame, skew, body_end) of contiguous row `row` swept from the 16-byte boundary at or before its
    start (VEC elements a run): the frame's first element, the row's first column's place in the frame
    (column = place - skew), and the end of the runs wholly in the row, a multiple of VEC.  The run
    before VEC and the one from body_end hold the row's partial ends."""
    row_start = row.to(tl.int64) * n_cols
    frame = known_multiple(row_start, VEC)
    skew = (row_start - frame).to(tl.int32)
    return frame, skew, known_multiple(skew + n_cols, VEC)


@triton.jit
def _merge_chunk(run_max, run_sum, x):
    """The running max and sum of exp(x - max) of each row, with the chunk x (rows by columns) added."""
    new_max = tl.maximum(run_max, tl.max(x, axis=1))
    shift = _finite_or_zero(new_max)
    # Rescale the sum so far from the old max to the new one, then add this chunk.
    return new_max, run_sum * exp(run_max - shift) + tl.sum(exp(x - shift[:, None]), axis=1)


@triton.jit
def _finite_or_zero(row_max):
    """The shift for exp() in the online sum.  While every value seen is -inf,
    shift by 0 instead: exp(-inf - -inf) would be NaN and poison the sum."""
    return tl.where(row_max == -float("inf"), 0.0, row_max)


@triton.jit
def _classify_target(target_ptr, rows, n_rows, n_cols, ignore_index):
    """(target, ignored, in_range) of `rows`: their classes, whether each is skipped (a row
    past the last is, too), and whether a kept row's class is a valid column."""
    target = tl.load(target_ptr + rows, mask=rows < n_rows, other=ignore_index)
    ignored = target == ignore_index
    in_range = (target >= 0) & (target < n_cols)
    return target, ignored, in_range


# --------------------------------------------------------------------------
# Forward: one program per row.
# --------------------------------------------------------------------------


@triton.jit
def cross_entropy_forward_kernel(
    logits_ptr, target_ptr, loss_ptr, lse_ptr, ticket_ptr,
    n_rows, n_cols, row_stride, ignore_index, label_smoothing,
    SMOOTHING: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_SIZE: tl.constexpr, COL_MULTIPLE: tl.constexpr,
    PEEL: tl.constexpr, ZERO_TICKET: tl.constexpr,
):  # fmt: skip
    """Each row's loss and logsumexp, in one sweep over its logits.

    A program takes BLOCK_M rows (short rows are stacked into a tile; long
    rows are one a program) and sweeps them in BLOCK_SIZE-column chunks,
    each chunk's load issued before the previous chunk is reduced, so that
    memory is busy while the program computes.  The row loads wait only on
    the targets (an ignored row is not read); x_t is loaded with them.

    PEEL (the elements in 16 bytes, or 0): one contiguous row that does not
    start on a 16-byte boundary, swept from the boundary before it, its first
    and last partial runs apart (as the backward's _sweep_peeled does).

    ZERO_TICKET: program 0 sets the reduce kernel's ticket to 0 (see there)."""
    if ZERO_TICKET:
        if tl.program_id(0) == 0:
            tl.store(ticket_ptr, 0)
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    row_stride = known_multiple(row_stride, COL_MULTIPLE)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # int64: row * row_stride may pass 2**31
    target, ignored, in_range = _classify_target(target_ptr, rows, n_rows, n_cols, ignore_index)
    row_ptrs = logits_ptr + rows[:, None] * row_stride
    # An ignored row (or one past the last) reads nothing: every load below is masked off for it.
    kept = (~ignored)[:, None]
    x_target = tl.load(logits_ptr + rows * row_stride + target, mask=in_range & ~ignored, other=0.0)
    if PEEL:  # columns counted from the 16-byte boundary at or before the row's start
        frame, skew, sweep_end = _peeled_frame(tl.program_id(0), n_cols, PEEL)
        sweep_ptrs = logits_ptr + frame
    else:
        sweep_ptrs = row_ptrs
        sweep_end = n_cols

    # The first chunk starts the running max and sum, so they take the compute
    # dtype (float32, or float64) from the data: Triton on CUDA refuses a loop
    # variable whose type would change from float32 to float64 inside the loop.
    cols = tl.arange(0, BLOCK_SIZE)[None, :]
    inside = _in_sweep(cols, sweep_end, kept, PEEL)
    x = _load_logits(sweep_ptrs + cols, inside)
    # All masked off (no traffic) for rows of one chunk.
    x_next = _load_logits(sweep_ptrs + BLOCK_SIZE + cols, _in_sweep(BLOCK_SIZE + cols, sweep_end, kept, PEEL))
    run_max = tl.max(x, axis=1)
    run_sum = tl.sum(exp(x - _finite_or_zero(run_max)[:, None]), axis=1)
    if SMOOTHING:
        # mean(x) - anchor, for the smoothing term's mean logit, as a running
        # sum of (x - anchor) / n (masked lanes add 0, not -inf).  Summing x
        # itself cancels: logits of -1e4 +- 3 over 70001 columns lost 1e-5 of
        # the loss in float32.  The anchor is the first chunk's mean finite
        # logit, and each term is divided by n before it is added, so the sum
        # stays within the range of the logits (one logit of 1e38 among 70001
        # pushed a plain sum of x - anchor past float32's range).
        finite = inside & (x == x) & (tl.abs(x) < float("inf"))
        anchor = tl.sum(tl.where(finite, x, 0.0), axis=1) / tl.maximum(tl.sum(finite.to(x.dtype), axis=1), 1.0)
        run_mean = tl.sum(tl.where(inside, (x - anchor[:, None]) / n_cols, 0.0), axis=1)
    last = tl.max(tl.where(ignored, 0, sweep_end))  # 0 when every row is ignored: no chunk loop at all
    for chunk in range(BLOCK_SIZE, last, BLOCK_SIZE):
        x = x_next
        x_next = _load_logits(
            sweep_ptrs + chunk + BLOCK_SIZE + cols, _in_sweep(chunk + BLOCK_SIZE + cols, sweep_end, kept, PEEL)
        )
        run_max, run_sum = _merge_chunk(run_max, run_sum, x)
        if SMOOTHING:
            inside = _in_sweep(chunk + cols, sweep_end, kept, PEEL)
            run_mean += tl.sum(tl.where(inside, (x - anchor[:, None]) / n_cols, 0.0), axis=1)
    if PEEL:  # the row's first partial run, [0, PEEL), and its last, [sweep_end, sweep_end + PEEL)
        for edge in tl.static_range(2):
            # Names apart from the loop's above: Triton would carry a shared one into it, of another shape.
            run = edge * sweep_end + tl.arange(0, PEEL)[None, :]
            in_row = (run >= skew) & (run < skew + n_cols) & kept
            x_run = _load_logits(sweep_ptrs + run, in_row)
            run_max, run_sum = _merge_chunk(run_max, run_sum, x_run)
            if SMOOTHING:
                run_mean += tl.sum(tl.where(in_row, (x_run - anchor[:, None]) / n_cols, 0.0), axis=1)
    # An ignored row summed nothing: log(1) instead of log(0), its lse is unused.
    log_sum = tl.log(tl.where(ignored, 1.0, run_sum))
    lse = run_max + log_sum

    # (max - x_t) + log_sum rather than lse - x_t: with logits of 1e9, lse
    # would round log_sum away.  An all -inf row gives -inf - -inf = NaN, as in PyTorch.
    loss = (run_max - x_target.to(lse.dtype)) + log_sum
    if SMOOTHING:  # resolved at compile time: with s = 0 a -inf logit must not turn 0 * -inf into NaN
        smoothing = tl.cast(label_smoothing, lse.dtype)
        loss = (1.0 - smoothing) * loss + smoothing * (((run_max - anchor) - run_mean) + log_sum)
    loss = tl.where(in_range, loss, float("nan"))  # an out-of-range target: NaN, see the module docstring
    exists = rows < n_rows
    tl.store(loss_ptr + rows, tl.where(ignored, 0.0, loss).to(loss_ptr.dtype.element_ty), mask=exists)
    tl.store(lse_ptr + rows, tl.where(ignored, 0.0, lse), mask=exists)  # 0 keeps exp(x - lse) finite in the backward


@triton.jit
def _kept_rows(target_ptr, rows, n_rows, ignore_index):
    """1 for each of `rows` that exists and is not ignored, 0 otherwise (int32)."""
    target = tl.load(target_ptr + rows, mask=rows < n_rows, other=ignore_index)
    return (target != ignore_index).to(tl.int32)


@triton.jit
def _part_rows(n_rows, rows_per_part):
    """This program's part of the N rows: its first row (int64) and one past its last."""
    first = tl.program_id(0).to(tl.int64) * rows_per_part
    return first, tl.minimum(first + rows_per_part, n_rows)


@triton.jit
def cross_entropy_reduce_kernel(
    row_loss_ptr, target_ptr, part_sum_ptr, part_kept_ptr, ticket_ptr, out_ptr,
    n_rows, rows_per_part, ignore_index,
    MEAN: tl.constexpr, BLOCK_SIZE: tl.constexpr, MAX_PARTS: tl.constexpr,
):  # fmt: skip
    """The sum of the row losses, divided by the number of kept rows for MEAN.

    Two steps in one launch.  Each program sums its part of the rows (a
    partial sum and a count of kept rows) and takes a ticket; the program
    that draws the last ticket adds the partials up, in part order.  Which
    program that is changes from run to run, the order of the additions does
    not: the result has the same bits every time (no float atomics).  The
    ticket starts at 0: the forward row kernel, which runs just before on the
    same stream, zeroes it (ZERO_TICKET).  A program's stores reach the
    others before its ticket (the atomic releases them), and the last one's
    loads come after its ticket (it acquires them).  One part needs no ticket.
    No kept row at all gives 0 / 0 = NaN for the mean, as in PyTorch.
    """
    first, end = _part_rows(n_rows, rows_per_part)
    rows = first + tl.arange(0, BLOCK_SIZE)
    total = tl.load(row_loss_ptr + rows, mask=rows < end, other=0.0)  # sets the dtype: float32 or float64
    kept = _kept_rows(target_ptr, rows, end, ignore_index)
    for chunk in range(first + BLOCK_SIZE, end, BLOCK_SIZE):
        rows = chunk + tl.arange(0, BLOCK_SIZE)
        total += tl.load(row_loss_ptr + rows, mask=rows < end, other=0.0)
        kept += _kept_rows(target_ptr, rows, end, ignore_index)
    total, kept = tl.sum(total, axis=0), tl.sum(kept, axis=0)
    n_parts = tl.num_programs(0)
    if n_parts > 1:
        tl.store(part_sum_ptr + tl.program_id(0), total)
        tl.store(part_kept_ptr + tl.program_id(0), kept)
        if tl.atomic_add(ticket_ptr, 1, sem="acq_rel") == n_parts - 1:
            parts = tl.arange(0, MAX_PARTS)
            # .cg: from L2, where the other programs' partials are, not from this SM's L1
            total = tl.sum(tl.load(part_sum_ptr + parts, mask=parts < n_parts, other=0.0, cache_modifier=".cg"))
            kept = tl.sum(tl.load(part_kept_ptr + parts, mask=parts < n_parts, other=0, cache_modifier=".cg"))
            _store_loss(out_ptr, total, kept, MEAN)
    else:
        _store_loss(out_ptr, total, kept, MEAN)


@triton.jit
def _store_loss(out_ptr, total, kept, MEAN: tl.constexpr):
    if MEAN:
        total = total / kept.to(total.dtype)
    tl.store(out_ptr, total.to(out_ptr.dtype.element_ty))


# --------------------------------------------------------------------------
# Backward: row tiles, one read of the logits, one write.
# --------------------------------------------------------------------------


@triton.jit
def cross_entropy_count_kernel(
    target_ptr, part_kept_ptr, n_rows, rows_per_part, ignore_index, BLOCK_SIZE: tl.constexpr
):
    """reduction="mean": each program counts the kept rows of its part.  The backward row kernel
    adds the counts up itself (MEAN_PARTS), so no program waits for another."""
    first, end = _part_rows(n_rows, rows_per_part)
    kept = _kept_rows(target_ptr, first + tl.arange(0, BLOCK_SIZE), end, ignore_index)
    for chunk in range(first + BLOCK_SIZE, end, BLOCK_SIZE):
        kept += _kept_rows(target_ptr, chunk + tl.arange(0, BLOCK_SIZE), end, ignore_index)
    tl.store(part_kept_ptr + tl.program_id(0), tl.sum(kept, axis=0))


@triton.jit
def cross_entropy_backward_kernel(
    logits_ptr, target_ptr, lse_ptr, scale_ptr, part_kept_ptr, dlogits_ptr,
    n_rows, n_cols, row_stride, scale_stride, n_parts, ignore_index, label_smoothing,
    BLOCK_M: tl.constexpr, BLOCK_SIZE: tl.constexpr, COL_MULTIPLE: tl.constexpr, PEEL: tl.constexpr,
    MEAN_PARTS: tl.constexpr,
):  # fmt: skip
    """dx = (exp(x - lse) - (1 - s) * onehot(t) - s / C) * g over a tile of BLOCK_M rows.

    With the logsumexp saved by the forward, each element's gradient needs
    only its own logit and three numbers of its row (lse, t, g).  A program
    reads those once and sweeps its rows in BLOCK_SIZE-column chunks: short
    rows are stacked BLOCK_M to a tile, a long row is one program's.

    g is read at row * scale_stride: the (N,) gradient of reduction="none"
    (stride 0 when it was expanded from a scalar), or one scalar for "sum"
    and "mean" (stride 0).  For "mean" (MEAN_PARTS, a power of two >= n_parts)
    it is divided by the number of kept rows, which each program adds up from
    cross_entropy_count_kernel's n_parts counts (a few hundred bytes from L2).

    PEEL (the elements in 16 bytes, or 0): one contiguous row that does not
    start on a 16-byte boundary, swept as _sweep_peeled does.
    """
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    row_stride = known_multiple(row_stride, COL_MULTIPLE)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # int64: row * n_cols may pass 2**31
    target, ignored, in_range = _classify_target(target_ptr, rows, n_rows, n_cols, ignore_index)
    exists = rows < n_rows
    lse = tl.load(lse_ptr + rows, mask=exists, other=0.0)  # float32, or float64: the compute dtype
    scale = tl.load(scale_ptr + rows * scale_stride, mask=exists, other=0.0).to(lse.dtype)
    if MEAN_PARTS:
        parts = tl.arange(0, MEAN_PARTS)
        n_kept = tl.sum(tl.load(part_kept_ptr + parts, mask=parts < n_parts, other=0), axis=0)
        # No kept row: every row's gradient is 0 whatever the scale; 1 avoids a division by 0.
        scale = scale / tl.maximum(n_kept, 1).to(scale.dtype)
    scale = tl.where(in_range, scale, float("nan"))  # an out-of-range target: a NaN row
    scale = tl.where(ignored, 0.0, scale)  # ignored: exactly 0, whatever the incoming gradient
    smoothing = tl.cast(label_smoothing, lse.dtype)  # float64 logits: s / C in float64
    smooth = smoothing / n_cols
    target_weight = 1.0 - smoothing

    # Per-row values as (BLOCK_M, 1) columns, to broadcast over the tile.
    lse, scale, target = lse[:, None], scale[:, None], target[:, None]
    kept, exists = (~ignored)[:, None], exists[:, None]  # an ignored row is written (zeros), never read
    row_values = (target, lse, scale, smooth, target_weight)
    if PEEL:
        _sweep_peeled(logits_ptr, dlogits_ptr, tl.program_id(0), n_cols, kept, row_values, PEEL, BLOCK_SIZE)
    else:
        row_ptrs = logits_ptr + rows[:, None] * row_stride
        out_ptrs = dlogits_ptr + rows[:, None] * n_cols  # dlogits is a fresh contiguous (N, C) tensor
        for chunk in range(0, n_cols, BLOCK_SIZE):
            cols = chunk + tl.arange(0, BLOCK_SIZE)[None, :]
            x = tl.load(row_ptrs + cols, mask=(cols < n_cols) & kept, other=0.0)
            grad = _logit_gradient(x, cols, row_values)
            tl.store(out_ptrs + cols, grad.to(dlogits_ptr.dtype.element_ty), mask=(cols < n_cols) & exists)


@triton.jit
def _logit_gradient(x, cols, row_values):
    """(exp(x - lse) - (1 - s) * [col == t] - s / C) * g for logits x at columns `cols`."""
    target, lse, scale, smooth, target_weight = row_values
    if x.dtype != tl.float64:  # resolved at compile time
        x = x.to(tl.float32)
    probs = exp(x - lse)  # softmax, recomputed from the saved logsumexp
    return (probs - smooth - tl.where(cols == target, target_weight, 0.0)) * scale


@triton.jit
def _sweep_peeled(
    logits_ptr, dlogits_ptr, row, n_cols, kept, row_values, VEC: tl.constexpr, BLOCK_SIZE: tl.constexpr
):
    """The gradient of one row of contiguous logits that starts `skew` elements past a 16-byte
    boundary (rows of 50257 columns: every row but one in 8), swept so that its accesses are 16
    bytes wide.

    Chunks counted from the row's first element would cut every 16-byte run in two, and Triton
    then moves one element an access.  So the sweep counts in a frame that starts at the boundary
    (frame index f is column f - skew), and its masks are bounds that are multiples of VEC, the
    elements in 16 bytes: the runs between the row's first and last partial runs.  Those two, VEC
    elements each, are done apart, masked element by element (the row is 2 * VEC long at least,
    so that they are two runs, not one)."""
    frame, skew, body_end = _peeled_frame(row, n_cols, VEC)
    end = skew + n_cols  # one past the row's last element, in the frame
    in_ptr, out_ptr = logits_ptr + frame, dlogits_ptr + frame
    for edge in tl.static_range(2):  # the first partial run, [0, VEC), and the last, [body_end, body_end + VEC)
        run = edge * body_end + tl.arange(0, VEC)[None, :]
        in_row = (run >= skew) & (run < end)
        x_run = tl.load(in_ptr + run, mask=in_row & kept, other=0.0)
        # Names apart from the loop's below: Triton would carry a shared one into it, of another shape.
        grad_run = _logit_gradient(x_run, run - skew, row_values)
        tl.store(out_ptr + run, grad_run.to(dlogits_ptr.dtype.element_ty), mask=in_row)
    for chunk in range(0, body_end, BLOCK_SIZE):
        f = chunk + tl.arange(0, BLOCK_SIZE)[None, :]
        inside = (f >= VEC) & (f < body_end)
        x = tl.load(in_ptr + f, mask=inside & kept, other=0.0)
        grad = _logit_gradient(x, f - skew, row_values)
        tl.store(out_ptr + f, grad.to(dlogits_ptr.dtype.element_ty), mask=inside)


# --------------------------------------------------------------------------
# Launch configuration.
# --------------------------------------------------------------------------

# The chunk a row is swept in: the next power of two of C, capped; the
# interpreter has no registers, only per-chunk Python overhead.
_MAX_CHUNK = {"cuda": 4096, "cpu": 1 << 14}
# The forward stacks rows of at most _STACKED_ROW columns into tiles of about
# _ROW_TILE elements, 8 a thread: one 100-class row a program leaves most lanes
# idle, and each program waits on its targets before it reads its rows.  H100,
# % of a copy of the logits' bytes, one row a program loading x_t last and each
# chunk after the last one's math -> now (row tiles, x_t loaded with the rows,
# the next chunk ahead; docs/perf-notes.md, version 28), at 65536x100 / 32768x1000
# / 16384x4096 / 4096x32000 / 4096x50257 / 8192x128256: bf16 4.7 / 51 / 75 / 102 /
# 92 / 114 -> 11.6 / 63 / 74 / 105 / 96 / 116; float32 7.6 / 73 / 102 / 114 / 113 /
# 119 -> 19 / 89 / 102 / 116 / 111 / 120.  Rows of 1000 columns stacked two or four
# a program lost 19-38 points; at 65536x100 the mean's one-program sum over the row
# losses costs the other quarter (reduction="none": 16.1).  The backward takes the
# same tiles: one row a program -> row tiles, bf16 / float32 at 65536x100 21 / 44 ->
# 49 / 78, level elsewhere (version 29, where two other designs are measured).
_STACKED_ROW = {"cuda": 256, "cpu": 1 << 14}
_ROW_TILE = {"cuda": 2048, "cpu": 1 << 14}
# The reductions over the N rows (the forward's sum of the row losses, the
# backward's count of kept rows for "mean") split the rows into at most
# _REDUCE_PARTS parts, one a program, each a whole number of chunks of
# _REDUCE_CHUNK rows (8 a thread on a GPU): one chunk a program up to
# 131072 rows.  They were one program over all the rows, in chunks of 8192 on
# 16 warps: latency-bound, each chunk a round trip to memory.  H100, CUDA-graph
# time of an op with "mean" less the same op with "none" ("sum" for the
# backward), before -> now: forward 32768x1000 bf16 9.9 -> 4.0 µs (of 35.4),
# 16384x4096 3.5 -> 1.7; backward 5.6 -> 2.0 and 3.5 -> 1.9.  The forward's sum
# alone at 16384 rows: 16 programs of one chunk 5.0 µs, 4 of four chunks 8.3,
# one program 18.4 (docs/perf-notes.md, version 41).
_REDUCE_CHUNK = {"cuda": 1024, "cpu": 1 << 16}
_REDUCE_PARTS = 128  # also the length of the loads that add the partials up: a power of two


def _forward_per_thread(n_cols: int, block: int, element_size: int) -> int:
    """Elements a thread in the forward's chunks.

    The forward only reads, and each program first waits on its targets (an
    ignored row is not read): a row of one or two chunks wants twice the bytes a
    thread, 32 (4096 columns on 4 warps rather than 8).  H100, the kernel alone,
    % of copy as the harness counts it, 16 -> 32 a thread, no ignored rows / one
    row in 4 ignored: bf16 16384x4096 78 -> 88 / 83 -> 102, 8192x8192 89 -> 95 /
    103 -> 118, 32768x1000 82 -> 85 / 85 -> 100; float32 16384x4096 91 -> 97 /
    116 -> 121.  Longer rows keep their next chunk in flight already: 16-bit ones
    gained a little (bf16 2048x262144 93 -> 97 in the harness), float32 ones lost
    (102 -> 97) and keep 16, as float64 does everywhere (two registers a value).
    docs/perf-notes.md, version 33."""
    if element_size > 4 or (element_size == 4 and n_cols > 2 * block):
        return 16
    return 32


def _backward_per_thread(n_cols: int, block: int) -> int:
    """Elements a thread in the backward's chunks.

    It writes what it reads.  Rows of one or two chunks want 16 a thread (4096
    columns on 8 warps); longer rows keep more in flight on 16 warps, 8 a
    thread.  H100, the kernel alone, % of a copy of the logits, 16 -> 8 a
    thread: bf16 4096x32000 / 4096x50257 / 2048x65536 / 8192x128256 92.8 /
    87.5 / 90.2 / 93.5 -> 95.1 / 90.6 / 93.5 / 94.3, float32 94.2 / 88.2 /
    115.8 / 94.0 -> 94.9 / 89.7 / 116.8 / 94.3; at two chunks bf16 8192x8192
    95.5 -> 93.6 and 16384x4100 84.1 -> 73.2.  32 a thread lost 0-8 points
    everywhere.  docs/perf-notes.md, version 34."""
    return 8 if n_cols > 2 * block else 16


def _row_tile(n_rows, n_cols: int, logits: torch.Tensor, forward: bool) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_SIZE, num_warps) of the forward or the backward: rows of at most _STACKED_ROW
    columns stacked into tiles of about _ROW_TILE elements, longer rows one a program, swept in
    chunks (see _forward_per_thread and _backward_per_thread)."""
    kind = _kind(logits.device)
    block = min(next_power_of_2(n_cols), _MAX_CHUNK[kind])
    if block > _STACKED_ROW[kind]:
        if forward:
            per_thread = _forward_per_thread(n_cols, block, logits.element_size())
        else:
            per_thread = _backward_per_thread(n_cols, block)
        return 1, block, warps_for(block, per_thread)
    rows = rows_in_tile(n_rows, block, _ROW_TILE[kind])
    return rows, block, warps_for(rows * block, per_thread=8)


def _peel(rows: int, logits: torch.Tensor, col_multiple: int) -> int:
    """PEEL of the row kernels: the elements in 16 bytes for one contiguous row a program whose rows do
    not all start on a 16-byte boundary and that is two 16-byte runs long at least; 0 otherwise.
    (col_multiple: the launch's COL_MULTIPLE, which for contiguous rows is that of the row length.)"""
    n_cols = logits.shape[1]
    vector = 16 // logits.element_size()
    aligned = col_multiple >= vector
    return vector if rows == 1 and logits.stride(0) == n_cols and not aligned and n_cols >= 2 * vector else 0


def _reduce_parts(n_rows, device: torch.device) -> tuple[int, int, int, int]:
    """(programs, rows a program, chunk, num_warps) of the reductions over the N rows: at most
    _REDUCE_PARTS programs, each over a whole number of chunks, at least one program."""
    chunk = _REDUCE_CHUNK[_kind(device)]
    per_part = chunk * max(cdiv(n_rows, _REDUCE_PARTS * chunk), 1)
    return max(cdiv(n_rows, per_part), 1), per_part, chunk, warps_for(chunk, per_thread=8)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# --------------------------------------------------------------------------
# Argument checks.
# --------------------------------------------------------------------------


def _check_options(op: str, reduction: str, label_smoothing: float) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"tk.{op}: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:  # NaN fails too
        raise ValueError(f"tk.{op}: label_smoothing must be between 0.0 and 1.0, got {label_smoothing}")


def _check_logits_and_target(op: str, logits, target, logits_ndims=(2,)) -> None:
    """logits (N, C) float, target (N,) int64 class indices, one device."""
    if isinstance(logits, torch.Tensor) and logits.dim() not in logits_ndims:
        shapes = " or ".join({1: "(C,)", 2: "(N, C)"}[n] for n in logits_ndims)
        raise ValueError(
            f"tk.{op}: logits must be {shapes}, got shape {tuple(logits.shape)}; flatten (B, T, C) logits to "
            f"(B*T, C) and their targets to (B*T,) (F.cross_entropy would read dim 1 of a 3-D input as the classes)"
        )
    check_tensor(op, "logits", logits)
    if isinstance(target, torch.Tensor) and target.is_floating_point():
        raise TypeError(
            f"tk.{op}: target has dtype {str(target.dtype).replace('torch.', '')}: class-probability targets "
            f"are not supported; pass int64 class indices"
        )
    check_tensor(op, "target", target, dtypes=(torch.int64,))
    if target.device != logits.device:
        raise ValueError(f"tk.{op}: logits is on {logits.device} but target is on {target.device}")
    if tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"tk.{op}: target has shape {tuple(target.shape)}; logits of shape {tuple(logits.shape)} "
            f"need a target of shape {tuple(logits.shape[:-1])}"
        )
    if logits.shape[-1] == 0:
        raise ValueError(f"tk.{op}: logits has shape {tuple(logits.shape)}: there must be at least one class")


def _rows_view(logits: torch.Tensor) -> torch.Tensor:
    """logits with unit column stride (a row-sliced view, such as a padded
    vocabulary cut to C columns, is kept as it is; other layouts are copied)."""
    return logits if logits.stride(1) == 1 else logits.contiguous()


# --------------------------------------------------------------------------
# The ops.
# --------------------------------------------------------------------------


def _cross_entropy_forward(
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_logits_and_target("cross_entropy_forward", logits, target)
    _check_options("cross_entropy_forward", reduction, label_smoothing)
    # The loss's dtype.  16-bit logits with dtype float32 give what F.cross_entropy of
    # float32 logits gives (the kernels compute in float32 either way), without a
    # float32 copy of the logits: what autocast asks for.
    loss_dtype = result_dtype("cross_entropy_forward", "dtype", dtype, logits.dtype)
    logits, target = _rows_view(logits), target.contiguous()
    n_rows, n_cols = logits.shape
    device = logits.device
    compute = _compute_dtype(logits.dtype)
    lse = torch.empty(n_rows, dtype=compute, device=device)
    if reduction == "none":
        loss = row_loss = torch.empty(n_rows, dtype=loss_dtype, device=device)
    else:  # row losses kept in the compute dtype, then reduced to one scalar
        loss = torch.empty((), dtype=loss_dtype, device=device)
        row_loss = torch.empty(n_rows, dtype=compute, device=device)
    ticket = None
    if reduction != "none":
        parts, per_part, chunk, reduce_warps = _reduce_parts(n_rows, device)
        # each part's sum and kept count, then the ticket (zeroed by the row kernel)
        part_sum = torch.empty(parts, dtype=compute, device=device)
        part_kept = torch.empty(parts + 1, dtype=torch.int32, device=device)
        ticket = part_kept[parts:]
    if n_rows > 0:
        rows, block, warps = _row_tile(n_rows, n_cols, logits, forward=True)
        col_multiple = column_multiple(n_cols, logits.stride(0))
        launcher(cross_entropy_forward_kernel, logits)[(cdiv(n_rows, rows),)](
            logits, target, row_loss, lse, lse if ticket is None else ticket,
            n_rows, n_cols, logits.stride(0), ignore_index, float(label_smoothing),
            SMOOTHING=label_smoothing > 0, BLOCK_M=rows, BLOCK_SIZE=block, COL_MULTIPLE=col_multiple,
            PEEL=_peel(rows, logits, col_multiple), ZERO_TICKET=ticket is not None, num_warps=warps,
        )  # fmt: skip
    if reduction != "none":  # N == 0 too (one program, no ticket): a sum of nothing is 0, its mean NaN
        launcher(cross_entropy_reduce_kernel, logits)[(parts,)](
            row_loss, target, part_sum, part_kept, ticket, loss, n_rows, per_part, ignore_index,
            MEAN=reduction == "mean", BLOCK_SIZE=chunk, MAX_PARTS=_REDUCE_PARTS, num_warps=reduce_warps,
        )  # fmt: skip
    return loss, lse


def _cross_entropy_backward(
    grad: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    lse: torch.Tensor,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
) -> torch.Tensor:
    op = "cross_entropy_backward"
    _check_logits_and_target(op, logits, target)
    _check_options(op, reduction, label_smoothing)
    check_tensor(op, "grad", grad)
    check_tensor(op, "lse", lse, dtypes=(_compute_dtype(logits.dtype),))
    n_rows, n_cols = logits.shape
    grad_shape = (n_rows,) if reduction == "none" else ()
    if tuple(grad.shape) != grad_shape:
        raise ValueError(f"tk.{op}: grad has shape {tuple(grad.shape)}; reduction={reduction!r} needs {grad_shape}")
    if tuple(lse.shape) != (n_rows,):
        raise ValueError(f"tk.{op}: lse has shape {tuple(lse.shape)}, expected ({n_rows},)")
    for name, t in (("grad", grad), ("lse", lse)):
        if t.device != logits.device:
            raise ValueError(f"tk.{op}: logits is on {logits.device} but {name} is on {t.device}")
    logits, target, lse = _rows_view(logits), target.contiguous(), lse.contiguous()
    dlogits = torch.empty((n_rows, n_cols), dtype=logits.dtype, device=logits.device)
    if n_rows == 0:
        return dlogits
    part_kept, parts = lse, 0  # the kept rows' counts, for "mean" only
    if reduction == "mean":  # grad / kept rows: the row kernel adds the counts of the parts up
        parts, per_part, chunk, reduce_warps = _reduce_parts(n_rows, logits.device)
        part_kept = torch.empty(parts, dtype=torch.int32, device=logits.device)
        launcher(cross_entropy_count_kernel, logits)[(parts,)](
            target, part_kept, n_rows, per_part, ignore_index, BLOCK_SIZE=chunk, num_warps=reduce_warps
        )
    rows, block, warps = _row_tile(n_rows, n_cols, logits, forward=False)
    col_multiple = column_multiple(n_cols, logits.stride(0))
    launcher(cross_entropy_backward_kernel, logits)[(cdiv(n_rows, rows),)](
        logits, target, lse, grad, part_kept, dlogits,
        n_rows, n_cols, logits.stride(0), grad.stride(0) if reduction == "none" else 0, parts, ignore_index,
        float(label_smoothing), BLOCK_M=rows, BLOCK_SIZE=block, COL_MULTIPLE=col_multiple,
        PEEL=_peel(rows, logits, col_multiple), MEAN_PARTS=_REDUCE_PARTS if parts else 0, num_warps=warps,
    )  # fmt: skip
    return dlogits


cross_entropy_forward = register_op("cross_entropy_forward", _cross_entropy_forward)
cross_entropy_backward = register_op("cross_entropy_backward", _cross_entropy_backward)


def _setup_context(ctx, inputs, output):
    logits, target, ignore_index, reduction, label_smoothing, _ = inputs
    _, lse = output
    ctx.save_for_backward(logits, target, lse)
    ctx.mark_non_differentiable(lse)  # an internal by-product: no gradient flows through it
    ctx.options = (ignore_index, reduction, label_smoothing)


def _backward(ctx, grad_loss, grad_lse):
    logits, target, lse = ctx.saved_tensors
    dlogits = None
    if ctx.needs_input_grad[0]:
        dlogits = torch.ops.tk.cross_entropy_backward(grad_loss, logits, target, lse, *ctx.options)
    return dlogits, None, None, None, None, None  # an integer target has no gradient


cross_entropy_forward.register_autograd(_backward, setup_context=_setup_context)


# The user-facing op.  A CompositeImplicitAutograd kernel runs *above*
# autograd: autograd, fake tensors and torch.compile all see the
# cross_entropy_forward op it calls, so the logsumexp is saved for the
# backward while the caller gets the loss only.
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
_LIBRARY.define(
    "cross_entropy(Tensor logits, Tensor target, int ignore_index=-100, str reduction='mean', "
    "float label_smoothing=0.0, ScalarType? dtype=None) -> Tensor"
)


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``F.cross_entropy(logits, target, ignore_index=, reduction=, label_smoothing=)``
    for (N, C) logits with (N,) targets, or unbatched (C,) logits with a 0-d target.
    ``dtype``: the loss's (the logits' if None), see _cross_entropy_forward."""
    _check_logits_and_target("cross_entropy", logits, target, logits_ndims=(1, 2))
    _check_options("cross_entropy", reduction, label_smoothing)
    result_dtype("cross_entropy", "dtype", dtype, logits.dtype)
    options = (ignore_index, reduction, label_smoothing, dtype)
    if logits.dim() == 1:  # unbatched: a batch of one row
        loss, _ = torch.ops.tk.cross_entropy_forward(logits.unsqueeze(0), target.unsqueeze(0), *options)
        return loss.squeeze(0) if reduction == "none" else loss
    loss, _ = torch.ops.tk.cross_entropy_forward(logits, target, *options)
    return loss


_LIBRARY.impl("cross_entropy", cross_entropy, "CompositeImplicitAutograd")
# Under autocast, F.cross_entropy casts the logits to float32 on either device.
# tk asks for a float32 loss instead, which gives the same numbers: the kernels
# read 16-bit logits as they are and compute in float32 anyway, so the float32
# copy PyTorch makes (6 bytes an element, 4 of them kept for the backward: 4 GB
# at 8192x128256) is never made, and the gradient comes back in the logits' dtype.
follow_autocast("cross_entropy", {"cuda": FLOAT32_RESULT, "cpu": FLOAT32_RESULT})


# --------------------------------------------------------------------------
# What the comparison harness reads.
# --------------------------------------------------------------------------


def _make_inputs(shape, dtype, device):
    n_rows, n_cols = shape
    logits = torch.randn(n_rows, n_cols, dtype=dtype, device=device)
    target = torch.randint(0, n_cols, (n_rows,), device=device)
    return logits, target


def _bytes(shape, dtype):
    """Read the logits once and the targets, write one scalar (reduction="mean")."""
    n_rows, n_cols = shape
    size = torch.empty((), dtype=dtype).element_size()
    return n_rows * n_cols * size + n_rows * 8 + size


def _liger_cross_entropy():
    # The functional entry point, not LigerCrossEntropyFunction: the Function's
    # positional arguments changed between releases (0.8 made weight required).
    from liger_kernel.transformers.functional import liger_cross_entropy  # optional peer

    return liger_cross_entropy


_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float64: 1e-7}

register_spec(
    OpSpec(
        name="cross_entropy",
        tk=lambda logits, target: torch.ops.tk.cross_entropy(logits, target),
        reference=lambda logits, target: F.cross_entropy(logits, target),
        make_inputs=_make_inputs,
        bytes_moved=_bytes,
        flops=lambda shape, dtype: 4 * shape[0] * shape[1],  # max, subtract+exp, sum; per element
        tolerance=_TOLERANCE,
        shapes={
            "cuda": [(16384, 4096), (4096, 32000), (4096, 50257), (8192, 128256), (2048, 262144)],
            "cpu": [(64, 1000), (4, 70_001)],
        },
        describe=lambda shape: f"N{shape[0]}xC{shape[1]}",
        peers={"liger": _liger_cross_entropy},
    )
)


def _make_backward_inputs(shape, dtype, device):
    """grad of a mean loss, logits, target, the logsumexp tk's forward saves and the log-softmax
    PyTorch's saves: each backward gets what its own forward kept."""
    logits, target = _make_inputs(shape, dtype, device)
    lse = torch.logsumexp(logits.to(_compute_dtype(dtype)), dim=-1)
    grad = torch.ones((), dtype=dtype, device=device)
    return grad, logits, target, lse, torch.log_softmax(logits, dim=-1)


def _backward_bytes(shape, dtype):
    """Read the logits and write their gradient; read the targets, the float32 logsumexp and g."""
    n_rows, n_cols = shape
    size = torch.empty((), dtype=dtype).element_size()
    return 2 * n_rows * n_cols * size + n_rows * (8 + 4) + size


def _eager_backward(grad, logits, target, lse, log_probs):
    """The two kernels eager autograd runs for F.cross_entropy: nll_loss's, then log_softmax's."""
    kept = (target != -100).sum().to(log_probs.dtype)
    dlog_probs = torch.ops.aten.nll_loss_backward(grad, log_probs, target, None, 1, -100, kept)  # 1: mean
    return torch.ops.aten._log_softmax_backward_data(dlog_probs, log_probs, 1, log_probs.dtype)


def _backward_reference64(grad, logits, target, lse, log_probs):
    """From the logits themselves: a float64 copy of a 16-bit log-softmax carries its rounding."""
    x = logits.detach().requires_grad_()
    F.cross_entropy(x, target).backward(grad)
    return x.grad


# The backward on its own, reduction="mean", against the kernels eager autograd runs (with
# the log-softmax its forward saved) and Inductor's fusion of them.  No Liger column: its
# cross entropy writes the gradient during the forward, so it has no backward to time.
register_spec(
    OpSpec(
        name="cross_entropy_backward",
        tk=lambda grad, logits, target, lse, log_probs: torch.ops.tk.cross_entropy_backward(
            grad, logits, target, lse, -100, "mean", 0.0
        ),
        reference=_eager_backward,
        reference64=_backward_reference64,
        make_inputs=_make_backward_inputs,
        bytes_moved=_backward_bytes,
        flops=lambda shape, dtype: 4 * shape[0] * shape[1],  # subtract, exp, subtract, scale; per element
        tolerance=_TOLERANCE,
        shapes={
            "cuda": [(32768, 1000), (16384, 4096), (4096, 32000), (4096, 50257), (8192, 128256), (2048, 262144)],
            "cpu": [(64, 1000), (4, 70_001)],
        },
        describe=lambda shape: f"N{shape[0]}xC{shape[1]}",
    )
)
