"""Cross entropy's plans: which launches a call makes, decided from what the call is.

    Meta                  what a call is: N, C, the logits' row stride and element size, the
                          reduction, whether it smooths labels, the device's facts
    Tuning, TUNING        every constant the rules use, each with its reason and measurement
    choose_forward_plan   Meta -> ForwardPlan: the row kernel's tile, the parts of the sum over the rows
    choose_backward_plan  Meta -> BackwardPlan: the row kernel's tile, the parts of "mean"'s count

Both are pure functions of the Meta and the Tuning: a test plans for an H100 on any machine by
building ``Meta(..., facts=H100)``, and runs another design by passing another Tuning to the
Python entry points of op.py.  launch.py carries a plan out and decides nothing.

The rules (docs/ops/cross_entropy.md has the table, with the numbers):

* Row tiles, both directions.  A row is swept in chunks of the next power of two of C, at most
  ``max_chunk`` columns.  Rows of at most ``stacked_row`` columns are stacked into tiles of about
  ``row_tile`` elements; longer rows are one a program, their warps set by the elements a thread
  (``forward_per_thread`` and the others below).
* Peeled rows.  One contiguous row a program that does not start on a 16-byte boundary is swept
  from the boundary before it (the kernels' PEEL), so that its accesses are 16 bytes wide.
* The sums over the rows (the forward's sum of the row losses for "mean" and "sum", the backward's
  count of kept rows for "mean") are taken in at most ``max_parts`` parts, one a program, each a
  whole number of chunks of ``reduce_chunk`` rows.
"""

from dataclasses import dataclass, replace

from ..blocks.alignment import column_multiple
from ..blocks.sizes import cdiv, next_power_of_2, rows_in_tile, warps_for
from ..runtime import ByKind, DeviceFacts

_ACCESS_BYTES = 16  # the widest access a thread makes: a row whose start is off this boundary is peeled


@dataclass(frozen=True)
class Tuning:
    """Every constant of cross entropy's plans.  H100 numbers are from docs/perf-notes.md, at the
    version each field names."""

    # The chunk a row is swept in: the next power of two of C, capped.  (Version 28.)
    max_chunk: ByKind = ByKind(cuda=4096, cpu=1 << 14)

    # Rows of at most `stacked_row` columns are stacked into tiles of about `row_tile` elements,
    # `tile_per_thread` a thread: one 100-class row a program leaves most lanes idle, and each
    # program waits on its targets before it reads its rows.  H100, % of a copy of the logits'
    # bytes, one row a program loading x_t last and each chunk after the last one's math -> now
    # (row tiles, x_t loaded with the rows, the next chunk ahead; version 28), at 65536x100 /
    # 32768x1000 / 16384x4096 / 4096x32000 / 4096x50257 / 8192x128256: bf16 4.7 / 51 / 75 / 102 /
    # 92 / 114 -> 11.6 / 63 / 74 / 105 / 96 / 116; float32 7.6 / 73 / 102 / 114 / 113 / 119 -> 19 /
    # 89 / 102 / 116 / 111 / 120.  Rows of 1000 columns stacked two or four a program lost 19-38
    # points; at 65536x100 the mean's one-program sum over the row losses cost the other quarter
    # (reduction="none": 16.1), since taken in parts (`reduce_chunk`).  The backward takes the same
    # tiles: one row a program -> row tiles, bf16 / float32 at 65536x100 21 / 44 -> 49 / 78, level
    # elsewhere (version 29, where two other designs are measured).
    stacked_row: ByKind = ByKind(cuda=256, cpu=1 << 14)
    row_tile: ByKind = ByKind(cuda=2048, cpu=1 << 14)
    tile_per_thread: int = 8

    # Rows swept one a program are "short" up to `short_row_chunks` chunks (8192 columns on a GPU):
    # the elements a thread below differ for short and longer rows.  (Versions 33 and 34.)
    short_row_chunks: int = 2

    # The forward only reads, and each program first waits on its targets (an ignored row is not
    # read): a short row wants twice the bytes a thread, 32 (4096 columns on 4 warps rather than
    # 8).  H100, the kernel alone, % of copy as the harness counts it, 16 -> 32 a thread, no
    # ignored rows / one row in 4 ignored: bf16 16384x4096 78 -> 88 / 83 -> 102, 8192x8192 89 ->
    # 95 / 103 -> 118, 32768x1000 82 -> 85 / 85 -> 100; float32 16384x4096 91 -> 97 / 116 -> 121.
    # Longer rows keep their next chunk in flight already: 16-bit ones gained a little (bf16
    # 2048x262144 93 -> 97 in the harness), float32 ones lost (102 -> 97) and keep
    # `forward_per_thread_long`, as float64 does everywhere (two registers a value).  (Version 33.)
    forward_per_thread: int = 32
    forward_per_thread_long: int = 16

    # The backward writes what it reads.  Short rows want 16 a thread (4096 columns on 8 warps);
    # longer rows keep more in flight on 16 warps, 8 a thread.  H100, the kernel alone, % of a copy
    # of the logits, 16 -> 8 a thread: bf16 4096x32000 / 4096x50257 / 2048x65536 / 8192x128256
    # 92.8 / 87.5 / 90.2 / 93.5 -> 95.1 / 90.6 / 93.5 / 94.3, float32 94.2 / 88.2 / 115.8 / 94.0 ->
    # 94.9 / 89.7 / 116.8 / 94.3; at two chunks bf16 8192x8192 95.5 -> 93.6 and 16384x4100 84.1 ->
    # 73.2.  32 a thread lost 0-8 points everywhere.  (Version 34.)
    backward_per_thread: int = 16
    backward_per_thread_long: int = 8

    # The sums over the N rows split the rows into at most `max_parts` parts, one a program, each
    # a whole number of chunks of `reduce_chunk` rows (`reduce_per_thread` a thread): one chunk a
    # program up to 131072 rows on a GPU.  They were one program over all the rows, in chunks of
    # 8192 on 16 warps: latency-bound, each chunk a round trip to memory.  H100, CUDA-graph time of
    # an op with "mean" less the same op with "none" ("sum" for the backward), before -> now:
    # forward 32768x1000 bf16 9.9 -> 4.0 µs (of 35.4), 16384x4096 3.5 -> 1.7; backward 5.6 -> 2.0
    # and 3.5 -> 1.9.  The forward's sum alone at 16384 rows: 16 programs of one chunk 5.0 µs, 4 of
    # four chunks 8.3, one program 18.4.  (Version 41.)
    reduce_chunk: ByKind = ByKind(cuda=1024, cpu=1 << 16)
    reduce_per_thread: int = 8
    # Also the length of the loads that add the parts' partials up: a power of two.
    max_parts: int = 128

    def with_cpu(self, **values: int) -> "Tuning":
        """This tuning with the interpreter's values of the ByKind constants named replaced, as
        tests shrink them so that small tensors take the paths of large ones:
        ``TUNING.with_cpu(max_chunk=16, reduce_chunk=4)``."""
        return replace(self, **{name: replace(getattr(self, name), cpu=value) for name, value in values.items()})


TUNING = Tuning()


@dataclass(frozen=True)
class Meta:
    """What a call is, as far as its plan goes.  N may be symbolic (torch.compile with dynamic
    shapes): the rules compare it with their bounds and keep it symbolic where they can."""

    n_rows: int
    n_cols: int
    row_stride: int  # elements from one row of the logits to the next (their columns are adjacent)
    element_size: int  # bytes a logit
    facts: DeviceFacts
    reduction: str = "mean"  # "none", "mean" or "sum"
    smoothing: bool = False  # label_smoothing > 0: the forward computes the smoothing term


@dataclass(frozen=True)
class RowTile:
    """A row kernel's launch: `programs` programs of `rows` rows each (BLOCK_M), swept `block`
    columns at a time (BLOCK_SIZE) on `warps` warps."""

    programs: int
    rows: int
    block: int
    warps: int
    col_multiple: int  # COL_MULTIPLE: the largest power of two, at most 16, dividing C and the row stride
    peel: int  # PEEL: the elements in 16 bytes for a peeled row, else 0


@dataclass(frozen=True)
class RowParts:
    """A sum over the N rows in parts: `programs` parts of `rows_per_part` rows, each summed in
    chunks of `chunk` rows (BLOCK_SIZE) on `warps` warps; `max_parts` is the kernels' MAX_PARTS or
    MEAN_PARTS, a power of two at least `programs`."""

    programs: int
    rows_per_part: int
    chunk: int
    warps: int
    max_parts: int


@dataclass(frozen=True)
class ForwardPlan:
    tile: RowTile | None  # the row kernel's; None for N = 0 (no row kernel)
    sums: RowParts | None  # the sum of the row losses, for "mean" and "sum"; None for "none"
    mean: bool  # MEAN: the sum is divided by the number of kept rows
    smoothing: bool  # SMOOTHING: the label-smoothing term is compiled in


@dataclass(frozen=True)
class BackwardPlan:
    tile: RowTile | None  # the row kernel's; None for N = 0 (nothing to launch)
    counts: RowParts | None  # the count of the kept rows, for "mean"; None otherwise


def choose_forward_plan(meta: Meta, tuning: Tuning = TUNING) -> ForwardPlan:
    """The forward's launches: its row kernel's tile, and the parts of the sum over the rows
    (a reduction over no row still launches, one program: a sum of nothing is 0, its mean NaN)."""
    sums = _row_parts(meta, tuning) if meta.reduction != "none" else None
    tile = _row_tile(meta, tuning, forward=True) if meta.n_rows > 0 else None
    return ForwardPlan(tile, sums, meta.reduction == "mean", meta.smoothing)


def choose_backward_plan(meta: Meta, tuning: Tuning = TUNING) -> BackwardPlan:
    """The backward's launches: the parts of "mean"'s count of kept rows, and its row kernel's tile."""
    if meta.n_rows == 0:
        return BackwardPlan(None, None)
    counts = _row_parts(meta, tuning) if meta.reduction == "mean" else None
    return BackwardPlan(_row_tile(meta, tuning, forward=False), counts)


def _row_tile(meta: Meta, tuning: Tuning, forward: bool) -> RowTile:
    """Rows of at most `stacked_row` columns stacked into tiles of about `row_tile` elements,
    longer rows one a program, swept in chunks (see _elements_a_thread)."""
    n_rows, n_cols, facts = meta.n_rows, meta.n_cols, meta.facts
    block = min(next_power_of_2(n_cols), tuning.max_chunk.on(facts))
    if block > tuning.stacked_row.on(facts):
        rows = 1
        warps = warps_for(block, _elements_a_thread(meta, block, tuning, forward))
    else:
        rows = rows_in_tile(n_rows, block, tuning.row_tile.on(facts))
        warps = warps_for(rows * block, per_thread=tuning.tile_per_thread)
    col_multiple = column_multiple(n_cols, meta.row_stride)
    return RowTile(cdiv(n_rows, rows), rows, block, warps, col_multiple, _peel(meta, rows, col_multiple))


def _elements_a_thread(meta: Meta, block: int, tuning: Tuning, forward: bool) -> int:
    """Elements a thread in the chunks of a row swept one a program (see Tuning)."""
    long_row = meta.n_cols > tuning.short_row_chunks * block
    if not forward:
        return tuning.backward_per_thread_long if long_row else tuning.backward_per_thread
    if meta.element_size > 4 or (meta.element_size == 4 and long_row):
        return tuning.forward_per_thread_long
    return tuning.forward_per_thread


def _peel(meta: Meta, rows: int, col_multiple: int) -> int:
    """PEEL of the row kernels: the elements in 16 bytes for one contiguous row a program whose rows
    do not all start on a 16-byte boundary and that is two 16-byte runs long at least (the kernels
    take its first and last partial runs apart: two runs, not one); 0 otherwise.  (col_multiple:
    the launch's COL_MULTIPLE, which for contiguous rows is that of the row length.)"""
    vector = _ACCESS_BYTES // meta.element_size
    aligned = col_multiple >= vector
    contiguous = meta.row_stride == meta.n_cols
    return vector if rows == 1 and contiguous and not aligned and meta.n_cols >= 2 * vector else 0


def _row_parts(meta: Meta, tuning: Tuning) -> RowParts:
    """At most `max_parts` parts, each a whole number of chunks, at least one part."""
    chunk = tuning.reduce_chunk.on(meta.facts)
    per_part = chunk * max(cdiv(meta.n_rows, tuning.max_parts * chunk), 1)
    programs = max(cdiv(meta.n_rows, per_part), 1)
    return RowParts(programs, per_part, chunk, warps_for(chunk, per_thread=tuning.reduce_per_thread), tuning.max_parts)
