"""Linear cross entropy's Triton kernel: one chunk's row losses and, in place of its logits, their gradient.

The math is in op.py's docstring.  The online logsumexp, the smoothing term's anchored mean and
the handling of ignored and out-of-range targets are those of ops/cross_entropy/kernels.py.
"""

import triton
import triton.language as tl

from ..blocks.alignment import known_multiple
from ..blocks.elementwise import to_compute_dtype
from ..blocks.fastmath import exp, finite_or_zero

REDUCTIONS = ("none", "mean", "sum")


@triton.jit
def _load_logits(ptrs, cols, sweep_end, n_cols, kept):
    """The logits at `ptrs` (columns `cols`) in the compute dtype.  The loads run to `sweep_end`,
    the padded row's end, a multiple of 16 bytes: their masks split no 16-byte run, so Triton moves
    16 bytes an access.  The padding past `n_cols`, and rows not kept, read as -inf (exp(-inf) adds 0)."""
    x = tl.load(ptrs, mask=(cols < sweep_end) & kept, other=-float("inf"))
    if x.dtype != tl.float64:  # resolved at compile time: half and float32 compute in float32
        x = x.to(tl.float32)
    return tl.where(cols < n_cols, x, -float("inf"))


@triton.jit
def _row_statistics(row_ptrs, row_stride, n_cols, kept, ignored, SMOOTHING: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Pass 1 over a tile's rows: (run_max, log_sum, anchor, run_mean): each row's max, the log of
    its sum of exp(x - max), and with SMOOTHING its mean logit as anchor + run_mean (else zeros).
    Rows not `kept` are not read: their max is -inf and their log_sum 0."""
    # The first chunk starts the running max and sum, so they take the compute dtype (float32, or
    # float64) from the data; the next chunk's load is issued before this one's math.
    cols = tl.arange(0, BLOCK_SIZE)[None, :]
    x = _load_logits(row_ptrs + cols, cols, row_stride, n_cols, kept)
    x_next = _load_logits(row_ptrs + BLOCK_SIZE + cols, BLOCK_SIZE + cols, row_stride, n_cols, kept)
    run_max = tl.max(x, axis=1)
    run_sum = tl.sum(exp(x - finite_or_zero(run_max)[:, None]), axis=1)
    anchor = tl.zeros_like(run_max)
    run_mean = tl.zeros_like(run_max)
    if SMOOTHING:
        # mean(x) - anchor as a running sum of (x - anchor) / n (see ops/cross_entropy/kernels.py:
        # a plain sum of x cancels, and one huge logit would overflow a sum of x - anchor).
        inside = (cols < n_cols) & kept
        finite = inside & (x == x) & (tl.abs(x) < float("inf"))  # noqa: PLR0124 (x == x: not NaN)
        anchor = tl.sum(tl.where(finite, x, 0.0), axis=1) / tl.maximum(tl.sum(finite.to(x.dtype), axis=1), 1.0)
        run_mean = tl.sum(tl.where(inside, (x - anchor[:, None]) / n_cols, 0.0), axis=1)
    last = tl.max(tl.where(ignored, 0, row_stride))  # 0 when every row is ignored: no chunk loop at all
    for start in range(BLOCK_SIZE, last, BLOCK_SIZE):
        x = x_next
        cols = start + tl.arange(0, BLOCK_SIZE)[None, :]
        x_next = _load_logits(row_ptrs + BLOCK_SIZE + cols, BLOCK_SIZE + cols, row_stride, n_cols, kept)
        new_max = tl.maximum(run_max, tl.max(x, axis=1))
        shift = finite_or_zero(new_max)
        run_sum = run_sum * exp(run_max - shift) + tl.sum(exp(x - shift[:, None]), axis=1)
        run_max = new_max
        if SMOOTHING:
            run_mean += tl.sum(tl.where((cols < n_cols) & kept, (x - anchor[:, None]) / n_cols, 0.0), axis=1)
    log_sum = tl.log(tl.where(ignored, 1.0, run_sum))  # an ignored row summed nothing: log(1), unused
    return run_max, log_sum, anchor, run_mean


@triton.jit
def _write_gradient(
    row_ptrs, row_stride, n_cols, exists, kept, lse, scale, target, smooth, target_weight, BLOCK_SIZE: tl.constexpr
):
    """Pass 2: each logit's gradient written over it, per row (lse, scale and target are per row)
        dx_c = (exp(x_c - lse) - smooth - target_weight [c == target]) * scale
    A target outside [0, n_cols) matches no column; the padding (n_cols to row_stride) is written 0."""
    lse, scale, target = lse[:, None], scale[:, None], target[:, None]
    for start in range(0, row_stride, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)[None, :]
        x = _load_logits(row_ptrs + cols, cols, row_stride, n_cols, kept)
        probs = exp(x - lse)  # the softmax (0 in a row not kept and in the padding)
        grad = (probs - smooth - tl.where(cols == target, target_weight, 0.0)) * scale
        grad = tl.where(cols < n_cols, grad, 0.0)  # the padding becomes 0
        ptrs = row_ptrs + cols
        tl.store(ptrs, grad.to(ptrs.dtype.element_ty), mask=(cols < row_stride) & exists[:, None])


@triton.jit
def linear_cross_entropy_kernel(
    logits_ptr, target_ptr, loss_ptr, scale_ptr, kept_count_ptr,
    n_rows, n_cols, row_stride, scale_stride, ignore_index, label_smoothing,
    LOSS: tl.constexpr, GRAD: tl.constexpr, INCOMING: tl.constexpr, MEAN: tl.constexpr, SMOOTHING: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_SIZE: tl.constexpr, ROW_MULTIPLE: tl.constexpr,
):  # fmt: skip
    """Each row's loss (LOSS) and its logits' gradient, written over the logits (GRAD).

    A program takes BLOCK_M rows of one chunk's logits (n_rows rows of n_cols, `row_stride`
    apart, a multiple of ROW_MULTIPLE) and sweeps them twice in BLOCK_SIZE-column chunks:

    1. the online max and sum of exp(x - max) (rescaled when the max grows), with the target's
       logit loaded beside; with SMOOTHING also the row's mean logit.  Then lse and the loss:
           loss = (1 - s) (lse - x_t) + s (lse - mean_c x_c)
    2. (GRAD) the gradient, in place:
           dx_c = (exp(x_c - lse) - (1 - s) [c == t] - s / C) * g
       where g is 1 or the row's incoming gradient (INCOMING, read at row * scale_stride), divided
       by the number of kept rows for MEAN (an int64 count at kept_count_ptr, taken over all the
       rows before the first chunk).

    An ignored row (target == ignore_index) is not read: its loss is 0 and its gradient 0.  An
    out-of-range target gives a NaN loss and a NaN gradient row.  Padding columns (n_cols to
    row_stride) are written 0.
    """
    row_stride = known_multiple(row_stride, ROW_MULTIPLE)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # int64: row * row_stride may pass 2**31
    exists = rows < n_rows
    target = tl.load(target_ptr + rows, mask=exists, other=ignore_index)  # a row past the last is ignored
    ignored = target == ignore_index
    in_range = (target >= 0) & (target < n_cols)
    kept = (~ignored)[:, None]
    row_ptrs = logits_ptr + rows[:, None] * row_stride
    x_target = tl.load(logits_ptr + rows * row_stride + target, mask=in_range & ~ignored, other=0.0)

    run_max, log_sum, anchor, run_mean = _row_statistics(
        row_ptrs, row_stride, n_cols, kept, ignored, SMOOTHING, BLOCK_SIZE
    )
    smoothing = tl.cast(label_smoothing, log_sum.dtype)

    if LOSS:
        # (max - x_t) + log_sum rather than lse - x_t: with logits of 1e9, lse would round log_sum
        # away.  An all -inf row gives -inf - -inf = NaN, as in PyTorch.
        loss = (run_max - x_target.to(log_sum.dtype)) + log_sum
        if SMOOTHING:  # compiled in only for s > 0: with s = 0 a -inf logit must not turn 0 * -inf into NaN
            loss = (1.0 - smoothing) * loss + smoothing * (((run_max - anchor) - run_mean) + log_sum)
        loss = tl.where(in_range, loss, float("nan"))  # an out-of-range target: NaN, see op.py
        tl.store(loss_ptr + rows, tl.where(ignored, 0.0, loss), mask=exists)

    if GRAD:
        lse = tl.where(ignored, 0.0, run_max + log_sum)  # an ignored row reads -inf: exp(-inf - 0) = 0
        if INCOMING:
            scale = tl.load(scale_ptr + rows * scale_stride, mask=exists, other=0.0).to(lse.dtype)
        else:
            scale = tl.where(exists, 1.0, 0.0).to(lse.dtype)
        if MEAN:  # no kept row: every row's gradient is 0 whatever the scale; 1 avoids a division by 0
            scale = scale / tl.maximum(tl.load(kept_count_ptr), 1).to(lse.dtype)
        scale = tl.where(in_range, scale, float("nan"))  # an out-of-range target: a NaN row
        scale = tl.where(ignored, 0.0, scale)  # ignored: exactly 0, whatever the incoming gradient
        smooth = smoothing / n_cols
        target_weight = 1.0 - smoothing
        _write_gradient(row_ptrs, row_stride, n_cols, exists, kept, lse, scale, target, smooth, target_weight, BLOCK_SIZE)


# --------------------------------------------------------------------------
# One vocabulary shard's part of a vocabulary-parallel loss (ops/linear_cross_entropy/shard.py):
# the shard holds classes vocab_start .. vocab_start + n_cols of `vocab`, and a row's target may
# fall in another shard.
# --------------------------------------------------------------------------


@triton.jit
def vocab_shard_statistics_kernel(
    logits_ptr, target_ptr, max_ptr, log_sum_ptr, target_logit_ptr, max_minus_mean_ptr,
    n_rows, n_cols, row_stride, vocab_start, ignore_index,
    SMOOTHING: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_SIZE: tl.constexpr, ROW_MULTIPLE: tl.constexpr,
):  # fmt: skip
    """Per row of one chunk, the shard's part of its loss, one stat a pointer: the max of the shard's
    logits, the log of its sum of exp(x - max), the target's logit where the target is one of the
    shard's classes (else 0) and, with SMOOTHING, the max minus the shard's mean logit (else 0), as
    (max - anchor) - the mean's rest, which keeps its digits when the logits are huge.  The shards'
    parts combine exactly (vocab_parallel.py).  An ignored row is not read: -inf, 0, 0, 0."""
    row_stride = known_multiple(row_stride, ROW_MULTIPLE)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # int64: row * row_stride may pass 2**31
    exists = rows < n_rows
    target = tl.load(target_ptr + rows, mask=exists, other=ignore_index)  # a row past the last is ignored
    ignored = target == ignore_index
    local = target - vocab_start  # the target's column in this shard, if it is one of the shard's
    here = (local >= 0) & (local < n_cols) & ~ignored
    row_ptrs = logits_ptr + rows[:, None] * row_stride
    x_target = tl.load(logits_ptr + rows * row_stride + local, mask=here & exists, other=0.0)
    run_max, log_sum, anchor, run_mean = _row_statistics(
        row_ptrs, row_stride, n_cols, (~ignored)[:, None], ignored, SMOOTHING, BLOCK_SIZE
    )
    tl.store(max_ptr + rows, run_max, mask=exists)
    tl.store(log_sum_ptr + rows, log_sum, mask=exists)
    tl.store(target_logit_ptr + rows, x_target.to(log_sum.dtype), mask=exists)
    tl.store(max_minus_mean_ptr + rows, tl.where(ignored, 0.0, (run_max - anchor) - run_mean), mask=exists)


@triton.jit
def vocab_shard_gradient_kernel(
    logits_ptr, target_ptr, lse_ptr, scale_ptr,
    n_rows, n_cols, row_stride, vocab_start, vocab, ignore_index, label_smoothing,
    BLOCK_M: tl.constexpr, BLOCK_SIZE: tl.constexpr, ROW_MULTIPLE: tl.constexpr,
):  # fmt: skip
    """The gradient of one chunk's logits in this shard, written over them, from each row's lse over
    the whole vocabulary and its incoming gradient (the scale):
        dx_c = (exp(x_c - lse) - s / vocab - (1 - s) [c == target - vocab_start]) * scale
    An ignored row's gradient is 0; a NaN scale (an out-of-range target, shard.py) gives a NaN row."""
    row_stride = known_multiple(row_stride, ROW_MULTIPLE)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    exists = rows < n_rows
    target = tl.load(target_ptr + rows, mask=exists, other=ignore_index)
    ignored = target == ignore_index
    lse = tl.load(lse_ptr + rows, mask=exists & ~ignored, other=0.0)  # an ignored row reads -inf: exp(-inf - 0) = 0
    scale = tl.load(scale_ptr + rows, mask=exists, other=0.0).to(lse.dtype)
    scale = tl.where(ignored, 0.0, scale)  # ignored: exactly 0, whatever the incoming gradient
    smoothing = tl.cast(label_smoothing, lse.dtype)
    row_ptrs = logits_ptr + rows[:, None] * row_stride
    _write_gradient(
        row_ptrs, row_stride, n_cols, exists, (~ignored)[:, None], lse, scale, target - vocab_start,
        smoothing / vocab, 1.0 - smoothing, BLOCK_SIZE,
    )  # fmt: skip


@triton.jit
def _scale_block(x_ptr, scale, offsets, mask):
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(x_ptr + offsets, (to_compute_dtype(x) * scale).to(x.dtype), mask=mask)


@triton.jit
def scale_in_place_kernel(x_ptr, scale_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    """x *= scale for x dense (n_elements) and scale a one-element tensor on the device: the
    backward's incoming gradient, read here rather than on the host, where reading it would wait for
    the GPU.  The product in float32 (float64 for float64), rounded once.  torch's own mul_ by a 0-dim
    CUDA tensor rounds the scale to x's dtype first, and takes its strided path, a third of the
    bandwidth (perf-notes v49).

    A scale of exactly 1 (the gradient of a loss that is itself the step's loss: `loss.backward()`)
    leaves x as it is, so the kernel returns without reading or writing: x times 1 rounded once is
    x, and the pass over the weight gradient, 4 V H bytes, is skipped where it would change nothing.
    The grid is a few programs an SM, each taking every num_programs-th block: with one program a
    block, a scale of 1 launched hundreds of thousands of them to read one scalar each (H200, perf-notes
    version 57: Qwen2's weight gradient 161 us, now 1.5).  The price, where the scale is not 1: the
    loop streams at 0.93x the one-program-a-block grid's rate (552 against 513 us there; 8, 16 or 32
    programs an SM and blocks of 2048 or 4096 alike).  Whole blocks mask with a visible multiple of
    BLOCK_SIZE, the last (partial) block with n_elements, as the elementwise rule's kernels do."""
    scale = to_compute_dtype(tl.load(scale_ptr))
    if scale != 1.0:
        whole_end = n_elements // BLOCK_SIZE * BLOCK_SIZE
        for block in range(tl.program_id(0), tl.cdiv(n_elements, BLOCK_SIZE), tl.num_programs(0)):
            # int64 before the multiply: a weight gradient can pass 2**31 elements
            offsets = tl.cast(block, tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
            if tl.cast(block, tl.int64) * BLOCK_SIZE < whole_end:
                _scale_block(x_ptr, scale, offsets, offsets < whole_end)
            else:
                _scale_block(x_ptr, scale, offsets, offsets < n_elements)
