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
from typing import Optional

import torch

from ..blocks.alignment import column_multiple
from ..blocks.held_rows import (
    fit_rows,
    held_rows_scratch,
    may_overlap_fill,
    register_capped,
    words_block,
)
from ..blocks.sizes import at_most, cdiv, next_power_of_2, rows_in_tile, warps_for
from ..runtime import (
    device_facts,
    kind as _kind,
    launcher,
    sm_count as _sm_count,
)
from .held import layer_norm_backward_held_kernel, rms_norm_backward_held_kernel
from .kernels import (
    _STATS,
    column_sum_kernel,
    layer_norm_backward_columns_kernel,
    layer_norm_backward_kernel,
    layer_norm_backward_stats_kernel,
    layer_norm_forward_kernel,
    layer_norm_forward_long_rows_kernel,
    rms_norm_backward_columns_kernel,
    rms_norm_backward_kernel,
    rms_norm_backward_stats_kernel,
    rms_norm_forward_kernel,
    rms_norm_forward_long_rows_kernel,
)


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
        words, overlap = held_rows_scratch(
            x, n_rows, kernels.held_words * n_segments, overlapped=may_overlap_fill(device_facts(x.device))
        )
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
        programs = device_facts(device).programs_at_once(setup.warps, setup.registers, setup.programs_per_sm)
    found = fit_rows(n_rows, cdiv(n_cols, segment), programs)
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


RMS_NORM_KERNELS = NormKernels(
    forward=rms_norm_forward_kernel,
    forward_long_rows=rms_norm_forward_long_rows_kernel,
    backward=rms_norm_backward_kernel,
    backward_stats=rms_norm_backward_stats_kernel,
    backward_columns=rms_norm_backward_columns_kernel,
    backward_held=rms_norm_backward_held_kernel,
    # See HeldRows (ops/layer_norm.py): one warp a program up to 128 segments a row, then wider programs.
    held_setups={
        2: (HeldRows(512, 1, 96, 20, 128), HeldRows(2048, 4, 96, 5)),
        4: (HeldRows(512, 1, 128, 16, 128), HeldRows(1024, 2, 128, 8)),
    },
)
