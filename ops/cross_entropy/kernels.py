"""Cross entropy's Triton kernels: the row kernels (forward, backward) and the sums over the rows.

The math and the designs are in op.py's docstring.
"""

import triton
import triton.language as tl

from ..blocks.alignment import known_multiple, peeled_frame
from ..blocks.fastmath import exp, finite_or_zero

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
    """(frame, skew, body_end) of contiguous row `row` (ops/blocks/alignment.py: peeled_frame)."""
    return peeled_frame(row.to(tl.int64) * n_cols, n_cols, VEC)


@triton.jit
def _merge_chunk(run_max, run_sum, x):
    """The running max and sum of exp(x - max) of each row, with the chunk x (rows by columns) added."""
    new_max = tl.maximum(run_max, tl.max(x, axis=1))
    shift = finite_or_zero(new_max)
    # Rescale the sum so far from the old max to the new one, then add this chunk.
    return new_max, run_sum * exp(run_max - shift) + tl.sum(exp(x - shift[:, None]), axis=1)


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
    run_sum = tl.sum(exp(x - finite_or_zero(run_max)[:, None]), axis=1)
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
