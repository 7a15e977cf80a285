"""``run(plan, tensors)``: a softmax plan launched, every launch through ``launcher``; it decides nothing.

`tensors` are a direction's inputs and then its output: (x, y) forward, (dy, y,
dx) backward.  The output's dtype may differ from the inputs' (a 16-bit x with a
float32 y); the plan has already taken that into account.
"""

from dataclasses import dataclass

import torch

from ..blocks.held_rows import held_rows_scratch, register_capped
from ..runtime import launcher
from .held import softmax_backward_lagged_kernel, softmax_forward_held_kernel, softmax_forward_lagged_kernel
from .kernels import (
    softmax_backward_kernel,
    softmax_backward_looped_kernel,
    softmax_backward_partial_dot_kernel,
    softmax_backward_segments_kernel,
    softmax_forward_kernel,
    softmax_forward_online_kernel,
    softmax_normalize_segments_kernel,
    softmax_partial_stats_kernel,
)
from .plan import (
    BACKWARD,
    FORWARD,
    GLUON_FAMILIES,
    LAGGED,
    PUBLISH_THEN_WAIT,
    STAGED,
    STAGED_AHEAD,
    BlockPlan,
    HeldPlan,
    LoopedPlan,
    Plan,
    SplitPlan,
)

try:  # the Gluon forwards (gluon.py); whether they exist is a fact the plan receives (Meta.gluon)
    from . import gluon as _gluon
except (ImportError, AttributeError):  # pragma: no cover - a Triton without the Gluon parts it uses
    _gluon = None

HAS_GLUON = _gluon is not None


@dataclass(frozen=True)
class _Kernels:
    """One direction's kernels that read rows from memory, a design each (kernels.py)."""

    single: object  # BlockPlan: tiles of whole rows
    looped: object  # LoopedPlan: one program per row, chunk by chunk
    partials: object  # SplitPlan, pass 1: (inputs..., partials..., n_cols, inner, segment_len)
    finish: object  # SplitPlan, pass 2: (inputs..., output, partials..., n_cols, inner, segment_len)
    n_partials: int  # scratch tensors pass 1 fills


_KERNELS = {
    FORWARD: _Kernels(
        single=softmax_forward_kernel,
        looped=softmax_forward_online_kernel,
        partials=softmax_partial_stats_kernel,
        finish=softmax_normalize_segments_kernel,
        n_partials=2,  # max and sum
    ),
    BACKWARD: _Kernels(
        single=softmax_backward_kernel,
        looped=softmax_backward_looped_kernel,
        partials=softmax_backward_partial_dot_kernel,
        finish=softmax_backward_segments_kernel,
        n_partials=1,  # sum(dy * y)
    ),
}

# The held-rows kernels by (direction, family): held.py's in Triton, gluon.py's forwards.
_HELD_KERNELS = {
    (FORWARD, PUBLISH_THEN_WAIT): softmax_forward_held_kernel,
    (FORWARD, LAGGED): softmax_forward_lagged_kernel,
    (BACKWARD, LAGGED): softmax_backward_lagged_kernel,
}
if _gluon is not None:
    _HELD_KERNELS[FORWARD, STAGED] = _gluon.softmax_forward_staged_kernel
    _HELD_KERNELS[FORWARD, STAGED_AHEAD] = _gluon.softmax_forward_staged_ahead_kernel


def held_kernel(direction: str, family: str):
    """The kernel of a held plan's direction and family, as written (before any register cap)."""
    return _HELD_KERNELS[direction, family]


def run(plan: Plan, tensors) -> None:
    """Launch `plan` over `tensors` (inputs..., output)."""
    if isinstance(plan, BlockPlan):
        _run_block(plan, tensors)
    elif isinstance(plan, LoopedPlan):
        _run_looped(plan, tensors)
    elif isinstance(plan, SplitPlan):
        _run_split(plan, tensors)
    else:
        _run_held(plan, tensors)


def _run_block(plan: BlockPlan, tensors) -> None:
    rows = plan.rows
    launcher(_KERNELS[plan.direction].single, tensors[-1])[plan.grid](
        *tensors, rows.n_rows, rows.n_cols, rows.inner, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
        num_warps=plan.warps, COL_MULTIPLE=rows.col_multiple,
    )  # fmt: skip


def _run_looped(plan: LoopedPlan, tensors) -> None:
    rows = plan.rows
    launcher(_KERNELS[plan.direction].looped, tensors[-1])[plan.grid](
        *tensors, rows.n_cols, rows.inner, BLOCK_SIZE=plan.chunk, num_warps=plan.warps, COL_MULTIPLE=rows.col_multiple
    )


def _run_split(plan: SplitPlan, tensors) -> None:
    """Pass 1 writes one partial per (row, segment); pass 2 combines a row's partials and writes."""
    rows, kernels = plan.rows, _KERNELS[plan.direction]
    partials = _scratch_partials(tensors[0], rows.n_rows, plan.n_segments, kernels.n_partials)
    sizes = (rows.n_cols, rows.inner, plan.segment_len)
    first = (*tensors[:-1], *partials)
    launcher(kernels.partials, first[-1])[plan.grid](
        *first, *sizes, BLOCK_SIZE=plan.chunk, num_warps=plan.warps, COL_MULTIPLE=rows.col_multiple
    )
    second = (*tensors, *partials)
    launcher(kernels.finish, second[-1])[plan.grid](
        *second, *sizes, BLOCK_SIZE=plan.chunk, num_warps=plan.warps, SEGMENTS_BLOCK=plan.segments_block,
        COL_MULTIPLE=rows.col_multiple,
    )  # fmt: skip


def _scratch_partials(like: torch.Tensor, n_rows, n_segments: int, count: int) -> list[torch.Tensor]:
    """`count` (n_rows, n_segments) scratch tensors for partials, in the dtype the kernels
    compute in: float64 for float64 inputs (`like`, the first), else float32."""
    dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
    return [torch.empty(n_rows, n_segments, dtype=dtype, device=like.device) for _ in range(count)]


def _run_held(plan: HeldPlan, tensors) -> None:
    """A scratch of one word a (row, segment), none published (filled by a kernel of its own,
    see held_rows_scratch), then the held kernel over it."""
    words, overlap = held_rows_scratch(tensors[-1], plan.rows.n_rows, plan.n_segments, overlapped=plan.overlapped)
    launch_held(plan, tensors, words, overlap)


def launch_held(plan: HeldPlan, tensors, words: torch.Tensor, overlap: dict) -> None:
    """A held plan's kernel over the scratch `words` (none published yet, or, in a test that
    launches twice over one scratch, all), with `overlap`, the launch arguments
    held_rows_scratch gives for how the kernel follows its fill."""
    rows, like = plan.rows, tensors[-1]
    kernel = held_kernel(plan.direction, plan.family)
    counts = (plan.n_segments, plan.rows_at_once, plan.max_spins)
    sizes = {"SEGMENT": plan.segment, "SEGMENTS_BLOCK": plan.segments_block}
    if plan.family in GLUON_FAMILIES:  # rows along the last dim: no inner; warps and cap as launch options
        full = {} if plan.full is None else {"FULL": plan.full}
        launcher(kernel, like)[plan.grid](
            *tensors, words, rows.n_rows, rows.n_cols, *counts, **sizes, STAGES=plan.stages, VEC=plan.vec,
            num_warps=plan.warps, maxnreg=plan.registers, **overlap, **full,
        )  # fmt: skip
        return
    # The register cap travels in a one-config autotune, which torch.compile keeps (see register_capped).
    capped = register_capped(kernel, plan.warps, plan.registers)
    load_next = {} if plan.load_next is None else {"LOAD_NEXT": plan.load_next}
    launcher(capped, like)[plan.grid](
        *tensors, words, rows.n_rows, rows.n_cols, rows.inner, *counts, **sizes, COL_MULTIPLE=rows.col_multiple,
        FRAME=plan.frame, **load_next, **overlap,
    )  # fmt: skip
