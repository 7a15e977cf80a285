"""Softmax along any dim, forward and backward, rows of any length.

    y = exp(x - max(x)) / sum(exp(x - max(x)))          along `dim`
    dx = y * (dy - sum(dy * y))                          its backward

A tensor is seen as (outer, n_cols, inner) around `dim`: each of the
outer * inner rows is reduced on its own, its elements `inner` apart in
memory (inner == 1 for the last dim, the common case, which Triton
specializes away).

Four designs, picked by row length, row count, dtype and device:
* the row fits in one block: a program loads a tile of whole rows once (one
  row, for rows of thousands of columns; several stacked, for short ones),
  reduces each row in registers and writes it: one read and one write per
  element, the minimum;
* longer rows (no limit on the length), enough of them to fill the GPU: one
  program per row runs an *online* softmax.  The first pass keeps a running
  maximum and a running sum, rescaling the sum by exp(old_max - new_max)
  whenever the maximum grows, so max and sum come out of a single sweep; the
  second pass writes exp(x - max) / sum;
* longer rows, too few of them (64 rows of 2**20 columns would leave most
  SMs idle): *split rows*.  Each row is cut into segments and two kernels
  run over a (row, segment) grid.  The first computes each segment's online
  (max, sum) into a small scratch tensor; the second combines the partials
  of its row, M = max(m_i) and S = sum(s_i * exp(m_i - M)), the same
  rescaling as the online sum, and writes its segment.  The backward splits
  the same way: partial sums of dy * y, then dx.
* on CUDA, rows longer than a block are usually *held on chip across
  programs* instead: each program of a persistent grid keeps one segment of
  a row in registers, publishes its partial, waits until every segment of
  the row has published (each partial one word, its own flag), combines
  the partials and writes its segment from the registers.  Float32 rows and
  every backward publish a round ahead: a program publishes the partial of
  its next row before it waits for this row's, so the wait overlaps a
  round of work.  x is read once, as in the one-block design, where the two
  designs above read it twice (an H100's L2 does not keep the first read:
  60-70% of copy bandwidth).  The
  programs of a row must run at the same time, so the grid is sized to
  what fits on the GPU at once; a program that waits too long computes
  the missing partials itself, so the result never depends on scheduling
  and the kernel cannot hang.  Eager 16-bit forwards of aligned rows on
  Hopper take the same design written in Gluon, with the next segment
  staged in shared memory; the longest of them publish a round ahead too,
  from segments held in shared memory (ops/_softmax_gluon.py).

Precision: sums in float32 (float64 for float64 inputs).  On a GPU exp runs
as the hardware's exp2 with subnormals flushed (ops/_math.py): values of y
under 2**-126 (1.2e-38) come out 0, where torch.softmax keeps them as
subnormals; the interpreter (CPU) keeps them too.
"""

from dataclasses import dataclass

import torch

from ..blocks.alignment import column_multiple
from ..blocks.held_rows import (
    fit_rows,
    held_rows_scratch,
    may_overlap_fill,
    register_capped,
    words_block,
)
from ..blocks.sizes import at_most, cdiv, next_power_of_2, warps_for
from ..runtime import (
    FLOAT32_RESULT,
    GRAD,
    RESULT,
    check_same,
    check_tensor,
    cuda_capability,
    device_facts,
    dtype_of,
    follow_autocast,
    kind as _kind,
    launcher,
    launching_directly,
    reads_as_float32,
    register_formula,
    register_op,
    result_dtype,
    sm_count as _sm_count,
)
from .held import softmax_backward_lagged_kernel, softmax_forward_cooperative_kernel, softmax_forward_lagged_kernel
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

# --------------------------------------------------------------------------
# Picking a design and launching it.
# --------------------------------------------------------------------------

# Longest row held in one block, and the chunk of the looped kernels.  On an
# H100 a row of 32768 float32 over 32 warps (32 registers per thread) ran at
# 89% of copy bandwidth, where the looped kernel, reading x twice, got 65%;
# at 65536 the block spills (59%).  The looped kernels stream 16384-element
# chunks over 32 warps: 68% against 62% for 4096 over 8 warps at 1024x65536,
# since fewer, wider programs keep a row's second read in L2.  The interpreter
# has no registers, only per-program Python overhead.
_MAX_BLOCK = {"cuda": 32768, "cpu": 1 << 16}
_CHUNK = {"cuda": 16384, "cpu": 1 << 14}

# Short rows are stacked into tiles of at most this many elements (see
# _rows_per_program); a row at least this long has a program of its own.
_ROW_TILE = {"cuda": 1024, "cpu": 1 << 14}

# When rows longer than a block are split (see _split).  Module-level so that
# a test can shrink them and reach every design with small tensors.
_PROGRAMS_PER_SM = 4  # CUDA: enough programs to keep every SM streaming
_CPU_PROGRAMS = 8  # the interpreter: a small target, so CPU tests reach the split design cheaply
_MIN_SEGMENT_CHUNKS = 4  # the shortest segment, in chunks


# Rows held on chip across programs (CUDA, 16- and 32-bit; see
# softmax_forward_cooperative_kernel).  The register cap sets how many
# programs share an SM, and with the segment each holds, the bytes each SM
# has in flight while its programs wait for each other: the number that
# decided the first design, against 60-70% of copy for the two-read designs.
# Loading the next round's segment before the wait lifted the 16-bit
# forward from 46-49% to 72-77%; keeping exp(x - segment max) instead of x
# (one multiply after the wait) and publishing each partial as one word
# (no release) brought it to 81-94%.  Publishing a round ahead (the lagged
# kernels) is what closed the gap on the longest rows, where a row waits on
# 64-128 programs: H100, % of a copy of the same bytes at 4096x40000 /
# 1024x65536 / 600x131072 / 256x262144 / 128x524288 / 64x1048576, CUDA-graph
# time, the same process (docs/perf-notes.md, version 19):
#   forward float32, 8192 columns on 8 warps, 2 an SM -> lagged, 4096 on 4
#   warps, 4 an SM: 120 / 96 / 96 / 94 / 87 / 85 -> 121 / 96 / 97 / 97 / 96 / 95;
#   backward bf16, 8192 on 8 warps, 2 an SM -> lagged, 4096 on 4 warps, 4 an
#   SM: 99 / 99 / 99 / 97 / 92 / 87 -> 99 / 98 / 99 / 98 / 98 / 97;
#   backward float32, the same -> lagged, 2048 on 4 warps, 5 an SM at 96
#   registers: 120 / 97 / 99 / 97 / 89 / 84 -> 122 / 100 / 101 / 100 / 98 / 94.
# The 16-bit forward keeps the kernel that publishes and then waits: two
# rounds of float32 numerators cost it the programs an SM that its half-size
# segments need (lagged: 70-76%; recomputing the numerators from x instead
# of holding them: 74-89%).
# The interpreter runs one program after another, so no program there could
# ever see another's partial: off on CPU, except in tests, which then take
# the path that computes the partials itself, over _CPU_SEGMENT columns.
_COOPERATIVE_ROWS = {"cuda": True, "cpu": False}
_CPU_SEGMENT = 32
_MAX_SPINS = {"cuda": 1 << 16, "cpu": 0}  # polls of a row's words before computing its partials here


@dataclass(frozen=True)
class _Cooperative:
    kernel: object  # the kernel with its launch config: warps, registers capped
    segment: int  # columns a program holds, on CUDA
    warps: int
    registers: int  # the cap, per thread
    programs_per_sm: int  # wanted; fewer where the SM holds fewer
    lagged: bool  # publishes a round ahead (no LOAD_NEXT: the next round is loaded before the wait)
    shared: int = 0  # bytes of shared memory a program asks for (the Gluon kernels' stages)
    stages: int = 0  # the Gluon kernels' segments staged in shared memory
    full_rows: bool = False  # the kernel takes FULL: rows of whole segments, read without masks


def _cooperative(kernel, segment: int, warps: int, registers: int, programs_per_sm: int) -> _Cooperative:
    tuned = register_capped(kernel, warps, registers)
    lagged = kernel in (softmax_forward_lagged_kernel, softmax_backward_lagged_kernel)
    return _Cooperative(tuned, segment, warps, registers, programs_per_sm, lagged)


# Keyed by element size (float64 keeps the other designs).
_COOPERATIVE_FORWARD = {
    2: _cooperative(softmax_forward_cooperative_kernel, 8192, 8, 80, 3),
    4: _cooperative(softmax_forward_lagged_kernel, 4096, 4, 128, 4),
}
_COOPERATIVE_BACKWARD = {
    2: _cooperative(softmax_backward_lagged_kernel, 4096, 4, 128, 4),
    4: _cooperative(softmax_backward_lagged_kernel, 2048, 4, 96, 5),
}

# The 16-bit forward's next segment staged in shared memory (Gluon, see
# _softmax_gluon), for eager CUDA launches on Hopper or newer.  Segments of
# 8192 columns on 8 warps, one round ahead (two stages), 4 programs an SM at
# 64 registers.  H100, % of copy at 4096x40000 / 1024x65536 / 600x131072 /
# 256x262144 / 128x524288 / 64x1048576, against the Triton kernel's
# 76 / 80 / 80 / 81 / 75 / 75 in the same process, both publishing through a
# counter with a release: 83 / 83 / 83 / 83 / 80 / 78 (3 an SM: 78-79; four
# stages, 3 an SM: 72-79; 16384 columns on 16 warps, 2 an SM: 76-82; 4096 on
# 4 warps, 6 an SM: 67-77).  With partials published as one word each the
# two kernels are within 2 points of each other; the stages still win by 1-2
# on the longest rows (docs/perf-notes.md, version 18).  Float32 rows take
# the lagged Triton kernel: 2-9 points ahead of this one's float32 setup.
try:  # after the kernel pieces above, which the Gluon module reuses
    from . import gluon as _softmax_gluon
except (ImportError, AttributeError):  # pragma: no cover - a Triton without the Gluon parts it uses
    _softmax_gluon = None


def _staged(
    kernel, segment: int, warps: int, programs_per_sm: int, stages: int, full_rows: bool = False
) -> _Cooperative:
    """A Gluon forward's setup for 16-bit x: 64 registers a thread, `stages` segments of x in shared memory."""
    return _Cooperative(kernel, segment, warps, 64, programs_per_sm, lagged=False, shared=stages * segment * 2,
                        stages=stages, full_rows=full_rows)  # fmt: skip


# Rows of more than _AHEAD_PAST_SEGMENTS segments of 8192 columns, in x's dtype,
# take the Gluon kernel that publishes a round ahead from three stages: 4096
# columns on 4 warps, 8 an SM (8192 columns on 8 warps, 4 an SM, ran 3 points
# slower up to 1M columns; 2048 on 2 warps collapsed past 256 segments a
# row, each program polling every word of its row).  H100, % of a
# same-size copy, bf16 / fp16, rows of 262144 / 393216 / 524288 / 1048576 /
# 2097152 columns: 86 / 88 / 87 / 86 / 79 and 88 / 90 / 88 / 87 / 82 against
# the staged kernel's 90 / 89 / 86 / 81 / 71 and 91 / 89 / 87 / 82 / 70; at
# 65536 columns 85 against 92.  A float32 y of a 16-bit x keeps the staged
# kernel at every length (88-92 against 86-92 up to 1M columns): its stores,
# two thirds of the bytes, were not waiting (docs/perf-notes.md, version 25).
# With exp as one instruction (version 39) the second exp costs less: CUDA-graph
# µs, staged / ahead, bf16 rows of 65536 / 131072 / 262144 / 524288 columns,
# 99.7 / 104.2, 97.4 / 100.0, 98.2 / 99.1, 102.0 / 98.7 (fp16 alike): the
# threshold moved from 64 segments to 32.
_AHEAD_PAST_SEGMENTS = 32

if _softmax_gluon is not None:
    _STAGED_FORWARD = {2: _staged(_softmax_gluon.softmax_forward_staged_kernel, 8192, 8, 4, stages=2)}
    # Only this one takes FULL: the other Gluon forward ran 1.5-3% slower with it (perf notes 39).
    _STAGED_AHEAD_FORWARD = _staged(_softmax_gluon.softmax_forward_staged_ahead_kernel, 4096, 4, 8, stages=3,
                                    full_rows=True)  # fmt: skip
else:  # pragma: no cover - a Triton without Gluon
    _STAGED_FORWARD, _STAGED_AHEAD_FORWARD = {}, None


# Where the 16-bit forward issues the next round's loads.  A row of few
# segments waits briefly for its partials, so most of a round is the
# partial's own work (the exp, the reductions): loads issued before it
# overlap it.  A row of many segments waits on the slowest of many programs,
# and loads issued after the publish fill that wait.  H100, % of copy, rows
# of 5 / 8 / 16 / 32 / 64 / 128 segments, during the wait -> before the
# partial: bf16 forward 74 / 78 / 79 / 81 / 75 / 74 -> 76 / 80 / 79 / 82 /
# 74 / 71 (the bf16 backward, then loading ahead too: 84 / 86 / 89 / 89 /
# 84 / 82 -> 90 / 90 / 92 / 89 / 85 / 80).
_LOAD_BEFORE_PARTIAL_SEGMENTS = 32


def _next_load(n_segments: int) -> str:
    """softmax_forward_cooperative_kernel's LOAD_NEXT: when the next round's segment is loaded."""
    return "before_partial" if n_segments <= _LOAD_BEFORE_PARTIAL_SEGMENTS else "during_wait"


@dataclass(frozen=True)
class _Kernels:
    """One direction's kernels, a design each (see the module docstring)."""

    single: object  # the row in one block
    looped: object  # one program per row, chunk by chunk
    partials: object  # split rows, pass 1: (inputs..., partials..., n_cols, inner, segment_len)
    finish: object  # split rows, pass 2: (inputs..., output, partials..., n_cols, inner, segment_len)
    n_partials: int  # scratch tensors pass 1 fills
    cooperative: dict  # element size -> _Cooperative: rows held on chip across programs (none for float64)


_FORWARD = _Kernels(
    single=softmax_forward_kernel,
    looped=softmax_forward_online_kernel,
    partials=softmax_partial_stats_kernel,
    finish=softmax_normalize_segments_kernel,
    n_partials=2,  # max and sum
    cooperative=_COOPERATIVE_FORWARD,
)
_BACKWARD = _Kernels(
    single=softmax_backward_kernel,
    looped=softmax_backward_looped_kernel,
    partials=softmax_backward_partial_dot_kernel,
    finish=softmax_backward_segments_kernel,
    n_partials=1,  # sum(dy * y)
    cooperative=_COOPERATIVE_BACKWARD,
)


def _rows_per_program(n_rows, block: int, device: torch.device) -> int:
    """BLOCK_M: how many whole rows of `block` columns one program reduces.

    Every program costs the GPU a start: 65536 rows of 128 bfloat16 columns,
    one a program, ran 41 µs on an H100 where tiles of 8 rows took 10 µs
    (CUDA-graph time).  Rows are stacked up to _ROW_TILE elements, but never
    below _target_programs programs: at 1000x100 one row a program ran 1.8-2.2
    µs and tiles of 4 rows (250 programs) 2.5-2.9.  Rows of 1024 columns or
    more keep a program each; larger tiles lost there (4096x1024 float32:
    10.6 µs a row a program, 12.1-13.3 in tiles of 4 rows)."""
    kind = _kind(device)
    rows = at_most(n_rows // _target_programs(device), max(1, _ROW_TILE[kind] // block))
    return 1 << (max(rows, 1).bit_length() - 1)  # down to a power of two, a tl.arange length


def _target_programs(device: torch.device) -> int:
    return _PROGRAMS_PER_SM * _sm_count(device.index) if device.type == "cuda" else _CPU_PROGRAMS


def _split(n_rows: int, n_cols: int, device: torch.device) -> tuple[int, int]:
    """(n_segments, segment_len) for rows longer than a block; 1 segment: one program per row.

    One program streams its row through one SM, so with fewer rows than a
    few per SM most of the GPU idles (64 rows of 2**20 bfloat16 columns got
    18% of an H100's copy bandwidth).  Cutting each row into segments brings
    the grid to about _target_programs, in segments of at least
    _MIN_SEGMENT_CHUNKS chunks (a row's last segment may be shorter): each
    segment costs a partial, its share of the combine and a loop start-up,
    worth paying only while SMs would idle.  With enough rows: one segment.
    Segments are whole chunks, so only the last chunk of a row is ever short.
    """
    chunk = _CHUNK[_kind(device)]
    wanted = cdiv(_target_programs(device), n_rows)
    n_segments = max(min(wanted, n_cols // (_MIN_SEGMENT_CHUNKS * chunk)), 1)
    segment_len = cdiv(cdiv(n_cols, n_segments), chunk) * chunk
    return cdiv(n_cols, segment_len), segment_len  # rounding up may leave fewer segments


def _cooperative_plan(setup: _Cooperative, n_rows: int, n_cols: int, device: torch.device) -> tuple[int, int] | None:
    """(n_segments, rows_at_once) for rows held on chip across programs; None where they cannot be:
    off on this kind of device, or a row of more segments than the grid holds (past about 3
    million columns on an H100), which is split instead."""
    kind = _kind(device)
    if not _COOPERATIVE_ROWS[kind]:
        return None
    if kind == "cuda":
        programs = device_facts(device).programs_at_once(setup.warps, setup.registers, setup.programs_per_sm, setup.shared)
    else:
        programs = _CPU_PROGRAMS
    return fit_rows(n_rows, cdiv(n_cols, _segment_len(setup, kind)), programs)


def _scratch_partials(like: torch.Tensor, n_rows: int, n_segments: int, count: int) -> list[torch.Tensor]:
    """`count` (n_rows, n_segments) scratch tensors for partials, in the dtype the kernels
    compute in: float64 for float64 inputs (`like`, the first), else float32."""
    dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
    return [torch.empty(n_rows, n_segments, dtype=dtype, device=like.device) for _ in range(count)]


def _run_cooperative(setup: _Cooperative, plan, tensors, n_cols, inner, **flags):
    like = tensors[-1]
    n_rows, kind = like.numel() // n_cols, _kind(like.device)
    n_segments, rows_at_once = plan
    if not setup.lagged:
        flags["LOAD_NEXT"] = _next_load(n_segments)
    words, overlap = held_rows_scratch(like, n_rows, n_segments, overlapped=may_overlap_fill(device_facts(like.device)))
    launcher(setup.kernel, like)[(rows_at_once * n_segments,)](
        *tensors, words, n_rows, n_cols, inner, n_segments, rows_at_once, _MAX_SPINS[kind],
        SEGMENT=_segment_len(setup, kind), SEGMENTS_BLOCK=words_block(setup.warps, n_segments), **flags, **overlap,
    )


def _staged_setup(kernels: _Kernels, tensors, n_cols: int, inner: int) -> _Cooperative | None:
    """The Gluon forward's setup where it applies: an eager launch (torch.compile traces Triton kernels
    only) of 16-bit rows on Hopper or newer, rows along the last dim, every row start 16-byte aligned.
    Keyed by x's element size: what it stages in shared memory.  A float32 y of a 16-bit x takes it
    too, each thread's VEC elements 16 bytes of y (8-byte copies of x): 88-93% of a same-size copy
    against the lagged Triton kernel's 79-82; 16 bytes of x (32 of y) fell to 62-70 (perf notes, version 24).
    Rows of more than _AHEAD_PAST_SEGMENTS segments, x and y of one dtype, take the kernel that publishes
    a round ahead."""
    if kernels is not _FORWARD:
        return None
    x, y = tensors
    if y.device.type != "cuda" or not launching_directly():
        return None
    setup = _STAGED_FORWARD.get(x.element_size())
    if setup is None or inner != 1 or n_cols % 16 or cuda_capability(y.device.index)[0] < 9:
        return None
    if not all(t.data_ptr() % 16 == 0 for t in tensors):
        return None
    if y.element_size() == x.element_size() and cdiv(n_cols, setup.segment) > _AHEAD_PAST_SEGMENTS:
        return _STAGED_AHEAD_FORWARD
    return setup


def _run_staged(setup: _Cooperative, plan, tensors, n_cols):
    x, y = tensors
    n_rows = y.numel() // n_cols
    n_segments, rows_at_once = plan
    words, overlap = held_rows_scratch(y, n_rows, n_segments, overlapped=may_overlap_fill(device_facts(y.device)))
    flags = {"FULL": n_cols % setup.segment == 0} if setup.full_rows else {}
    launcher(setup.kernel, y)[(rows_at_once * n_segments,)](
        x, y, words, n_rows, n_cols, n_segments, rows_at_once, _MAX_SPINS["cuda"],
        SEGMENT=setup.segment, SEGMENTS_BLOCK=words_block(setup.warps, n_segments), STAGES=setup.stages,
        VEC=16 // _widest(tensors), num_warps=setup.warps, maxnreg=setup.registers, **overlap, **flags,
    )


def _widest(tensors) -> int:
    """The largest element size among a launch's tensors, which picks its on-chip setup."""
    return max(t.element_size() for t in tensors)


def _segment_len(setup: _Cooperative, kind: str) -> int:
    return setup.segment if kind == "cuda" else _CPU_SEGMENT


def _launch(kernels: _Kernels, tensors, n_cols, inner):
    """Launch the design that fits the row length and count; tensors: inputs..., output.

    The output's dtype may differ from the inputs' (a 16-bit x with a float32
    y, see _softmax); the on-chip setups are then those of the widest."""
    like = tensors[-1]
    n_rows = like.numel() // n_cols
    kind = _kind(like.device)
    block = next_power_of_2(n_cols)
    flags = {"NATIVE_16BIT": kind == "cuda"} if kernels is _BACKWARD else {}  # see _rounded_product
    col_multiple = flags["COL_MULTIPLE"] = column_multiple(n_cols)  # see ops/_alignment.py
    if block <= _MAX_BLOCK[kind]:
        return _run_rows(kernels.single, tensors, n_rows, n_cols, inner, block, **flags)
    setup = kernels.cooperative.get(_widest(tensors))
    plan = _cooperative_plan(setup, n_rows, n_cols, like.device) if setup is not None else None
    # The Triton grid gates the Gluon one too.  The Gluon grids hold longer rows (4.3M
    # 16-bit columns on an H100, against 3.2M), but rows past 3.2M are faster split:
    # a round then holds one row and waits on all of its programs (4M columns: 49-50%
    # of a same-size copy held, 61-62 split; docs/perf-notes.md, version 26).
    if plan is not None:
        staged = _staged_setup(kernels, tensors, n_cols, inner)
        staged_plan = _cooperative_plan(staged, n_rows, n_cols, like.device) if staged is not None else None
        if staged_plan is not None:
            return _run_staged(staged, staged_plan, tensors, n_cols)
        return _run_cooperative(setup, plan, tensors, n_cols, inner, **flags)
    n_segments, segment_len = _split(n_rows, n_cols, like.device)
    if n_segments == 1:
        return _run(kernels.looped, (n_rows,), tensors, n_cols, inner, BLOCK_SIZE=_CHUNK[kind], COL_MULTIPLE=col_multiple)
    # Split rows: pass 1 writes one partial per (row, segment); pass 2 combines a row's partials.
    partials = _scratch_partials(tensors[0], n_rows, n_segments, kernels.n_partials)
    grid, sizes = (n_rows, n_segments), (n_cols, inner, segment_len)
    _run(kernels.partials, grid, (*tensors[:-1], *partials), *sizes, BLOCK_SIZE=_CHUNK[kind], COL_MULTIPLE=col_multiple)
    segments_block = next_power_of_2(n_segments)
    _run(kernels.finish, grid, (*tensors, *partials), *sizes, BLOCK_SIZE=_CHUNK[kind], SEGMENTS_BLOCK=segments_block,
         COL_MULTIPLE=col_multiple)  # fmt: skip


def _run_rows(kernel, tensors, n_rows, n_cols, inner, block, **flags):
    """Rows that fit a block: tiles of whole rows (see _rows_per_program)."""
    rows = _rows_per_program(n_rows, block, tensors[-1].device)
    launcher(kernel, tensors[-1])[(cdiv(n_rows, rows),)](
        *tensors, n_rows, n_cols, inner, BLOCK_M=rows, BLOCK_N=block, num_warps=warps_for(rows * block), **flags
    )


def _run(kernel, grid, tensors, *sizes, BLOCK_SIZE, **constexprs):
    launcher(kernel, tensors[-1])[grid](*tensors, *sizes, BLOCK_SIZE=BLOCK_SIZE, num_warps=warps_for(BLOCK_SIZE), **constexprs)


def _normalize_dim(op: str, x: torch.Tensor, dim: int) -> int:
    rank = max(x.dim(), 1)  # a 0-d tensor is a row of one, as in torch.softmax
    if not -rank <= dim < rank:
        raise IndexError(f"tk.{op}: dim {dim} is out of range for a {x.dim()}-D tensor (expected {-rank} to {rank - 1})")
    return dim % rank


def _check_row_count(op: str, x: torch.Tensor, dim: int) -> None:
    """Each row is one program of the grid's first axis, which holds 2**31 - 1 on CUDA."""
    if x.device.type != "cuda":
        return
    n_cols, _ = _cols_and_inner(x, dim)
    n_rows = x.numel() // max(n_cols, 1)
    if n_rows > 2**31 - 1:
        raise ValueError(
            f"tk.{op}: {n_rows} rows of {n_cols} along dim {dim} of shape {tuple(x.shape)}: "
            "more than a CUDA grid holds (2**31 - 1); softmax over a longer dim, or split the tensor"
        )


def _cols_and_inner(x: torch.Tensor, dim: int) -> tuple[int, int]:
    """Row length and the distance between a row's elements, for softmax along `dim`."""
    if x.dim() == 0:
        return 1, 1
    return x.shape[dim], _prod(x.shape[dim + 1 :])


def _prod(sizes) -> int:
    out = 1
    for s in sizes:
        out *= s
    return out


def _softmax(x: torch.Tensor, dim: int = -1, dtype: torch.dtype | None = None) -> torch.Tensor:
    """As torch.softmax(x, dim, dtype): with `dtype`, x is cast to it first and y comes in it.
    A 16-bit x with dtype float32, what autocast asks for on CUDA and what attention
    code writes, is read as it is and y written in float32: 6 bytes an element."""
    check_tensor("softmax", "x", x)
    dim = _normalize_dim("softmax", x, dim)
    _check_row_count("softmax", x, dim)
    dtype = result_dtype("softmax", "dtype", dtype, x.dtype)
    if dtype != x.dtype and not reads_as_float32(x.dtype, dtype):
        x = x.to(dtype)
    x = x.contiguous()  # the (outer, n_cols, inner) view needs the standard layout
    y = torch.empty_like(x, dtype=dtype)
    if x.numel() == 0:
        return y
    n_cols, inner = _cols_and_inner(x, dim)
    _launch(_FORWARD, (x, y), n_cols, inner)
    return y


def _softmax_backward(grad: torch.Tensor, y: torch.Tensor, dim: int, input_dtype: torch.dtype | None = None) -> torch.Tensor:
    """dx for y = softmax(x, dim); dx comes in `input_dtype`, x's dtype (y's if None), which
    differs from y's when the forward was given a dtype: float32 grad and y give a bfloat16 dx."""
    check_tensor("softmax_backward", "grad", grad)
    check_tensor("softmax_backward", "y", y)
    check_same("softmax_backward", {"grad": grad, "y": y})
    if grad.shape != y.shape:
        raise ValueError(f"tk.softmax_backward: grad has shape {tuple(grad.shape)} but y has {tuple(y.shape)}")
    dim = _normalize_dim("softmax_backward", y, dim)
    _check_row_count("softmax_backward", y, dim)
    input_dtype = result_dtype("softmax_backward", "input_dtype", input_dtype, y.dtype)
    grad, y = grad.contiguous(), y.contiguous()
    dx = torch.empty_like(y, dtype=input_dtype)
    if y.numel() == 0:
        return dx
    n_cols, inner = _cols_and_inner(y, dim)
    _launch(_BACKWARD, (grad, y, dx), n_cols, inner)
    return dx


softmax = register_op("softmax", _softmax)
softmax_backward = register_op("softmax_backward", _softmax_backward)
# Under autocast, as torch.softmax: on CUDA an unset dtype becomes float32 (x is
# read as it comes, y is float32); on the CPU nothing changes.
follow_autocast("softmax", {"cuda": FLOAT32_RESULT})


# dx = y * (dy - sum(dy * y)): the backward reads the result y, not x, and x's dtype.
register_formula(
    softmax, backward=softmax_backward, arguments=(GRAD, RESULT, "dim", dtype_of("x")), gradients={"x": 0}
)
