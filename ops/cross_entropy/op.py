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

from ..blocks.alignment import column_multiple
from ..blocks.sizes import cdiv, next_power_of_2, rows_in_tile, warps_for
from ..runtime import (
    FLOAT32_RESULT,
    NAMESPACE,
    check_tensor,
    follow_autocast,
    kind as _kind,
    launcher,
    register_op,
    result_dtype,
)
from .kernels import (
    REDUCTIONS,
    cross_entropy_backward_kernel,
    cross_entropy_count_kernel,
    cross_entropy_forward_kernel,
    cross_entropy_reduce_kernel,
)

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
