"""Which softmax design a call takes, and with what sizes: ``choose_plan(meta, tuning) -> Plan``.

A pure function of what a call is (``Meta``: shapes, element sizes, 16-byte
alignment, the device's facts, whether the call is eager) and of the tuned
constants (``Tuning``), so the same call always gets the same plan and a test
can plan for an H100 (``ops.runtime.H100``) on a machine without a GPU.
``launch.run(plan, tensors)`` then launches it and decides nothing.

The rule, in order (docs/ops/softmax.md has the table with its numbers):

1. the row fits a block (``max_block``): ``BlockPlan``, tiles of whole rows.
   The backward's exceptions on a GPU: float32 rows past
   ``backward_float32_max_block`` go to 2; 16-bit rows that fill at most
   ``backward_sparse_fill`` of a block of 8192 or 16384 take a ``LoopedPlan``
   of one chunk (the dot, then the row read again), of 32768 go to 2 in
   short segments (``backward_16bit_sparse``).  float32 forwards of a block
   of 16384 take that one-chunk LoopedPlan too;
2. rows held on chip across programs (``HeldPlan``) where a held design exists
   for the dtype (16- and 32-bit, not float64), is on for the device, and a
   row's segments all fit the persistent grid.  Eager 16-bit forwards of
   aligned rows on Hopper take a Gluon design (staged, or staged-ahead for the
   longest rows of one dtype) where its own grid holds the row;
3. else the row is read twice: ``SplitPlan`` (a row cut into segments over a
   (row, segment) grid) when too few rows would fill the GPU, ``LoopedPlan``
   (one program a row) otherwise.
"""

from dataclasses import dataclass
from typing import Literal

from ..blocks.alignment import column_multiple, frame_run
from ..blocks.held_rows import HeldSetup, fit_rows, words_block
from ..blocks.sizes import at_most, cdiv, next_power_of_2, warps_for
from ..runtime import DeviceFacts

FORWARD, BACKWARD = "forward", "backward"  # y = softmax(x), and dx from dy and y

# The kernels of rows held on chip across programs (held.py, gluon.py).
PUBLISH_THEN_WAIT = "publish_then_wait"  # publish this row's partial, then wait (softmax_forward_held_kernel)
LAGGED = "lagged"  # publish the next row's partial before waiting for this row's (the *_lagged_kernel)
STAGED = "staged"  # Gluon: the next segments staged in shared memory (softmax_forward_staged_kernel)
STAGED_AHEAD = "staged_ahead"  # Gluon: staged and publishing a round ahead (softmax_forward_staged_ahead_kernel)
GLUON_FAMILIES = (STAGED, STAGED_AHEAD)

Family = Literal["publish_then_wait", "lagged", "staged", "staged_ahead"]


@dataclass(frozen=True)
class HeldDesign:
    """One held-rows kernel of softmax and how it runs on a GPU: its family, its HeldSetup
    (segment, warps, register cap, programs an SM, shared memory), and for the Gluon
    kernels the segments staged in shared memory and whether it takes FULL (rows of
    whole segments, read without masks).  The Gluon kernels run at 64 registers a thread
    and ask for `stages` segments of 16-bit x in shared memory."""

    family: Family
    setup: HeldSetup
    stages: int = 0
    full_rows: bool = False


@dataclass(frozen=True)
class Tuning:
    """Every constant the plan uses.  Plain fields are for the GPU; cpu_ fields for Triton's
    interpreter, which has no registers, only per-program Python overhead, and runs one program
    after another.  Tests shrink the cpu_ fields (``dataclasses.replace(TUNING, ...)``) so that
    rows of a few hundred columns reach every design.  Numbers: H100, docs/perf-notes.md."""

    # -- Rows that fit a block.
    # Longest row held in one block.  A row of 32768 float32 over 32 warps (32 registers a
    # thread) ran at 89% of copy bandwidth, where the looped kernel, reading x twice, got 65%;
    # at 65536 the block spills (59%) (version 2).
    max_block: int = 32768
    cpu_max_block: int = 1 << 16
    # The backward's block holds a row of dy and y across the row's reduction, so a program's registers
    # grow with the block, not the row.  H200, bf16 / float32 dx, rows of 4095, % of a copy of the same
    # bytes (perf-notes version 61):
    # - float32 rows of 16385-32768 columns (a block of 32768 float32) ran at 77-81%, held across
    #   programs (backward_float32) at 99-102; Liger's block at 81-89.  Up to 16384 the block ran 100-102.
    backward_float32_max_block: int = 16384
    # - 16-bit rows that fill at most 7/8 of their block ran at 81-95% (4095x9216 / 11008 / 13824 /
    #   14336: 81 / 87 / 95 / 95).  The idle lanes hold registers too.  One program a row that reads the row once
    #   for the dot and again (from L1 / L2) for dx (a LoopedPlan of one chunk, the reloading pass)
    #   keeps no row across the reduction: 93 / 94 / 100 / 99 at 8 warps for blocks of 16384; 4095x5120
    #   and 8191x4608 (blocks of 8192) 104 / 99 at 16 warps, where the block ran 94 / 88 (4095x7168, 7/8
    #   of its block: 102 against 103).  Other warps ran 2-26 points slower.  Fuller rows: the block.
    backward_sparse_fill: tuple[int, int] = (7, 8)  # at most 7/8, compared in integers
    backward_reload_warps: tuple[tuple[int, int], ...] = ((8192, 16), (16384, 8))  # (block, warps)
    # - 16-bit rows of such a block of 32768 (4095x18432 / 20480) ran 85 / 85 as a block, 72 / 72
    #   reloading; held in segments of 2048 on 2 warps, 8 programs an SM, 95 / 92 (backward_16bit's
    #   4096 on 4 warps: 88 / 89).  At 28672 / 32000 / 32768 that setup ran 95 / 94 / 91 against the
    #   block's 94 / 95 / 93.
    backward_sparse_held_block: int = 32768
    # The float32 forward's block of 16384 (x and y float32) ran at 72 / 81 / 85% of copy at 4095x11008 /
    # 13824 / 4096x16384, the reloading pass (an online max and sum, then the row read again) at 16 warps
    # 90 / 97 / 93 (8 warps 0-2 points below; Liger-Kernel's block 99 / 97 / 96).  Blocks of 8192 and 32768
    # kept the block: 97-99% at 4095x5120 and 8191x4608, 88 / 98 at 20480 / 32000 against 80 / 93
    # reloaded.  16-bit forwards kept it: 81-92% up to blocks of 16384, level with Liger's; at 4095x20480 /
    # 32000 (blocks of 32768) 59 / 78, Liger's 57 / 76, reloading 48 / 68, held 32 / 35 (perf-notes 61).
    forward_float32_reload_warps: tuple[tuple[int, int], ...] = ((16384, 16),)  # (block, warps)
    backward_16bit_sparse: HeldDesign = HeldDesign(LAGGED, HeldSetup(2048, 2, 128, 8))
    # Short rows are stacked into tiles of at most this many elements; a row at least this long
    # has a program of its own (version 12; see _rows_per_program).
    row_tile: int = 1024
    cpu_row_tile: int = 1 << 14

    # -- Rows past a block, read twice (looped, split).
    # The looped and split kernels stream chunks of this many elements over 32 warps: 68% of copy
    # against 62% for 4096 over 8 warps at 1024x65536, since fewer, wider programs keep a row's
    # second read in L2 (version 2).
    chunk: int = 16384
    cpu_chunk: int = 1 << 14
    # Programs wanted on the GPU: enough to keep every SM streaming (split rows, version 2;
    # also the floor of the short-row tiles, version 12).
    programs_per_sm: int = 4
    cpu_programs: int = 8  # the interpreter: a small target, so CPU tests reach the split and held designs cheaply
    min_segment_chunks: int = 4  # the shortest split segment, in chunks: each costs a partial and a loop start-up

    # -- Rows held on chip across programs (see held.py and ops/blocks/held_rows.py).
    # The register cap sets how many programs share an SM, and with the segment each holds, the
    # bytes each SM has in flight while its programs wait for each other: the number that decided
    # the first design, against 60-70% of copy for the two-read designs (version 9).  Loading the
    # next round's segment before the wait lifted the 16-bit forward from 46-49% to 72-77%;
    # keeping exp(x - segment max) instead of x (one multiply after the wait) and publishing each
    # partial as one word (no release) brought it to 81-94% (versions 13 and 18).  Publishing a
    # round ahead (the lagged kernels) is what closed the gap on the longest rows, where a row
    # waits on 64-128 programs: % of a copy of the same bytes at 4096x40000 / 1024x65536 /
    # 600x131072 / 256x262144 / 128x524288 / 64x1048576, CUDA-graph time, the same process
    # (version 19):
    #   forward float32, 8192 columns on 8 warps, 2 an SM -> lagged, 4096 on 4 warps, 4 an SM:
    #   120 / 96 / 96 / 94 / 87 / 85 -> 121 / 96 / 97 / 97 / 96 / 95;
    #   backward bf16, 8192 on 8 warps, 2 an SM -> lagged, 4096 on 4 warps, 4 an SM:
    #   99 / 99 / 99 / 97 / 92 / 87 -> 99 / 98 / 99 / 98 / 98 / 97;
    #   backward float32, the same -> lagged, 2048 on 4 warps, 5 an SM at 96 registers:
    #   120 / 97 / 99 / 97 / 89 / 84 -> 122 / 100 / 101 / 100 / 98 / 94.
    # The 16-bit forward keeps the kernel that publishes and then waits: two rounds of float32
    # numerators cost it the programs an SM that its half-size segments need (lagged: 70-76%;
    # recomputing the numerators from x instead of holding them: 74-89%).
    # Keyed by the widest element of a call (float64 keeps the other designs).
    forward_16bit: HeldDesign = HeldDesign(PUBLISH_THEN_WAIT, HeldSetup(8192, 8, 80, 3))
    forward_float32: HeldDesign = HeldDesign(LAGGED, HeldSetup(4096, 4, 128, 4))
    backward_16bit: HeldDesign = HeldDesign(LAGGED, HeldSetup(4096, 4, 128, 4))
    backward_float32: HeldDesign = HeldDesign(LAGGED, HeldSetup(2048, 4, 96, 5))
    # The 16-bit forward of rows off 16-byte boundaries (framed, see _frame): publishing then waiting at 80
    # registers ran 4096x50257 bf16 at 29% of copy, its framed edges on top of a prefetched segment
    # spilling (114 spill instructions in its SASS, 83 unframed), where the lagged backward of the same
    # rows, at 128 registers, ran at 97% (version 45).
    forward_16bit_framed: HeldDesign = HeldDesign(LAGGED, HeldSetup(4096, 4, 128, 4))
    # Where the 16-bit forward (PUBLISH_THEN_WAIT) issues the next round's loads (LOAD_NEXT).  A
    # row of few segments waits briefly for its partials, so most of a round is the partial's own
    # work (the exp, the reductions): loads issued before it overlap it.  A row of many segments
    # waits on the slowest of many programs, and loads issued after the publish fill that wait.
    # % of copy, rows of 5 / 8 / 16 / 32 / 64 / 128 segments, during the wait -> before the
    # partial: bf16 forward 74 / 78 / 79 / 81 / 75 / 74 -> 76 / 80 / 79 / 82 / 74 / 71 (the bf16
    # backward, then loading ahead too: 84 / 86 / 89 / 89 / 84 / 82 -> 90 / 90 / 92 / 89 / 85 / 80)
    # (version 14).
    load_before_partial_segments: int = 32
    # The 16-bit forward's next segment staged in shared memory (Gluon, gluon.py), for eager CUDA
    # launches on Hopper or newer.  Segments of 8192 columns on 8 warps, one round ahead (two
    # stages), 4 programs an SM at 64 registers.  % of copy at 4096x40000 / 1024x65536 /
    # 600x131072 / 256x262144 / 128x524288 / 64x1048576, against the Triton kernel's
    # 76 / 80 / 80 / 81 / 75 / 75 in the same process, both publishing through a counter with a
    # release: 83 / 83 / 83 / 83 / 80 / 78 (3 an SM: 78-79; four stages, 3 an SM: 72-79; 16384
    # columns on 16 warps, 2 an SM: 76-82; 4096 on 4 warps, 6 an SM: 67-77) (version 17).  With
    # partials published as one word each the two kernels are within 2 points of each other; the
    # stages still win by 1-2 on the longest rows (version 18).  Float32 rows take the lagged
    # Triton kernel: 2-9 points ahead of this one's float32 setup (version 19).  A float32 y of a
    # 16-bit x takes it too, each thread's VEC elements 16 bytes of y (8-byte copies of x): 88-93%
    # of a same-size copy against the lagged Triton kernel's 79-82; 16 bytes of x (32 of y) fell
    # to 62-70 (version 24).
    staged: HeldDesign = HeldDesign(STAGED, HeldSetup(8192, 8, 64, 4, shared=2 * 8192 * 2), stages=2)
    # Rows of more than ahead_past_segments segments of the staged design's columns, x and y of
    # one dtype, take the Gluon kernel that publishes a round ahead from three stages: 4096
    # columns on 4 warps, 8 an SM (8192 columns on 8 warps, 4 an SM, ran 3 points slower up to 1M
    # columns; 2048 on 2 warps collapsed past 256 segments a row, each program polling every word
    # of its row).  % of a same-size copy, bf16 / fp16, rows of 262144 / 393216 / 524288 /
    # 1048576 / 2097152 columns: 86 / 88 / 87 / 86 / 79 and 88 / 90 / 88 / 87 / 82 against the
    # staged kernel's 90 / 89 / 86 / 81 / 71 and 91 / 89 / 87 / 82 / 70; at 65536 columns 85
    # against 92.  A float32 y of a 16-bit x keeps the staged kernel at every length (88-92
    # against 86-92 up to 1M columns): its stores, two thirds of the bytes, were not waiting
    # (version 25).  Only this kernel takes FULL: the other Gluon forward ran 1.5-3% slower with
    # it (version 39).
    staged_ahead: HeldDesign = HeldDesign(
        STAGED_AHEAD, HeldSetup(4096, 4, 64, 8, shared=3 * 4096 * 2), stages=3, full_rows=True
    )
    # With exp as one instruction (version 39) the second exp costs less: CUDA-graph µs, staged /
    # ahead, bf16 rows of 65536 / 131072 / 262144 / 524288 columns, 99.7 / 104.2, 97.4 / 100.0,
    # 98.2 / 99.1, 102.0 / 98.7 (fp16 alike): the threshold moved from 64 segments to 32.
    ahead_past_segments: int = 32
    # Whether rows past a block are held at all.  The interpreter runs one program after another,
    # so no program there could ever see another's partial: off on CPU, except in tests, which
    # then take the path that computes the partials itself, over cpu_segment columns a program.
    held_rows: bool = True
    cpu_held_rows: bool = False
    cpu_segment: int = 32
    # Polls of a row's words before a program computes the row's partials itself (held_rows.py):
    # the kernel cannot hang where fewer programs run at once than the grid.  0 on the
    # interpreter, where no other program runs meanwhile.
    max_spins: int = 1 << 16
    cpu_max_spins: int = 0


TUNING = Tuning()


@dataclass(frozen=True)
class Meta:
    """What a call is, all the plan reads: `n_rows` rows of `n_cols` columns, a row's elements
    `inner` apart (1: the last dim); the element sizes of the inputs (x; dy and y) and of the
    output (y; dx); the device's facts; and the call's context: an eager launch (not traced for
    Inductor), every tensor's start 16-byte aligned (read in eager CUDA calls only), the held
    kernels may start while their scratch fill runs (held_rows.may_overlap_fill), and this
    Triton has the Gluon kernels."""

    direction: str
    n_rows: int
    n_cols: int
    inner: int
    input_bytes: int
    output_bytes: int
    facts: DeviceFacts
    eager: bool = False
    aligned: bool = False
    overlap_fill: bool = False
    gluon: bool = False

    @property
    def widest(self) -> int:
        """The largest element size among the call's tensors, which picks its held design."""
        return max(self.input_bytes, self.output_bytes)


@dataclass(frozen=True)
class Rows:
    """What every launch covers: n_rows rows of n_cols columns, a row's elements `inner` apart.
    col_multiple: the kernels' COL_MULTIPLE (ops/blocks/alignment.py)."""

    n_rows: int
    n_cols: int
    inner: int
    col_multiple: int


@dataclass(frozen=True)
class BlockPlan:
    """Rows that fit a block: a program reduces a tile of block_m whole rows of block_n columns."""

    direction: str  # FORWARD or BACKWARD: whose kernels
    rows: Rows
    block_m: int
    block_n: int
    warps: int

    @property
    def grid(self) -> tuple:
        return (cdiv(self.rows.n_rows, self.block_m),)


@dataclass(frozen=True)
class LoopedPlan:
    """One program a row, chunk by chunk: an online (max, sum) pass, then a pass to write."""

    direction: str  # FORWARD or BACKWARD: whose kernels
    rows: Rows
    chunk: int
    warps: int

    @property
    def grid(self) -> tuple:
        return (self.rows.n_rows,)


@dataclass(frozen=True)
class SplitPlan:
    """Rows cut into n_segments of segment_len columns (whole chunks; the last may be short), a
    (row, segment) grid: pass 1 writes each segment's partial, pass 2 combines a row's and writes."""

    direction: str  # FORWARD or BACKWARD: whose kernels
    rows: Rows
    n_segments: int
    segment_len: int
    chunk: int
    warps: int
    segments_block: int  # a row's partials in one block

    @property
    def grid(self) -> tuple:
        return (self.rows.n_rows, self.n_segments)


@dataclass(frozen=True)
class HeldPlan:
    """Rows held on chip across programs: a persistent grid of rows_at_once rows of n_segments
    programs, each holding `segment` columns on `warps` warps capped at `registers` registers.

    segments_block: a row's words in one block (held_rows.words_block); max_spins: polls before
    a program computes its row's partials itself; overlapped: the kernel starts while its scratch
    fill runs; load_next: PUBLISH_THEN_WAIT's LOAD_NEXT ("before_partial" or "during_wait");
    stages, vec and full: the Gluon kernels' STAGES, VEC and FULL (None: a kernel without it);
    frame: the Triton kernels' FRAME, the elements in a 16-byte run where rows start off 16-byte
    boundaries (ops/blocks/alignment.py: frame_run), else 0."""

    direction: str  # FORWARD or BACKWARD: whose kernels
    rows: Rows
    family: Family
    segment: int
    warps: int
    registers: int
    n_segments: int
    rows_at_once: int
    segments_block: int
    max_spins: int
    overlapped: bool
    load_next: str | None = None
    stages: int = 0
    vec: int = 0
    full: bool | None = None
    frame: int = 0

    @property
    def grid(self) -> tuple:
        return (self.rows_at_once * self.n_segments,)


Plan = BlockPlan | LoopedPlan | SplitPlan | HeldPlan


def choose_plan(meta: Meta, tuning: Tuning = TUNING) -> Plan:
    """The design for `meta` and its launch sizes (see the module docstring for the rule)."""
    cuda = meta.facts.cuda
    rows = Rows(meta.n_rows, meta.n_cols, meta.inner, column_multiple(meta.n_cols))
    block = next_power_of_2(meta.n_cols)
    if _in_one_block(meta, block, tuning):
        return _one_program_a_row(meta, rows, block, tuning)
    held = _held_plan(meta, rows, tuning)
    if held is not None:
        return held
    if cuda and block <= tuning.max_block:  # held first where it fits (_in_one_block's exceptions), else the block
        return _one_program_a_row(meta, rows, block, tuning)
    chunk = tuning.chunk if cuda else tuning.cpu_chunk
    n_segments, segment_len = _split(meta, chunk, tuning)
    if n_segments == 1:
        return LoopedPlan(meta.direction, rows, chunk, warps_for(chunk))
    warps, segments_block = warps_for(chunk), next_power_of_2(n_segments)
    return SplitPlan(meta.direction, rows, n_segments, segment_len, chunk, warps, segments_block)


def _one_program_a_row(meta: Meta, rows: Rows, block: int, tuning: Tuning) -> Plan:
    """Rows in one block each: the reloading pass where the rule names it, else tiles of whole rows."""
    reload_warps = _reload_warps(meta, block, tuning)
    if reload_warps:
        return LoopedPlan(meta.direction, rows, block, reload_warps)
    block_m = _rows_per_program(meta, block, tuning)
    return BlockPlan(meta.direction, rows, block_m, block, warps_for(block_m * block))


def _in_one_block(meta: Meta, block: int, tuning: Tuning) -> bool:
    """Whether a row's `block` (its length up to a power of two) is reduced by one program on its own,
    before held rows are tried: the block kernel, or the reloading pass (a LoopedPlan of one chunk).
    The backward's float32 rows past backward_float32_max_block and sparse 16-bit rows of
    backward_sparse_held_block are held first."""
    if not meta.facts.cuda:
        return block <= tuning.cpu_max_block
    if meta.direction == BACKWARD and meta.widest == 4:
        return block <= min(tuning.backward_float32_max_block, tuning.max_block)
    if _held_sparse(meta, block, tuning):
        return False
    return block <= tuning.max_block


def _held_sparse(meta: Meta, block: int, tuning: Tuning) -> bool:
    """A 16-bit backward row of a block of backward_sparse_held_block that it fills sparsely: held in
    short segments (Tuning.backward_16bit_sparse)."""
    return block == tuning.backward_sparse_held_block and _sparse_16bit_backward(meta, block, tuning)


def _sparse_16bit_backward(meta: Meta, block: int, tuning: Tuning) -> bool:
    """A 16-bit backward on a GPU whose row fills at most backward_sparse_fill of its block."""
    return (
        meta.facts.cuda
        and meta.direction == BACKWARD
        and meta.widest == 2
        and meta.n_cols * tuning.backward_sparse_fill[1] <= tuning.backward_sparse_fill[0] * block
    )


def _reload_warps(meta: Meta, block: int, tuning: Tuning) -> int:
    """The warps of the reloading pass for this row (a LoopedPlan of one chunk), 0 where it takes none."""
    if meta.direction == FORWARD:
        float32 = meta.facts.cuda and meta.input_bytes == meta.output_bytes == 4
        return _warps_at(tuning.forward_float32_reload_warps, block) if float32 else 0
    if not _sparse_16bit_backward(meta, block, tuning):
        return 0
    return _warps_at(tuning.backward_reload_warps, block)


def _warps_at(block_warps: tuple[tuple[int, int], ...], block: int) -> int:
    """The warps a (block, warps) table gives `block`, 0 where it names none."""
    return next((warps for named, warps in block_warps if named == block), 0)


def _target_programs(facts: DeviceFacts, tuning: Tuning) -> int:
    return tuning.programs_per_sm * facts.sm_count if facts.cuda else tuning.cpu_programs


def _rows_per_program(meta: Meta, block: int, tuning: Tuning) -> int:
    """BLOCK_M: how many whole rows of `block` columns one program reduces.

    Every program costs the GPU a start: 65536 rows of 128 bfloat16 columns,
    one a program, ran 41 µs on an H100 where tiles of 8 rows took 10 µs
    (CUDA-graph time).  Rows are stacked up to row_tile elements, but never
    below _target_programs programs: at 1000x100 one row a program ran 1.8-2.2
    µs and tiles of 4 rows (250 programs) 2.5-2.9.  Rows of 1024 columns or
    more keep a program each; larger tiles lost there (4096x1024 float32:
    10.6 µs a row a program, 12.1-13.3 in tiles of 4 rows) (docs/perf-notes.md,
    version 12)."""
    tile = tuning.row_tile if meta.facts.cuda else tuning.cpu_row_tile
    rows = at_most(meta.n_rows // _target_programs(meta.facts, tuning), max(1, tile // block))
    return 1 << (max(rows, 1).bit_length() - 1)  # down to a power of two, a tl.arange length


def _split(meta: Meta, chunk: int, tuning: Tuning) -> tuple[int, int]:
    """(n_segments, segment_len) for rows longer than a block; 1 segment: one program per row.

    One program streams its row through one SM, so with fewer rows than a
    few per SM most of the GPU idles (64 rows of 2**20 bfloat16 columns got
    18% of an H100's copy bandwidth).  Cutting each row into segments brings
    the grid to about _target_programs, in segments of at least
    min_segment_chunks chunks (a row's last segment may be shorter): each
    segment costs a partial, its share of the combine and a loop start-up,
    worth paying only while SMs would idle.  With enough rows: one segment.
    Segments are whole chunks, so only the last chunk of a row is ever short.
    """
    wanted = cdiv(_target_programs(meta.facts, tuning), meta.n_rows)
    n_segments = max(min(wanted, meta.n_cols // (tuning.min_segment_chunks * chunk)), 1)
    segment_len = cdiv(cdiv(meta.n_cols, n_segments), chunk) * chunk
    return cdiv(meta.n_cols, segment_len), segment_len  # rounding up may leave fewer segments


def _held_plan(meta: Meta, rows: Rows, tuning: Tuning) -> HeldPlan | None:
    """Rows held on chip across programs, where they can be: a design for the call's widest
    element (none for float64), held rows on for the device, and a row whose segments all fit
    the grid (past about 3 million 16-bit columns on an H100 they do not: split instead).

    The Triton grid gates the Gluon one too.  The Gluon grids hold longer rows (4.3M 16-bit
    columns on an H100, against 3.2M), but rows past 3.2M are faster split: a round then
    holds one row and waits on all of its programs (4M columns: 49-50% of a same-size copy
    held, 61-62 split; docs/perf-notes.md, version 26)."""
    design = _held_design(meta, tuning)
    fitted = _fit(design, meta, tuning) if design is not None else None
    if fitted is None:
        return None
    staged = _staged_design(meta, tuning)
    staged_fitted = _fit(staged, meta, tuning) if staged is not None else None
    if staged_fitted is not None:
        design, fitted = staged, staged_fitted
    n_segments, rows_at_once = fitted
    setup, cuda = design.setup, meta.facts.cuda
    frame = 0 if design.family in GLUON_FAMILIES else _frame(meta)
    return HeldPlan(
        meta.direction,
        rows,
        family=design.family,
        segment=setup.segment if cuda else tuning.cpu_segment,
        warps=setup.warps,
        registers=setup.registers,
        n_segments=n_segments,
        rows_at_once=rows_at_once,
        segments_block=words_block(setup.warps, n_segments),
        max_spins=tuning.max_spins if cuda else tuning.cpu_max_spins,
        overlapped=meta.overlap_fill,
        load_next=_next_load(n_segments, tuning) if design.family == PUBLISH_THEN_WAIT else None,
        stages=design.stages,
        vec=16 // meta.widest if design.family in GLUON_FAMILIES else 0,
        full=meta.n_cols % setup.segment == 0 if design.full_rows else None,
        frame=frame,
    )


def _frame(meta: Meta) -> int:
    """FRAME of the Triton held kernels: rows of 50257 bfloat16 start off 16-byte boundaries (seven in
    eight), and read from their first element they moved one element an access, at 27% of copy
    bandwidth on an H100 where rows of 50304 ran at 94 (version 45)."""
    return frame_run(meta.n_cols, meta.inner, meta.input_bytes, meta.output_bytes)


def _span(meta: Meta, design: HeldDesign) -> int:
    """The columns a held row's segments cover: in the Triton kernels a framed row's frame starts up to
    a run less one before its first element; the Gluon kernels take no frame."""
    if design.family in GLUON_FAMILIES:
        return meta.n_cols
    return meta.n_cols + max(_frame(meta) - 1, 0)


def _held_design(meta: Meta, tuning: Tuning) -> HeldDesign | None:
    """The Triton held design of a direction, by the call's widest element (a 16-bit x with
    a float32 y takes the float32 one); None for float64."""
    forward = meta.direction == FORWARD
    if meta.widest == 2:
        if forward and _frame(meta):
            return tuning.forward_16bit_framed
        if forward:
            return tuning.forward_16bit
        sparse = _held_sparse(meta, next_power_of_2(meta.n_cols), tuning)
        return tuning.backward_16bit_sparse if sparse else tuning.backward_16bit
    if meta.widest == 4:
        return tuning.forward_float32 if forward else tuning.backward_float32
    return None


def _fit(design: HeldDesign, meta: Meta, tuning: Tuning) -> tuple[int, int] | None:
    """(n_segments, rows_at_once) of `design` for the call; None where held rows are off on
    this kind of device or a row has more segments than the grid holds."""
    if meta.facts.cuda:
        if not tuning.held_rows:
            return None
        segment, programs = design.setup.segment, design.setup.programs(meta.facts)
    else:
        if not tuning.cpu_held_rows:
            return None
        segment, programs = tuning.cpu_segment, tuning.cpu_programs
    return fit_rows(meta.n_rows, cdiv(_span(meta, design), segment), programs)


def _staged_design(meta: Meta, tuning: Tuning) -> HeldDesign | None:
    """The Gluon forward where it applies: an eager launch (torch.compile traces Triton kernels
    only) of 16-bit x on Hopper or newer with a Triton that has Gluon, rows along the last dim of
    a multiple of 16 columns (Triton specializes on 16 elements), every row start 16-byte aligned
    (cp.async copies at least 4 bytes, and 16 to be fast).  Rows of more than
    ahead_past_segments segments, x and y of one dtype, take the kernel that publishes a round
    ahead."""
    if meta.direction != FORWARD or not meta.gluon or not (meta.facts.cuda and meta.eager):
        return None
    if meta.input_bytes != 2 or meta.inner != 1 or meta.n_cols % 16 or not meta.facts.hopper or not meta.aligned:
        return None
    longest = cdiv(meta.n_cols, tuning.staged.setup.segment) > tuning.ahead_past_segments
    if longest and meta.output_bytes == meta.input_bytes:
        return tuning.staged_ahead
    return tuning.staged


def _next_load(n_segments: int, tuning: Tuning) -> str:
    """PUBLISH_THEN_WAIT's LOAD_NEXT: when the next round's segment is loaded (see Tuning)."""
    return "before_partial" if n_segments <= tuning.load_before_partial_segments else "during_wait"
