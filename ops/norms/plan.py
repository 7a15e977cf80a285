"""The norms' plan: which design runs a call, on which blocks and grid, as a pure function of what the call is.

For each row of N elements (the normalized dims flattened into one), layer norm:

    mean = sum(x) / N,   var = sum((x - mean)^2) / N,   rstd = 1 / sqrt(var + eps)
    xhat = (x - mean) * rstd,                            y = xhat * w + b
    g = dy * w,   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
    dw = sum over rows of dy * xhat,                     db = sum over rows of dy

RMS norm is the same computation without the centering: mean = 0 (var is
then the mean square), no bias, no mean(g) term.  So the kernels take a
CENTERED flag, both ops run through the same plan and launches, and each
op's own kernels are thin wrappers that fix the flag (kernels.py).
Statistics are computed in float32 (float64 for float64 inputs) whatever
the storage dtype.

Forward, three designs, by row length and alignment:

* SHORT_ROWS (next_power_of_2(N) <= Tuning.max_block): a program normalizes
  a tile of BLOCK_M whole rows, loaded once and reduced in registers: one
  read and one write per element, the minimum.  Rows much shorter than a
  block are stacked BLOCK_M to a tile so that each program still moves about
  Tuning.tile elements (one 128-column row per program would leave most
  lanes idle).  A tile reads rows that start off 16-byte boundaries an
  element an access: such rows take FRAMED_ROWS where Tuning.framed_tiles
  names them, else, in blocks past Tuning.framed_max_block, the long rows'
  framed sweeps.
* FRAMED_ROWS: a tile of rows that start equally far past a 16-byte
  boundary (one skew), each read once from the boundary before it, 16
  bytes an access (ops/blocks/alignment.py); w and b, read at the rows'
  columns an element an access, once for the tile's rows.
* LONG_ROWS: one program per row, two sweeps over BLOCK_N-column chunks.
  The first gathers the statistics, the second writes y (its reads mostly
  hit L2, which has just seen the row).  Mean and variance come out of the
  first sweep as sums about a pivot p, the first chunk's mean: each lane
  sums d = x - p and d^2 over the sweep, the program reduces its lanes
  once at the end, and with mean d = sum d / n

      mean = p + mean d,   M2 = sum d^2 - mean d * sum d

  which, unlike sum(x^2) - n mean^2, does not cancel when |mean| >> std,
  and is exactly 0 on a constant row.  It cancels where p is far from the
  row's mean next to its spread (a first chunk unlike the rest): where M2
  comes out below 1/16 of sum d^2, or NaN (the sums overflowed), the row
  is swept once more about the mean found (kernels.py, _pivoted_moments).

Backward, three designs, by row length:

* SHORT_ROWS: a fixed number of programs (one an SM, see backward_tile for
  the exceptions), each looping over row tiles, the next tile's loads in
  flight during this one's math.  A program loads a tile of x and dy once,
  recomputes each row's mean (layer norm rows whose inputs are all 16-bit by
  the plain mean, the others corrected, see Tuning.plain_max_cols), then
  takes the sums of d^2, g d and g (d = x - mean) as one reduction (two of
  layer norm's exception tiles keep them apart: TileException.one_reduction),
  writes dx, and adds dy * xhat (and dy) to dw/db accumulators held in
  registers for its whole run.  At the end it writes them as its own row of a (n_programs, N)
  scratch; a second kernel sums the scratch's columns (dw's and db's in one
  launch).  No atomics: each scratch row has one writer, the result is the
  same bits on every run, and the column sum reads a few hundred partial
  rows, little next to x.
* HELD_ROWS (CUDA, rows a setup of Tuning.held_setups takes): the rows held
  on chip across programs (the protocol: ops/blocks/held_rows.py), a
  segment of each a program, so x and dy are read once; each program's dw/db
  accumulator over its rows is one row of the scratch.  Rows off 16-byte
  boundaries are held framed (16 bytes an access), and those of
  Tuning.held_short_rows are held though they fit a tile.
* LONG_ROWS: neither a row nor its dw accumulator fits in registers.  A
  first kernel sweeps each row once for mean, rstd, mean(g) and
  mean(g * xhat) (sums about the pivot as above, the last through
  sum(d g) - mean d * sum g); a second runs over a (row group, column chunk)
  grid, writes dx for its chunk of each row of its group and accumulates
  that chunk of dw/db in registers into the scratch; then the same column
  sum.  x and dy are read twice, the price of rows longer than a block.
  Rows off 16-byte boundaries are swept in their frames (``frame``), w read
  from copies shifted by each skew, and every row of a group has one skew;
  layer norm's such rows past its framed setups' 64 segments come here
  rather than held (measured faster: Tuning.layer_norm_held).

Saved statistics or recomputed ones: recomputed.  The backward reads every
row of x and dy anyway, and mean and rstd come out of the very pass that
computes the row sums the gradient needs (in registers for short rows, in
the statistics sweep for long ones), so recomputing costs a few flops per
element in a memory-bound kernel and no extra memory traffic.  Saving them
would make the forward write, and the backward read, two more tensors, and
the op return three outputs (or be split into a second registered op) for
no measurable gain.  The autograd therefore keeps x and weight only.

A call is described by a ``Meta`` (``describe_forward``, ``describe_backward``:
the only place that asks the device or the call context), and
``choose_forward_plan`` / ``choose_backward_plan`` turn it into a frozen plan
using nothing but the constants of a ``Tuning``; launch.py runs a plan.  A
test plans for an H100 on any machine by building a Meta with
``facts=H100``, and reaches every design with small tensors by passing a
smaller Tuning (``TUNING.with_cpu(...)``).
"""

import math
from dataclasses import dataclass, fields, replace
from typing import Optional

import torch

from ..blocks.alignment import column_multiple, frame_run
from ..blocks.held_rows import HeldSetup, fit_rows, may_overlap_fill, words_block
from ..blocks.sizes import at_most, cdiv, next_power_of_2, rows_in_tile, warps_for
from ..runtime import INTERPRETER, ByKind, DeviceFacts, device_facts

# The designs (see the module docstring).
NO_ROWS = "no_rows"  # nothing to normalize: outputs only
SHORT_ROWS = "short_rows"
FRAMED_ROWS = "framed_rows"  # forward: short rows off 16-byte boundaries, a tile of rows of one skew
LONG_ROWS = "long_rows"
HELD_ROWS = "held_rows"

# How layer norm's forward tiles find their rows' means (ForwardPlan.mean; RMS norm takes none).
CORRECTED_MEAN = "corrected"  # sum(x) / n, then the sum of x - mean taken out (kernels.py, _center): float32, float64
PIVOT_MEAN = "pivot"  # each row shifted by its first value first (_standardize_pivoted): 16-bit x
PLAIN_MEAN = "plain"  # sum(x) / n rounded once (_standardize_plain): 16-bit rows of at most plain_max_cols columns


@dataclass(frozen=True)
class HeldNormSetup(HeldSetup):
    """A setup of a norm's held backward: HeldSetup's fields, and the rows its kernel loads ahead
    (ROWS_AHEAD): 1, the next row's segment; 2, also the one after, in flight while the program
    polls and writes (a third segment's registers)."""

    rows_ahead: int = 1

    def __post_init__(self):
        if self.rows_ahead not in (1, 2):
            raise ValueError(
                f"HeldNormSetup: rows_ahead is 1 or 2 (rows the kernels load ahead), got {self.rows_ahead}"
            )


@dataclass(frozen=True)
class HeldSetups:
    """One op's setups for backward rows held on chip, by the widest input's element size; a row
    takes the first that takes it (HeldSetup.takes).  None for float64: it keeps two sweeps.
    Rows held framed (held.py) take the framed setups where there are any: their kernels hold
    more registers."""

    for_16_bit: tuple[HeldNormSetup, ...] = ()
    for_32_bit: tuple[HeldNormSetup, ...] = ()
    framed_16_bit: tuple[HeldNormSetup, ...] = ()
    framed_32_bit: tuple[HeldNormSetup, ...] = ()

    def of(self, element_size: int, framed: bool = False) -> tuple[HeldNormSetup, ...]:
        plain = {2: self.for_16_bit, 4: self.for_32_bit}.get(element_size, ())
        framed_setups = {2: self.framed_16_bit, 4: self.framed_32_bit}.get(element_size, ()) if framed else ()
        return framed_setups or plain


@dataclass(frozen=True)
class TileException:
    """A short-row backward tile the byte rule does not give: at least `min_rows` rows of a
    `block_n`-lane block whose widest input has `element_size`-byte elements take tiles of `tile`
    elements, `programs_per_sm` programs an SM; layer norm's only (`centered` True), RMS norm's only
    (False) or both (None); `one_reduction` False keeps its rows' sums apart (BackwardPlan.one_reduction).
    The first exception that matches a call is taken."""

    element_size: int
    block_n: int
    tile: int
    programs_per_sm: int
    min_rows: int = 0
    centered: bool | None = None
    one_reduction: bool = True  # BackwardPlan.one_reduction of the tiles it gives

    def takes(self, centered: bool, element_size: int, block_n: int, n_rows: int) -> bool:
        """Whether a backward of `n_rows` rows in `block_n`-lane blocks takes this tile."""
        op = self.centered is None or self.centered == centered
        return op and (self.element_size, self.block_n) == (element_size, block_n) and n_rows >= self.min_rows


@dataclass(frozen=True)
class OddRows:
    """Rows off 16-byte boundaries that fit a block, named by a rule of Tuning (held_short_rows,
    framed_tiles): those of layer norm (`centered`) or RMS norm whose widest input has `element_size`-byte
    elements, in blocks of one of `blocks` columns, at least `min_rows` of them."""

    centered: bool
    element_size: int
    blocks: tuple[int, ...]
    min_rows: int = 0


@dataclass(frozen=True)
class Tuning:
    """Every constant of the norms' plans, each with why it is what it is.  Measurements are H100
    numbers from docs/perf-notes.md (the version is named at each); "% of a copy" is bandwidth
    against a copy of the same bytes."""

    # Longest row normalized in one block, and how many warps share it.  A
    # thread has at most 64K / threads registers (128 with 16 warps, 64 with
    # 32).  The forward keeps x, w, b and y live: a 16384-column row on 32
    # warps takes about 55 registers (ptxas, sm_90), on 16 warps it spills.  A
    # 32768-column row on 32 warps (32 elements a thread) ran at 97% of copy
    # bandwidth on an H100 (rms_norm bf16 4096x32768; 94% layer_norm), where
    # the two-sweep long-row kernel got 64%; at 65536 it spills (48%).  The
    # backward keeps x, dy, w, xhat, g and two accumulators live: see
    # backward_tile_bytes for its tiles.  float64 values take two registers: half
    # the blocks and tiles on the GPU (float64 on CUDA is for tests, not speed).
    max_block: ByKind[int] = ByKind(cuda=32768, cpu=1 << 16)
    # Rows off 16-byte boundaries in blocks longer than framed_max_block (by x's element size) take the
    # long rows' two sweeps, which are framed (whole runs 16 bytes an access), where a tile of whole rows
    # is not.  H200, time of two sweeps over the tile's at 2000x20001: layer norm bf16 0.37x, float32
    # 0.52x; RMS norm 0.49x, 0.83x (docs/perf-notes.md, version 54).  Version 55 (H200, CUDA-graph
    # times), two sweeps over the tile at blocks of 1024 / 2048 / 4096 / 8192 columns (4096x1001,
    # 8192x1537; 4096x2049, 4096x3001, 4095x4095; 4096x5001, 2048x7001, 4096x8191): layer norm bf16 2.79 /
    # 1.96 / 0.96-1.01 / 0.78-0.85, RMS norm bf16 1.94 / 1.39 / 0.80-0.82 / 0.65-0.72; layer norm float32
    # 3.04 / 1.72 / 0.96 / 0.76-0.81, RMS norm float32 2.22 / 1.31 / 1.02-1.09 / 0.88-0.97.  float64
    # (tests only, not measured) keeps version 54's limit, 8192 elements halved for two registers a value.
    framed_max_block: ByKind[tuple[tuple[int, int], ...]] = ByKind(cuda=((2, 2048), (4, 4096), (8, 4096)), cpu=())
    # Forward rows off 16-byte boundaries of framed_tiles take a framed tile (FRAMED_ROWS): rows of one skew
    # read once, 16 bytes an access, about framed_tile elements a program, framed_per_thread a thread.  w and
    # b are read at the rows' columns an element an access, once a tile.  H200, CUDA-graph times, the framed
    # tile over the plan without it (blocks of 1024 / 2048 / 4096 / 8192: the tile, the tile, two sweeps,
    # two sweeps; docs/perf-notes.md, version 56), tiles of 4096 elements at 32 a thread: bf16 layer norm at
    # 4096x1001 / 8192x1537 / 4096x2049 / 4096x3001 / 4095x4095 / 4096x5001 / 2048x7001 1.07 / 1.01 / 1.21 /
    # 1.17 / 1.20 / 0.71 / 0.70, RMS norm 1.24 / 1.40 / 1.22 / 1.30 / 1.26 / 1.13 / 1.13; float32 layer norm
    # 4096x1001 / 4095x4095 / 4096x5001 0.97 / 1.17 / 0.64, RMS norm 0.88 / 1.00 / 1.00; rows of 101 float32
    # columns (16384 rows) 1.34 and 1.11; bf16 16384x100 0.67 (both ops), 32768x257 0.91 and 1.22 (RMS norm's
    # 512-column blocks not named on one shape); blocks of 16384 0.58-0.65.  At 16 a thread the tile lost 3-12% more at 4096 columns (16 warps), and tiles of
    # 2048 and 8192 elements were no better.  float64 (tests only) keeps the tile and the sweeps.
    framed_tiles: tuple[OddRows, ...] = (
        OddRows(True, 2, (1024, 2048, 4096)),
        OddRows(False, 2, (1024, 2048, 4096, 8192)),
        OddRows(True, 4, (128, 4096)),
        OddRows(False, 4, (128,)),
    )
    framed_tile: ByKind[int] = ByKind(cuda=4096, cpu=1 << 14)
    framed_per_thread: int = 32
    # Blocks at which layer norm's pivoted tiles (16-bit x) ran slower than the two sweeps: one program an SM
    # at 16384 columns (42 registers on 32 warps), one row in flight.  H200, two sweeps over the tile:
    # 8192x12288 0.64x, 4096x10240 0.66x, 4096x16384 0.83x, 2048x16384 0.86x; at 32768 columns 1.25x (kept);
    # RMS norm and float32 were mixed (0.80-1.40x) and keep their tiles (version 54).
    pivoted_two_sweep_blocks: tuple[int, ...] = (16384,)
    max_block_backward: ByKind[int] = ByKind(cuda=8192, cpu=1 << 16)
    # Backward rows off 16-byte boundaries that fit a block, held framed where a setup takes them (see
    # the held setups), not tiled.  H200, CUDA-graph times, held over the tile at blocks of 1024 / 2048 /
    # 4096 / 8192 columns (the shapes of framed_max_block's; version 55): layer norm bf16 0.49 / 1.07 /
    # 0.46-0.59 / 0.46-0.69, RMS norm bf16 0.55 / 1.23 / 0.45-0.59 / 0.42-0.58; layer norm float32 1.22 /
    # 1.38 / 0.87-1.33 / 0.73-1.02, RMS norm float32 1.08 / 1.16 / 0.76-1.00 / 0.56-0.66.  The 16-bit tiles
    # of 2048 columns run two or four an SM (backward_exceptions) and keep them; blocks under 1024 columns were not
    # measured and keep theirs.  Fewer rows: held over the tile at 64x3001 / 256x5001 / 512x2049 / 100x8191
    # 0.21-0.60 in every op and dtype (few rows leave the tile's design few programs: min_rows_per_program),
    # but at 1000x1001 layer norm 1.33 and RMS norm 1.77 (bf16; float32 1.27, 1.27): 1024-column blocks are
    # held from 2048 rows, between the 1000 that lost and the 4096 that won (not measured between).
    held_short_rows: tuple[OddRows, ...] = (
        OddRows(True, 2, (4096, 8192)),
        OddRows(False, 2, (4096, 8192)),
        OddRows(True, 2, (1024,), min_rows=2048),
        OddRows(False, 2, (1024,), min_rows=2048),
        OddRows(True, 4, (8192,)),
        OddRows(False, 4, (4096, 8192)),
    )

    # Short rows are stacked up to about `tile` elements a program (float32; half that for 16-bit
    # rows on the GPU), `forward_per_thread` a thread.  H100, forward, % of a copy, tiles of 4096
    # elements (before) against 2048 and 1024 (docs/perf-notes.md, version 29): bf16 layer_norm at
    # 262144x128 / 65536x256 / 16384x768 / 32768x1000 / 16384x1536: 96 / 93 / 86 / 95 / 96, 94 / 94
    # / 99 / 98 / 98, 97 / 98 / 99 / 97 / 98; float32 at 65536x256 / 16384x768 / 16384x1536: 96 / 99
    # / 99, 97 / 99 / 97, 98 / 96 / 97.
    tile: ByKind[int] = ByKind(cuda=2048, cpu=1 << 14)
    forward_per_thread: int = 16
    # 16-bit short rows at hidden sizes instead, in blocks of `hidden_blocks` columns (layer norm, hidden sizes
    # of 513-4096) or `rms_hidden_blocks` (RMS norm, 513-1024), where hidden_rows rows a program leave at least
    # hidden_programs_per_sm programs an SM: hidden_rows rows a program, hidden_per_thread elements a thread
    # (one warp for two rows of 1024).  A program's rows are latency-bound there, and more bytes in flight a
    # thread beat more threads.  H200, bf16, CUDA-graph times of probes on inputs left in L2 (version 58),
    # layer norm (plain mean), rows a program x warps: 4095x768 2x1 3.93 us, 1x1 4.37, 2x2 4.39 (compile
    # 4.65); 8191x1024 2x1 6.75, 1x1 6.97, 2x2 7.40 (compile 7.77); 4095x1280 2x2 6.20, 1x2 6.60, 2x4 6.64;
    # 8191x4096 2x4 34.3, 1x2 34.9.  With fewer rows (1000x768, 512x2048) one row a program on fewer warps was
    # level or lost 9%: those keep the tile rule.  RMS norm against the tile rule: 1.02-1.20x at 4095x768,
    # 8191x768 and 4095x1024 (two calls), 0.99-1.03x at 8191x1024 and 16384x768; at 2048-4096 columns within
    # 3% either way, 0.97x at 8191x4096, so its wider blocks keep the tile rule.
    hidden_blocks: tuple[int, ...] = (1024, 2048, 4096)
    rms_hidden_blocks: tuple[int, ...] = (1024,)
    hidden_rows: int = 2
    hidden_programs_per_sm: int = 8
    hidden_per_thread: int = 64

    # The forward loads w and b beside x (AFFINE_FIRST) for blocks of at most this many columns.
    # H100, % of a copy, w and b after the reductions -> beside x, kept in L2: layer_norm
    # float32 65536x256 / 16384x2048 / 16384x4096 98.0 / 97.2 / 97.5 -> 99.1 / 98.8 / 99.6, bf16
    # 65536x256 / 32768x1000 / 16384x4096 92.6 / 94.1 / 99.1 -> 98.3 / 97.4 / 100.8; rms_norm
    # fp16 16384x4096 99.7 -> 100.5.  Rows of 8192 columns and more (16-32 warps, 16 a thread)
    # lost 10-30 points: w and b held through the reductions take a program an SM away, or spill.
    # (docs/perf-notes.md, version 34.)  The pivoted forward has its own rule (version 53, H200, bf16 layer
    # norm shifted by each row's pivot; RMS norm and float32 were not measured there and keep 4096): its blocks
    # of 4096 columns took 9-16% longer with w and b beside x, 4095x2560 / 8191x4096 / 16384x4096 / 4095x3072
    # at 16.0 / 41.6 / 80.7 / 19.2 us against 14.7 / 36.8 / 69.3 / 16.9 after the reductions (Liger-Kernel
    # 14.4 / 37.4 / 71.9 / 17.1); blocks of 1024 and 2048 were level either way.
    affine_first_max_block: int = 4096
    pivoted_affine_first_max_block: int = 2048  # the rule for pivoted plans (layer norm of 16-bit x)
    # Layer norm's forward shifts 16-bit rows by their pivots (kernels.py, _standardize_pivoted): x - pivot is exact
    # in float32 for such x, and the correction it replaces cost 15-30% at hidden sizes (version 53).  Wider
    # elements keep _center, whose accuracy the pivot would lose where it is an outlier.
    pivot_element_sizes: tuple[int, ...] = (2,)
    # Those rows, in short-row tiles of at most plain_max_cols columns, take the plain two-pass mean instead
    # (kernels.py, _standardize_plain): exact on a constant row there (2**13 16-bit values sum exactly in
    # float32), and no pivot to load and subtract; the framed tiles stay pivoted.  H200, CUDA-graph times
    # against torch.compile, bf16, with the hidden-size tiles above, a probe on inputs left in L2 (version 58;
    # the harness, inputs rotated past L2, has 4095x768 at 0.98x compile, 0.86x before): pivoted 0.97 / 0.90 /
    # 0.91 / 1.04 / 0.93x at 4095x768 / 8191x768 / 1000x768 / 4095x1024 / 8191x1024, plain 1.18 / 1.20 / 0.95
    # / 1.24 / 1.15x.  Their w and b follow the pivoted rows' rule (pivoted_affine_first_max_block) but on the
    # hidden tile, where they load beside x: there 1.03-1.05x faster than late at 4095x2560 / 8191x3072 /
    # 8191x4096 / 16384x4096, while one row of 4096 a program (2000x4096) ran 1.09x faster with them late.
    # The short-row backward's tiles of these rows take the plain mean too where they sum their rows as one
    # reduction (BackwardPlan.one_reduction); they took _center's correction, whose sum was one more reduction on
    # each row's critical path (the backward has no pivot: loaded ahead with the next tile it took the bf16 tile
    # from 124 to 163 registers, version 45).  H200, the harness's CUDA-graph times in one call, one reduction
    # either way (version 63): plain 1.10-1.23x faster than corrected at 4095x768, 1000x1280, 8191x1600,
    # 4095x2560, 8191x4096 and 4095x5120 (12.6 against 14.1 us at 4095x768, 57.2 against 68.7 at 4095x5120).
    plain_max_cols: int = 8192

    # Long rows, both directions: columns a step, and the backward's elements a thread in
    # them (x, dy and w of a chunk live at once; as landed, no measurement recorded).
    chunk: ByKind[int] = ByKind(cuda=4096, cpu=1 << 14)
    long_row_backward_per_thread: int = 8
    # The long rows' statistics sweeps keep per-lane sums (kernels.py, _pivoted_sums), no reduction across
    # warps a chunk, so fewer warps with more bytes in flight each win there.  H200, profiler device
    # times, version 59 (stats sweep, us; chunk / elements a thread -> warps): bf16 layer norm 4096x50257
    # 2048/8 (8 warps) 218, 4096/16 (8) 247, 4096/8 (16) 346; 2048x100003 213 / 232 / 317; float32
    # 4096x50257 437 / 422 / 542; RMS norm bf16 2048x100003 217 / 234 / 213.  The columns pass keeps
    # chunks of 4096 on 16 warps (2048 columns: 431 against 401 us at bf16 4096x50257).  So the backward's
    # statistics sweep takes chunks of at most statistics_chunk (the columns pass's `chunk` where that is
    # smaller: the tests' small tunings), statistics_per_thread elements a thread.  The forward's long
    # rows, one kernel for both sweeps, took 16 warps on chunks of 4096 best: bf16 layer norm 4096x50257
    # 383 us against 437 on 8 warps (16 a thread) and 382 on 8192 columns; 4096x50264 324 / 352 / 391;
    # float32 4096x50257 652 / 665 / 662; RMS norm 4096x50257 312 / 340 / 388, 4096x50264 303 / 313 / 300.
    statistics_chunk: ByKind[int] = ByKind(cuda=2048, cpu=1 << 14)
    statistics_per_thread: int = 8
    long_row_forward_per_thread: int = 8
    # The long-row backward's (row group, chunk) programs on the GPU: about this many an SM,
    # spread over the chunks (the interpreter's: cpu_programs).
    programs_per_sm: int = 2

    # The short-row backward, one program an SM (but for backward_exceptions, below), each loading its
    # next tile during this tile's math where a tile of the widest input is at most load_ahead_bytes (the
    # program then holds two tiles: 81-128 registers a thread, so a second program an SM of a 16 KB tile
    # would only queue behind the first; the exceptions' smaller tiles leave room for two or four).  A tile
    # is about 16 KB of the widest input, 32 bytes of it a thread: float32 4096 elements on 16 warps, 16-bit
    # 8192 on 16 warps.
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
    # An input of fewer tiles than programs (a small one) leaves SMs idle and each program's one
    # tile unhidden: its tiles are halved, down to min_backward_tile_bytes.  Version 31, bf16
    # 1024x1024, CUDA-graph time: rms 12.4 -> 8.2 µs (eager 9.4), layer norm 19.5 -> 12.8.
    # (docs/perf-notes.md, versions 27, 28 and 31.)
    short_row_programs_per_sm: int = 1
    load_ahead_bytes: int = 16384
    backward_tile_bytes: int = 16384
    min_backward_tile_bytes: int = 8192
    backward_thread_bytes: int = 32
    # 16-bit rows of a 2048-column block are the exception: 4 rows a tile on 16 warps ran at
    # 50-63%, 2 rows on 8 warps at 63-78 one an SM (versions 27 and 28), and **two an SM** at 86-93
    # (version 31: bf16 16384x2048 rms 81 -> 92, layer norm 75 -> 86).  So are those of a 4096-column block:
    # one row a tile on 8 warps, two an SM, against the rule's two rows on 16 warps, one an SM.  H200, bf16,
    # harness medians (version 61; before: the real-shape page of version 59): layer norm 4095x2560 /
    # 8191x3072 / 8191x4096 48.2 / 84.4 / 86.1 -> 41.3 / 70.3 / 73.1 µs, RMS norm 32.8 / 57.0 / 63.6 -> 30.2 /
    # 54.5 / 61.7.  With few rows it lost: 1000x3584 16.3 -> 18.0 µs (layer norm; RMS norm 11.6 -> 12.7, CUDA
    # graphs), so it starts at 2048 rows, between the 1000 that lost and the 4095 that won (not measured
    # between).  Blocks of 8192 kept the rule: the same change lost 3-8% at 4095x5120, 1000x5120 and
    # 4095x6144 in both ops (a probe).  16-bit rows of a 1024-column block (GPT-2's 768, and every hidden size from 513
    # to 1024) take two rows a tile on 4 warps, four an SM, against the rule's eight rows on 16 warps, one an SM:
    # CUDA-graph times, H200, bf16 (version 62), layer norm 4095x768 / 8191x768 / 16383x768 / 1000x768 / 4095x1024 22.9
    # / 32.8 / 54.6 / 9.0 / 23.0 -> 12.9 / 20.8 / 36.4 / 8.2 / 13.1 µs (PyTorch's native backward 22.0 / 43.5 / 97.4 /
    # 8.6 / 23.3), RMS norm 13.0 / 18.2 / 31.7 / 6.3 / 13.4 -> 8.8 / 13.3 / 26.4 / 5.8 / 9.1.  Two an SM on the same
    # tile, four on one row, one on four rows: each slower than this at every shape but 1000 and 2047 rows, where two an
    # SM tied.  Float32 rows of a 1024-column block the same way: one row a tile on 4 warps, four an SM, against the
    # rule's four rows on 16 warps, from 2048 rows: layer norm 4095x768 / 8191x1024 / 3000x1024 20.4 / 41.0 / 17.3 ->
    # 15.4 / 32.2 / 14.7 µs (PyTorch 23.5 / 61.7 / 20.4), RMS norm 12.1 / 30.4 / 10.8 -> 10.1 / 29.9 / 9.7; level at
    # 2047x896; with fewer rows it lost (1000x768 / 1500x768 layer norm 9.1 / 11.0 -> 11.3 / 12.9, RMS norm 6.3 / 7.3 ->
    # 7.2 / 8.1), where the 16-bit tile still won (512x768 to 1500x1024).  Two rows, four or two an SM, lost to one in
    # layer norm and at 4095x768, and tied at RMS norm's 8191x1024 (29.4 against 29.9 µs, two an SM; version 62b).  At
    # blocks of 4096 and 8192 the 16-bit tiles here and the rule stayed ahead of one row four an SM; at 2048 so did RMS
    # norm's (by 1-2%), but layer norm's many rows gained: 8191x1600 / 4095x2048 39.7 / 24.4 -> 33.4 / 21.9 µs (PyTorch
    # 65.8 / 35.9), where 1000x1280 lost 10.1 -> 12.6 (version 62b).  So layer norm's 16-bit rows of a 2048-column block
    # take one row four an SM from 2048 rows.  Layer norm's tiles of one row four an SM at 2048 columns and two an
    # SM at 4096 keep their rows' sums apart (one_reduction False): with one reduction (version 63) they ran slower,
    # the harness's CUDA-graph times in one call against the code before, 8191x1600 / 16383x1600 / 4095x2048 /
    # 8191x3072 / 8191x4096 at 33.8 / 59.5 / 22.3 / 66.4 / 68.0 -> 40.2 / 69.0 / 25.6 / 68.3 / 76.3 us (the lower
    # of two rounds), where every other tile gained (4095x768 / 1000x1280 / 4095x5120 14.8 / 11.5 / 74.1 -> 12.5 /
    # 9.3 / 56.9): on Triton 3.6 one reduction takes those tiles to 148-159 registers, past the 128 their programs
    # an SM leave.
    backward_exceptions: tuple[TileException, ...] = (
        TileException(2, 1024, tile=2048, programs_per_sm=4),
        TileException(4, 1024, tile=1024, programs_per_sm=4, min_rows=2048),
        TileException(2, 2048, tile=2048, programs_per_sm=4, min_rows=2048, centered=True, one_reduction=False),
        TileException(2, 2048, tile=4096, programs_per_sm=2),
        TileException(2, 4096, tile=4096, programs_per_sm=2, min_rows=2048, centered=True, one_reduction=False),
        TileException(2, 4096, tile=4096, programs_per_sm=2, min_rows=2048, centered=False),
    )

    # Backward rows past max_block_backward held on chip across programs, by the first setup of
    # the op's that takes a row (keyed by the widest input's element size); float64, and rows no
    # setup takes, keep the two-sweep design.  A program holds `segment` columns of x and dy,
    # twice (this row's and the next's; three times with rows_ahead 2), and of its accumulators,
    # on `warps` warps at most `registers` registers a thread, `programs_per_sm` an SM, for rows
    # of at most `max_segments` segments (None: as many as the grid holds).  One warp a program
    # reduces and polls without a barrier: up to 128 segments a row it won everywhere.  H100, % of
    # a copy of the same bytes at 8192x12288 / 4096x32768 / 1024x65536 / 256x262144
    # (docs/perf-notes.md, versions 30, 32 and 38):
    #   rms bf16: two sweeps 59 / 59 / 50 / 48; 2048 / 4 / 96 / 5: 79 / 79 / 73 / 64;
    #     512 / 1 / 96 / 20: 90 / 89 / 82 / 18 (a row of 512 segments waits on 512 programs).
    #   rms float32: 59 / 59 / 56 / 55; 1024 / 2 / 128 / 8: 87 / 86 / 82 / 71; 512 / 1 / 128 / 16:
    #     91 / 94 / 93 / 61.
    #   layer norm (two words a segment, two accumulators): two sweeps bf16 51 / 51 / 43 / 39,
    #     float32 59 / 59 / 52 / 49; 512 / 1 / 128 / 16: bf16 69 / 69 / 60 / 10, float32 88 / 83 /
    #     75 / 20; the setups of 2-8 warps 35-54 in bf16 (spills).  Version 38: both words of a
    #     segment in one poll, bf16 73 / 72 / 55; then bf16 with a third row's segment in flight
    #     (rows_ahead 2) at 160 registers, 12 an SM, 77 / 74 / 55 (at 144 planned as 14 an SM, 46-66:
    #     12 run, see DeviceFacts.resident_programs_per_sm); float32 at 160 registers (no spill), 12
    #     an SM, 92 / 87 / 78.  RMS norm with rows_ahead 2 lost (bf16 needs 144 registers, float32
    #     192).  Version 39: the moments unmasked on rows of whole segments, bf16 4096x32768 74 ->
    #     77; rows past 128 segments of 512 (65537 to 131072 columns) on 1024 / 2 / 160 / 6,
    #     512x131072 bf16 328 -> 280 us, float32 527 -> 401 us against two sweeps (at 4096x32768
    #     and 1024x65536 it lost to 512 / 1).  At 2000x20001, rows of no 16-element multiple (loads
    #     of one element), float32 fell from 54 to 39 (bf16 33 both), so layer norm held only rows of
    #     a 16-element multiple until version 54; rows off 16-byte boundaries are now held framed
    #     (held.py; _frame), the others read 16 bytes an access with COL_MULTIPLE, and both ops hold
    #     rows of any length.
    # Framed rows (version 54; held.py): the kernels hold a segment's edge too.  RMS norm's spilled at 96
    # registers (92 bytes a thread, ptxas sm_90) and 128 (float32), not at 112 (16 an SM, as at 128) and 160;
    # 4096x50257 bf16 on an H200, at 96 registers 1024 us, at 128 625 us (eager layer norm's backward 1051).
    # Its wider setups (rows past 65536 columns) spill at 96 (16-bit) and 128 (float32), not at 128 and 160.  Layer norm's spills at
    # 160 (140 bytes, rows_ahead 1) and stops at 200, but 10 an SM then hold 8 rows of 99 segments at once, not
    # 16 (a multiple of the run, see _held_rows): 1672 us against 1091 at 160 with rows_ahead 1 and 1216 with 2.
    # Version 54 also: 168 registers a thread run as many programs an SM as 160 (12: 5376 a warp) and spill
    # less (ptxas: bf16 at 64 segments 16 -> 0 bytes, at 99 60 -> 20, framed 140 -> 108).  H200, through the
    # op's launch path, 168 over 160: bf16 4096x32768 / 4096x50264 / 4096x50257 / 8192x12288 / 1024x65536 /
    # 2000x20001 0.98 / 0.94 / 0.98 / 1.00 / 0.96 / 0.95, float32 0.89 / 0.92 / 0.98 / 0.94 / 0.91 / 0.91.
    # Version 57: layer norm's framed rows are held up to 64 segments; longer ones take the two sweeps, framed
    # since that version.  H200, held over framed sweeps' time (CUDA graphs, one process), bf16 8192x12289 (25
    # segments) 0.88, 2000x20001 (40) 1.01, 4096x32769 (65) 1.16, 4096x50257 (99) 1.17; float32 2000x20001 0.95,
    # 4096x32769 1.10, 4096x50257 1.14.  (Aligned rows differ: 4096x50264 held 0.91 of the sweeps' time.)
    layer_norm_held: HeldSetups = HeldSetups(
        for_16_bit=(
            HeldNormSetup(512, 1, 168, 12, max_segments=128, rows_ahead=2),
            HeldNormSetup(1024, 2, 168, 6, max_segments=128, rows_ahead=2),
        ),
        for_32_bit=(
            HeldNormSetup(512, 1, 168, 12, max_segments=128),
            HeldNormSetup(1024, 2, 168, 6, max_segments=128),
        ),
        framed_16_bit=(HeldNormSetup(512, 1, 168, 12, max_segments=64),),
        framed_32_bit=(HeldNormSetup(512, 1, 168, 12, max_segments=64),),
    )
    # One warp a program up to 128 segments a row, then wider programs (see layer_norm_held).
    rms_norm_held: HeldSetups = HeldSetups(
        for_16_bit=(HeldNormSetup(512, 1, 96, 20, max_segments=128), HeldNormSetup(2048, 4, 96, 5)),
        for_32_bit=(HeldNormSetup(512, 1, 128, 16, max_segments=128), HeldNormSetup(1024, 2, 128, 8)),
        framed_16_bit=(HeldNormSetup(512, 1, 128, 16, max_segments=128), HeldNormSetup(2048, 4, 128, 4)),
        framed_32_bit=(HeldNormSetup(512, 1, 160, 12, max_segments=128), HeldNormSetup(1024, 2, 160, 6)),
    )
    # The interpreter runs one program after another: held rows are off on CPU, except in
    # tests, which then take the path that computes the partials itself, over
    # cpu_held_segment columns, on the first setup's warps.
    held_rows: ByKind[bool] = ByKind(cuda=True, cpu=False)
    cpu_held_segment: int = 32
    max_spins: ByKind[int] = ByKind(cuda=1 << 16, cpu=0)  # polls of a row's words before computing its partials here

    cpu_programs: int = 4  # the interpreter's backward programs: few, as each costs Python time
    min_rows_per_program: int = 8  # keeps the dw/db scratch (rows of N float32) small next to x

    # (BLOCK_P, BLOCK_N) of column_sum_kernel, on column_sum_warps.  H100, µs for 132 / 264 partial
    # rows of 1024 columns: (64, 32) 2.6 / 3.4, (256, 8) 2.2 / 2.4; of 4096 columns 3.6 / 6.5
    # against 3.0 / 4.6 (docs/perf-notes.md, version 31).
    column_sum_block: ByKind[tuple[int, int]] = ByKind(cuda=(256, 8), cpu=(64, 1 << 12))
    column_sum_warps: int = 4

    def held_setups(self, centered: bool) -> HeldSetups:
        """The setups of layer norm's held backward (centered) or RMS norm's."""
        return self.layer_norm_held if centered else self.rms_norm_held

    def with_cpu(self, **values) -> "Tuning":
        """This tuning with the interpreter's value of each named per-kind field replaced, e.g.
        ``TUNING.with_cpu(max_block=64, chunk=16)``: what tests shrink to reach every design
        with small tensors (plain fields: ``dataclasses.replace``)."""
        per_kind = {f.name for f in fields(self) if isinstance(getattr(self, f.name), ByKind)}
        unknown = set(values) - per_kind
        if unknown:
            raise TypeError(f"Tuning.with_cpu: {sorted(unknown)} are not per-kind fields ({sorted(per_kind)})")
        for name, value in values.items():
            current = getattr(self, name).cpu
            if not isinstance(value, type(current)):  # e.g. framed_max_block's (element size, block) pairs
                kind = type(current).__name__
                raise TypeError(f"Tuning.with_cpu: {name} takes a {kind} like {current!r}, not {value!r}")
        return replace(self, **{name: replace(getattr(self, name), cpu=v) for name, v in values.items()})


TUNING = Tuning()


# --------------------------------------------------------------------------
# What a call is.
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Meta:
    """A norm call as its plan sees it: rows of n_cols (contiguous), element sizes in bytes,
    the device's facts, and the call context the held backward depends on."""

    centered: bool  # layer norm; False: RMS norm
    n_rows: int
    n_cols: int
    x_size: int  # bytes of an element of x (8: float64, two registers a value on the GPU)
    grad_size: int = 0  # a backward's incoming gradient (0 for a forward)
    facts: DeviceFacts = INTERPRETER
    overlap_fill: bool = False  # a held kernel may start while its scratch fill runs (may_overlap_fill)

    @property
    def widest(self) -> int:
        """The widest input's element size: it picks the backward's tiles and held setups."""
        return max(self.x_size, self.grad_size)


def _rows(x: torch.Tensor, n_cols: int) -> int:
    return x.numel() // n_cols if n_cols else 0


def describe_forward(centered: bool, x: torch.Tensor, n_cols: int) -> Meta:
    """The Meta of a forward of a contiguous x seen as rows of n_cols."""
    return Meta(centered, _rows(x, n_cols), n_cols, x.element_size(), facts=device_facts(x.device))


def describe_backward(centered: bool, grad: torch.Tensor, x: torch.Tensor, n_cols: int) -> Meta:
    """The Meta of a backward of contiguous grad and x seen as rows of n_cols; the only place that
    asks whether this call may overlap a scratch fill."""
    facts = device_facts(x.device)
    return Meta(
        centered, _rows(x, n_cols), n_cols, x.element_size(), grad.element_size(), facts, may_overlap_fill(facts)
    )


# --------------------------------------------------------------------------
# Plans.
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ForwardPlan:
    """How a forward runs: `design` on `grid`, blocks of BLOCK_M rows by BLOCK_N columns (LONG_ROWS:
    one row, BLOCK_N a chunk) on `warps` warps."""

    centered: bool
    design: str
    n_rows: int
    n_cols: int
    col_multiple: int = 1  # COL_MULTIPLE (ops/blocks/alignment.py)
    grid: tuple = ()
    block_m: int = 1
    block_n: int = 0
    warps: int = 1
    affine_first: bool = False  # SHORT_ROWS: w and b loaded beside x
    frame: int = 0  # LONG_ROWS, FRAMED_ROWS: FRAME, rows read from the 16-byte boundary before them (_frame)
    skews: int = 1  # FRAMED_ROWS: SKEWS, rows this far apart start equally far past a boundary (_skews)
    mean: str = CORRECTED_MEAN  # SHORT_ROWS, FRAMED_ROWS: how the rows' means are found (*_MEAN above)


@dataclass(frozen=True)
class HeldRowsPlan:
    """A held backward's launch: programs of `segment` columns, `n_segments` a row, `rows_at_once`
    rows a round, on the capped kernel of `setup` (its warps, register cap and rows_ahead)."""

    setup: HeldNormSetup
    segment: int
    n_segments: int
    rows_at_once: int
    words: int  # the scratch's words a row
    segments_block: int  # SEGMENTS_BLOCK: a row's words, at least one a thread (words_block)
    max_spins: int
    overlap_fill: bool  # the kernel starts while its scratch fill runs
    full: Optional[bool]  # FULL, rows of whole segments (layer norm's kernel; None: RMS norm's has none)
    frame: int = 0  # FRAME: rows held from the 16-byte boundary before them (_frame; held.py's docstring)

    def constexprs(self) -> dict:
        """The held kernel's constexprs that follow from the plan."""
        layout = {
            "SEGMENT": self.segment, "SEGMENTS_BLOCK": self.segments_block, "ROWS_AHEAD": self.setup.rows_ahead,
            "FRAME": self.frame,
        }  # fmt: skip
        return layout if self.full is None else {**layout, "FULL": self.full}


@dataclass(frozen=True)
class ColumnSumPlan:
    """column_sum_kernel over the dw/db scratch: `blocks` of BLOCK_N columns, BLOCK_P partial rows a step."""

    blocks: int
    block_p: int
    block_n: int
    warps: int


@dataclass(frozen=True)
class SweepLaunch:
    """The long-row backward's statistics sweep: a program a row, BLOCK_N columns a step on `warps` warps."""

    block_n: int
    warps: int


@dataclass(frozen=True)
class BackwardPlan:
    """How a backward runs: `design` on `grid`, its dw/db scratch of `partial_rows` rows, then the
    column sum.  SHORT_ROWS: tiles of BLOCK_M rows by BLOCK_N columns; LONG_ROWS: BLOCK_N is the
    columns pass's chunk, the statistics sweep a program a row (`statistics`); HELD_ROWS: `held`."""

    centered: bool
    design: str
    n_rows: int
    n_cols: int
    col_multiple: int = 1
    grid: tuple = ()
    partial_rows: int = 0  # the programs', row groups' or rows at once
    block_m: int = 1
    block_n: int = 0
    warps: int = 1
    load_ahead: bool = False  # SHORT_ROWS: the next tile's loads issued before this tile's math
    mean: str = CORRECTED_MEAN  # SHORT_ROWS, layer norm: how a tile finds its rows' means (PLAIN_MEAN, CORRECTED_MEAN)
    one_reduction: bool = True  # SHORT_ROWS: a row's sums after the mean as one reduction (else apart, mean corrected)
    frame: int = 0  # LONG_ROWS: rows off 16-byte boundaries read in frames of `frame`-element runs (0: not framed)
    held: Optional[HeldRowsPlan] = None
    column_sum: Optional[ColumnSumPlan] = None
    statistics: Optional[SweepLaunch] = None  # LONG_ROWS: the statistics sweep's launch (block_n, warps: the columns')


def choose_forward_plan(meta: Meta, tuning: Tuning = TUNING) -> ForwardPlan:
    """A tile of short rows a program, or a row a program in two sweeps (see the module docstring)."""
    n_rows, n_cols = meta.n_rows, meta.n_cols
    if n_rows == 0 or n_cols == 0:
        return ForwardPlan(meta.centered, NO_ROWS, n_rows, n_cols)
    col_multiple = column_multiple(n_cols)
    pivoted = _pivoted(meta, tuning)
    frame = _frame(meta)
    fits = _fits_a_block(tuning.max_block, meta)
    if frame and fits and _named_by(tuning.framed_tiles, meta):
        return _framed_rows_plan(meta, frame, pivoted, tuning)
    if fits and not _two_sweeps_first(meta, frame, pivoted, tuning):
        hidden = _hidden_tile(meta, tuning)
        block_m, block_n, per_thread = _row_tile(meta, hidden, tuning)
        # w and b beside x: on the hidden tile always; else plain rows as pivoted ones (Tuning.plain_max_cols)
        affine_first = hidden or _affine_first(block_n, pivoted, tuning)
        return ForwardPlan(
            meta.centered, SHORT_ROWS, n_rows, n_cols, col_multiple, (cdiv(n_rows, block_m),), block_m, block_n,
            warps_for(block_m * block_n, per_thread), affine_first, mean=_tile_mean(pivoted, n_cols, tuning),
        )  # fmt: skip
    chunk = tuning.chunk[meta.facts.kind]
    return ForwardPlan(
        meta.centered, LONG_ROWS, n_rows, n_cols, col_multiple, (n_rows,), 1, chunk,
        warps_for(chunk, tuning.long_row_forward_per_thread), frame=frame,
    )  # fmt: skip


def choose_backward_plan(meta: Meta, tuning: Tuning = TUNING) -> BackwardPlan:
    """Short rows in persistent tiles (those off 16-byte boundaries of Tuning.held_short_rows held
    where a setup takes them), long rows held on chip where a setup takes them, else two sweeps; then
    the column sum of the dw/db scratch (see the module docstring)."""
    n_rows, n_cols = meta.n_rows, meta.n_cols
    if n_rows == 0 or n_cols == 0:
        return BackwardPlan(meta.centered, NO_ROWS, n_rows, n_cols)
    col_multiple = column_multiple(n_cols)
    kind = meta.facts.kind
    block_p, sum_block_n = tuning.column_sum_block[kind]
    sum_block_n = min(sum_block_n, next_power_of_2(n_cols))
    column_sum = ColumnSumPlan(cdiv(n_cols, sum_block_n), block_p, sum_block_n, tuning.column_sum_warps)
    common = dict(
        centered=meta.centered, n_rows=n_rows, n_cols=n_cols, col_multiple=col_multiple, column_sum=column_sum
    )
    short = _fits_a_block(tuning.max_block_backward, meta)
    if not short:
        held = _held_rows(meta, col_multiple, tuning)
    elif _held_first(meta, tuning):  # framed, or the tile: held unframed they would move an element an access
        held = _held_rows_framed(meta, col_multiple, _frame(meta), tuning)
    else:
        held = None
    if held is not None:
        return BackwardPlan(
            design=HELD_ROWS, grid=(held.rows_at_once * held.n_segments,), partial_rows=held.rows_at_once, held=held,
            **common,
        )  # fmt: skip
    if short:
        block_m, block_n, warps, per_sm = backward_tile(meta, tuning)
        programs = _partial_rows(cdiv(n_rows, block_m), n_rows, _target_programs(meta, tuning, per_sm), tuning)
        return BackwardPlan(
            design=SHORT_ROWS, grid=(programs,), partial_rows=programs, block_m=block_m, block_n=block_n, warps=warps,
            load_ahead=block_m * block_n * meta.widest <= tuning.load_ahead_bytes, **common,
            **_backward_row_sums(meta, tuning),
        )  # fmt: skip
    chunk = tuning.chunk[kind]
    frame = _frame(meta)
    n_chunks = cdiv(n_cols + max(frame - 1, 0), chunk)  # framed, a row's places end up to a run less one past it
    # About as many programs as the short-row design, spread over the chunks.
    target = _target_programs(meta, tuning, tuning.programs_per_sm)
    n_groups = _row_groups(meta, cdiv(target, n_chunks), target, frame, tuning)
    statistics_chunk = min(chunk, tuning.statistics_chunk[kind])
    return BackwardPlan(
        design=LONG_ROWS, grid=(n_groups, n_chunks), partial_rows=n_groups, block_n=chunk, frame=frame,
        warps=warps_for(chunk, per_thread=tuning.long_row_backward_per_thread),
        statistics=SweepLaunch(statistics_chunk, warps_for(statistics_chunk, tuning.statistics_per_thread)),
        **common,
    )  # fmt: skip


def _row_groups(meta: Meta, work_items: int, target: int, frame: int, tuning: Tuning) -> int:
    """The long-row backward's row groups (_partial_rows).  Framed, group g takes rows g, g + groups, ..., which
    must share g's skew: the groups are a multiple of the skews, unless there are as many as rows."""
    groups = _partial_rows(work_items, meta.n_rows, target, tuning)
    if not frame or groups >= meta.n_rows:
        return groups
    skews = _skews(meta.n_cols, frame)
    return min(meta.n_rows, cdiv(groups, skews) * skews)


# --------------------------------------------------------------------------
# The rules the plans are made of.
# --------------------------------------------------------------------------


def _frame(meta: Meta) -> int:
    """FRAME of the long-row kernels: the elements in a 16-byte run of the narrowest input where rows
    start off 16-byte boundaries (ops/blocks/alignment.py: frame_run), else 0.  Rows of 50257
    bfloat16 (GPT-2's vocabulary) start off one in seven rows of eight, and read from their first
    element moved 2 bytes an access: the forward at 41% of copy, the backward at 27% (layer norm)
    and 30% (RMS norm) on an H100 (docs/perf-notes.md, version 52).  A result is at least as wide
    as x, so x's runs frame it too."""
    sizes = (meta.x_size, meta.grad_size) if meta.grad_size else (meta.x_size,)
    return frame_run(meta.n_cols, 1, *sizes)


def _register_limit(limits: ByKind, meta: Meta) -> int:
    """An element limit of `limits`, halved for float64 on the GPU (two registers a value)."""
    limit = limits[meta.facts.kind]
    return limit // 2 if meta.facts.cuda and meta.x_size == 8 else limit


def _skews(n_cols: int, frame: int) -> int:
    """How many rows apart two rows of n_cols start equally far past a 16-byte boundary (frame elements a
    run): the rows of one skew are those of one class modulo this."""
    return frame // math.gcd(n_cols, frame)


def _named_by(rules: tuple[OddRows, ...], meta: Meta) -> bool:
    """Whether one of `rules` names the call's rows (OddRows; the caller knows they are off boundaries)."""
    block = next_power_of_2(meta.n_cols)
    return any(
        (rule.centered, rule.element_size) == (meta.centered, meta.widest)
        and block in rule.blocks
        and meta.n_rows >= rule.min_rows
        for rule in rules
    )


def _framed_rows_plan(meta: Meta, frame: int, pivoted: bool, tuning: Tuning) -> ForwardPlan:
    """FRAMED_ROWS: tiles of rows of one skew, stacked to about framed_tile elements (w and b, read an
    element an access, are read once a tile); skews * tiles of a class programs."""
    skews = _skews(meta.n_cols, frame)
    class_rows = cdiv(meta.n_rows, skews)
    block_n = next_power_of_2(meta.n_cols)
    block_m = rows_in_tile(class_rows, block_n, _register_limit(tuning.framed_tile, meta))
    return ForwardPlan(
        meta.centered, FRAMED_ROWS, meta.n_rows, meta.n_cols, column_multiple(meta.n_cols),
        (skews * cdiv(class_rows, block_m),), block_m, block_n, warps_for(block_m * block_n, tuning.framed_per_thread),
        _affine_first(block_n, pivoted, tuning), frame, skews, PIVOT_MEAN if pivoted else CORRECTED_MEAN,
    )  # fmt: skip


def _tile_mean(pivoted: bool, n_cols: int, tuning: Tuning) -> str:
    """How a short-row tile finds its rows' means: 16-bit layer norm rows (`pivoted`) by the plain mean up to
    plain_max_cols columns, by their pivots past it; the others by the corrected mean (see Tuning)."""
    if not pivoted:
        return CORRECTED_MEAN
    return PLAIN_MEAN if n_cols <= tuning.plain_max_cols else PIVOT_MEAN


def _pivoted(meta: Meta, tuning: Tuning) -> bool:
    """Whether a call's rows are layer norm's of 16-bit x (Tuning.pivot_element_sizes): those whose tiles take the
    plain mean or the pivot (_tile_mean)."""
    return meta.centered and meta.x_size in tuning.pivot_element_sizes


def _backward_row_sums(meta: Meta, tuning: Tuning) -> dict:
    """How the short-row backward's tiles sum their rows (BackwardPlan.mean, one_reduction): the sums after the mean
    as one reduction but where the tile's exception says not (TileException.one_reduction); with one reduction and
    every input 16-bit, the mean as the forward's tiles take it where those take the plain one, else corrected (the
    backward loads no pivot, see Tuning.plain_max_cols); apart, corrected, as before version 63."""
    exception = _backward_exception(meta, tuning)
    one_reduction = exception is None or exception.one_reduction
    # A float32 dy asks for float32 gradients, which the plain mean's one rounding would hold to
    # about 1e-5 (the corrected mean: 1e-7; a second reader's measurement): such calls keep the corrected mean.
    all_16_bit = meta.widest == 2
    plain = one_reduction and all_16_bit and _tile_mean(_pivoted(meta, tuning), meta.n_cols, tuning) == PLAIN_MEAN
    return dict(mean=PLAIN_MEAN if plain else CORRECTED_MEAN, one_reduction=one_reduction)


def _affine_first(block_n: int, pivoted: bool, tuning: Tuning) -> bool:
    """AFFINE_FIRST of a forward tile: w and b loaded beside x in blocks of at most affine_first_max_block
    columns (pivoted_affine_first_max_block for pivoted rows), see Tuning."""
    return block_n <= (tuning.pivoted_affine_first_max_block if pivoted else tuning.affine_first_max_block)


def _two_sweeps_first(meta: Meta, frame: int, pivoted: bool, tuning: Tuning) -> bool:
    """Whether rows that fit a block still take the long rows' two sweeps: rows off 16-byte
    boundaries in blocks past framed_max_block (the sweeps are framed, a tile is not), and on the GPU
    layer norm's pivoted rows at pivoted_two_sweep_blocks (see Tuning)."""
    block = next_power_of_2(meta.n_cols)
    limits = tuning.framed_max_block[meta.facts.kind]
    framed_max = next((limit for size, limit in limits if size == meta.x_size), None)
    if frame and framed_max is not None and block > framed_max:
        return True
    return meta.facts.cuda and pivoted and block in tuning.pivoted_two_sweep_blocks


def _held_first(meta: Meta, tuning: Tuning) -> bool:
    """Whether backward rows that fit a block are held (framed) where a setup takes them: rows off
    16-byte boundaries of the op, element size and block of one of Tuning.held_short_rows."""
    return bool(_frame(meta)) and _named_by(tuning.held_short_rows, meta)


def _fits_a_block(limits: ByKind, meta: Meta) -> bool:
    """Whether a row is held in one block (the short-row designs)."""
    return next_power_of_2(meta.n_cols) <= _register_limit(limits, meta)


def _row_tile(meta: Meta, hidden: bool, tuning: Tuning) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, elements a thread) for short rows: a whole row across, rows stacked to about
    `tuning.tile` elements (half that for 16-bit rows on the GPU), but on the hidden tile (`hidden`:
    _hidden_tile)."""
    block_n = next_power_of_2(meta.n_cols)
    if hidden:
        return tuning.hidden_rows, block_n, tuning.hidden_per_thread
    tile = _register_limit(tuning.tile, meta)
    if meta.facts.cuda and meta.x_size == 2:
        tile //= 2  # measured, see Tuning.tile
    return rows_in_tile(meta.n_rows, block_n, tile), block_n, tuning.forward_per_thread


def _hidden_tile(meta: Meta, tuning: Tuning) -> bool:
    """Whether short rows take the hidden-size tile on the GPU: many 16-bit rows in one of the op's
    hidden blocks (Tuning.hidden_blocks, rms_hidden_blocks)."""
    blocks = tuning.hidden_blocks if meta.centered else tuning.rms_hidden_blocks
    many = meta.n_rows >= tuning.hidden_rows * tuning.hidden_programs_per_sm * meta.facts.sm_count
    return meta.facts.cuda and meta.x_size == 2 and next_power_of_2(meta.n_cols) in blocks and many


def backward_tile(meta: Meta, tuning: Tuning = TUNING) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, programs an SM) of the short-row backward: about
    backward_tile_bytes of the widest input a tile, backward_thread_bytes a thread,
    short_row_programs_per_sm, but for backward_exceptions; halved while the tiles are fewer
    than the programs the SMs run, not below min_backward_tile_bytes (the exceptions' tiles of 4 KB
    are never halved).  The interpreter: the forward's tile, one warp."""
    if not meta.facts.cuda:
        return (*_row_tile(meta, False, tuning)[:2], 1, tuning.short_row_programs_per_sm)
    n_rows, widest = meta.n_rows, meta.widest
    block_n = next_power_of_2(meta.n_cols)
    tile, per_sm = tuning.backward_tile_bytes // widest, tuning.short_row_programs_per_sm
    exception = _backward_exception(meta, tuning)
    if exception is not None:
        tile, per_sm = exception.tile, exception.programs_per_sm
    block_m = rows_in_tile(n_rows, block_n, tile)
    sms = meta.facts.sm_count
    while (
        block_m > 1
        and block_m * block_n * widest > tuning.min_backward_tile_bytes
        and cdiv(n_rows, block_m) < sms * per_sm
    ):
        block_m //= 2
    return block_m, block_n, warps_for(block_m * block_n, per_thread=tuning.backward_thread_bytes // widest), per_sm


def _backward_exception(meta: Meta, tuning: Tuning) -> Optional[TileException]:
    """The first of Tuning.backward_exceptions that takes a CUDA call's short-row backward, if any."""
    if not meta.facts.cuda:
        return None
    block_n = next_power_of_2(meta.n_cols)
    takes = (e for e in tuning.backward_exceptions if e.takes(meta.centered, meta.widest, block_n, meta.n_rows))
    return next(takes, None)


def _partial_rows(work_items, n_rows, target: int, tuning: Tuning) -> int:
    """How many programs share a backward, each writing one partial row: at most `target`, never
    more than the work items (tiles, or row groups), and at least min_rows_per_program rows each:
    a program with one row would write a float32 partial as large as the row it read, and the
    column sum would read it all again."""
    bound = at_most(n_rows // tuning.min_rows_per_program, target)
    return max(1, at_most(work_items, bound))


def _target_programs(meta: Meta, tuning: Tuning, per_sm: int) -> int:
    """`per_sm` programs on every SM; the interpreter's cpu_programs."""
    return per_sm * meta.facts.sm_count if meta.facts.cuda else tuning.cpu_programs


def _held_rows(meta: Meta, col_multiple: int, tuning: Tuning) -> Optional[HeldRowsPlan]:
    """The held backward's plan; None where rows are not held: off on this kind of device, float64,
    or a row no setup takes (more segments than its max_segments, a row length whose
    column_multiple is not a multiple of the setup's col_multiple, or more segments than the
    grid holds)."""
    frame = _frame(meta)
    held = _held_rows_framed(meta, col_multiple, frame, tuning)
    if held is None and frame and not meta.centered:
        # RMS norm held rows off boundaries unframed before version 54 (one-element loads, still faster than
        # two sweeps there; layer norm's were not: version 32): the framed setups fit fewer rows at once.
        held = _held_rows_framed(meta, col_multiple, 0, tuning)
    return held


def _held_rows_framed(meta: Meta, col_multiple: int, frame: int, tuning: Tuning) -> Optional[HeldRowsPlan]:
    """_held_rows with FRAME `frame` (0: rows read from their first element)."""
    kind = meta.facts.kind
    setups = tuning.held_setups(meta.centered).of(meta.widest, framed=bool(frame))
    if not setups or not tuning.held_rows[kind]:
        return None
    # A framed row's places run from its frame's start, up to a run less one before its first element.
    places = meta.n_cols + max(frame - 1, 0)
    if not meta.facts.cuda:
        setup, programs, segment = setups[0], tuning.cpu_programs, tuning.cpu_held_segment
    else:
        setup = next((s for s in setups if s.takes(places, col_multiple)), None)
        if setup is None:
            return None
        segment, programs = setup.segment, setup.programs(meta.facts)
    found = fit_rows(meta.n_rows, cdiv(places, segment), programs)
    if found is None:
        return None
    n_segments, rows_at_once = found
    if frame and rows_at_once < meta.n_rows:
        # Every row a program takes must have its first row's skew (held.py): rows_at_once rows
        # of n_cols must be whole runs (8 rows at a time for rows of 50257 16-bit columns).
        # Then spread evenly over the rounds, as fit_rows spreads them.
        step = _skews(meta.n_cols, frame)
        most = programs // n_segments // step * step
        if most == 0:
            return None
        rows_at_once = min(most, cdiv(cdiv(meta.n_rows, cdiv(meta.n_rows, most)), step) * step)
    # What each op's held kernel publishes (held.py): layer norm two words a segment, (mean x,
    # M2 of x) and (mean g, sum((x - mean x) * g)); RMS norm one, (sum(x^2), sum(x * g)).
    words_a_segment = 2 if meta.centered else 1
    return HeldRowsPlan(
        setup, segment, n_segments, rows_at_once, words_a_segment * n_segments,
        words_block(setup.warps, n_segments), tuning.max_spins[kind], meta.overlap_fill,
        meta.n_cols % segment == 0 and not frame if meta.centered else None, frame,
    )  # fmt: skip
