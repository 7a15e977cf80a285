"""``run(plan, a, b)``: C = a @ b as the plan says (plan.py), every launch through the runtime's ``launcher``.

Nothing here decides: the design, the tile (fixed, or left to the autotuner),
the split and the layouts all come in the plan.  This file allocates C and
the split-K workspace, lays out the kernels' arguments and launches.
"""

import torch

from ..blocks.alignment import column_multiple
from ..blocks.elementwise import elementwise_grid
from ..blocks.sizes import cdiv
from ..runtime import launcher, set_scratch_allocator
from .kernels import (
    copy_rows_kernel,
    matmul_kernel,
    matmul_kernel_accumulating,
    matmul_kernel_autotuned,
    matmul_tma_kernel,
    matmul_tma_kernel_accumulating,
    matmul_tma_kernel_autotuned,
    split_k_sum_kernel,
)
from .plan import POINTER, TMA, Plan


def run(plan: Plan, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, accumulate: bool = False):
    """C = a @ b, a new tensor of plan.shape in a's dtype, its rows plan.c_row_stride apart (contiguous, or rows
    padded: plan.py's pad_c_rows); or written into `out` (contiguous, of that shape and dtype: op.py checked
    it), or added to it (accumulate).  Returns C."""
    if out is not None and plan.c_row_stride != plan.N:  # the kernels would stride the plan's rows over out's
        raise ValueError(f"tk.matmul: a plan for a new C with rows {plan.c_row_stride} apart cannot write a given out")
    c = _new_c(plan, a) if out is None else out
    if plan.design == TMA:
        _launch_tma(plan, a, b, c, accumulate)
    elif plan.design == POINTER:
        _launch_pointer(plan, a, b, c, accumulate)
    return c  # EMPTY: C has no elements


def _new_c(plan: Plan, a: torch.Tensor) -> torch.Tensor:
    """C uninitialized, rows plan.c_row_stride apart: made by empty_strided, not a view of a wider tensor, so that
    autograd, in-place ops and Inductor's layouts treat it as any new tensor (its storage ends at its last row's
    N-th element)."""
    row = plan.c_row_stride
    strides = (plan.M * row, row, 1) if len(plan.shape) == 3 else (row, 1)
    return torch.empty_strided(plan.shape, strides, dtype=a.dtype, device=a.device)


def _batched_view(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch stride, row stride, column stride); batch stride 0 for a 2-D operand."""
    if t.dim() == 2:
        return 0, t.stride(0), t.stride(1)
    return t.stride(0), t.stride(1), t.stride(2)


def _launch_pointer(plan: Plan, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, accumulate: bool) -> None:
    M, N, K, batch, split = plan.M, plan.N, plan.K, plan.batch, plan.split
    if split == 1:
        out, slice_stride = c, 0
    else:  # the tiles go to slices of a workspace in the accumulator's dtype, summed into c below
        out = torch.empty((split, *c.shape), dtype=plan.accumulator, device=a.device)
        slice_stride = c.numel()
    # With K split c is contiguous (new, or a caller's `out`, which op.py checked), so each workspace slice has
    # c's strides; a new c's rows may be padded otherwise (plan.c_row_stride), which its strides say.
    strides = (*_batched_view(a), *_batched_view(b), *_batched_view(c), slice_stride, split)
    flags = {"ALLOW_TF32": plan.allow_tf32, "UPCAST_OPERANDS": plan.upcast_operands, "GROUP_M": plan.group_m}
    flags["ACCUMULATE"] = accumulate and split == 1  # a split K's slice sum adds C instead
    flags.update(plan.multiples.constexprs())
    if plan.tile is None:  # the autotuner picks the tile

        def grid(meta):
            return (cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"]), batch, split)

        tuned = matmul_kernel_accumulating if flags["ACCUMULATE"] else matmul_kernel_autotuned
        launcher(tuned, a)[grid](a, b, out, M, N, K, *strides, **flags)
    else:
        grid = (cdiv(M, plan.tile.block_m) * cdiv(N, plan.tile.block_n), batch, split)
        tile = {**plan.tile.constexprs(), **plan.tile.options()}
        launcher(matmul_kernel, a)[grid](a, b, out, M, N, K, *strides, **flags, **tile)
    if split > 1:
        _sum_slices(plan, out, c, accumulate)


def _sum_slices(plan: Plan, partial: torch.Tensor, c: torch.Tensor, accumulate: bool) -> None:
    """c (contiguous) = the sum of partial's plan.split slices (+ c, accumulate)."""
    n = c.numel()
    launcher(split_k_sum_kernel, c)[elementwise_grid(n, plan.sum_block)](
        partial, c, n, SPLIT_K=plan.split, ACCUMULATE=accumulate, BLOCK_SIZE=plan.sum_block, num_warps=plan.sum_warps
    )


def aligned_copy(t: torch.Tensor, row_stride: int) -> torch.Tensor:
    """t (rows x columns), any strides, copied into a new row-major tensor of rows x `row_stride`, its
    columns past t's zero.  The kernel reads the first columns of each row by the sizes it is given.  The
    whole copy, not a view of its first columns: traced, Inductor lays out a view of an intermediate as it
    likes (a slice of the padding can come out as contiguous rows of t's width), but a new tensor is
    contiguous.  t goes into the new tensor's first columns by copy_, the padding zeroed apart: F.pad
    wrote every element twice (zeros, then t), 1.3 TB/s against copy_'s 1.7 on GPT-2's (768, 50257)
    weight (H200, perf-notes version 53).  With nothing to pad, a clone into row-major order."""
    rows, columns = t.shape
    if row_stride == columns:
        return t.clone(memory_format=torch.contiguous_format)
    copy = t.new_empty((rows, row_stride))
    copy[:, :columns].copy_(t)
    copy[:, columns:].zero_()
    return copy


def realigned_copy(plan: Plan, b: torch.Tensor) -> torch.Tensor:
    """b copied, in its layout (row- or column-major), into rows plan.b_layout.leading_stride apart (plan.py,
    Tuning.b_row_bytes).  The whole new tensor, the copy in its first columns: a new tensor keeps its layout
    when traced (see aligned_copy), and the matmul kernel reads only the columns it is told of."""
    source = b.t() if plan.b_layout.column_major else b  # rows of adjacent elements
    rows, columns = source.shape
    stride = plan.b_layout.leading_stride
    copy = torch.empty((rows, stride), dtype=b.dtype, device=b.device)
    block_r, block_c, warps = plan.realign_tile
    launcher(copy_rows_kernel, b)[(cdiv(rows, block_r), cdiv(columns, block_c))](
        source, copy, rows, columns, source.stride(0), stride,
        SRC_MULTIPLE=column_multiple(source.stride(0)), DST_MULTIPLE=column_multiple(stride),
        COLS_MULTIPLE=column_multiple(columns), BLOCK_R=block_r, BLOCK_C=block_c, num_warps=warps,
    )  # fmt: skip
    return copy.t() if plan.b_layout.column_major else copy


def _launch_tma(plan: Plan, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, accumulate: bool) -> None:
    M, N, K, programs = plan.M, plan.N, plan.K, plan.programs
    if plan.copy_a:
        a = aligned_copy(a, plan.a_layout.leading_stride)
    if plan.copy_b:
        b = aligned_copy(b, plan.b_layout.leading_stride)
    if plan.realign_b:
        b = realigned_copy(plan, b)
    # C's row stride is the plan's: N for a contiguous c (not c.stride(0): a contiguous (1, N) `out` may report
    # any), more for a new c padded.
    args = (a, b, c, M, N, K, plan.a_layout.leading_stride, plan.b_layout.leading_stride, plan.c_row_stride)
    flags = {"A_COLUMN_MAJOR": plan.a_layout.column_major, "B_COLUMN_MAJOR": plan.b_layout.column_major}
    flags["C_POINTERS"] = plan.c_pointers
    flags.update(UPCAST_OPERANDS=plan.upcast_operands, ACCUMULATE=accumulate, GROUP_M=plan.group_m)

    def grid(meta):  # the persistent grid: one program per SM, or fewer when there are fewer tiles
        return (min(programs, cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"])),)

    if a.device.type == "cuda":  # the kernel's descriptors need Triton's scratch memory there
        set_scratch_allocator()
    if plan.tile is None:  # the autotuner picks the tile
        tuned = matmul_tma_kernel_accumulating if accumulate else matmul_tma_kernel_autotuned
        launcher(tuned, a)[grid](*args, **flags)
    else:
        tile = plan.tile.constexprs()
        launcher(matmul_tma_kernel, a)[grid(tile)](
            *args, **flags, STORE_HALVES=plan.store_halves, WARP_SPECIALIZE=plan.warp_specialize, **tile,
            **plan.tile.options(),
        )  # fmt: skip
