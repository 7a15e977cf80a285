"""Softmax's held forward in Gluon: the next round's segment waits in shared memory.

The held forward that publishes and then waits (``softmax_forward_held_kernel``) holds a row
segment on chip while the row's programs wait for each other, and loads the
next round's segment early so that the memory keeps working during the
wait.  Written in Triton, both segments live in registers: a 16-bit forward
needs 80 registers a thread, so 3 programs share an SM.  Triton gives a
kernel no say over shared memory; Gluon, Triton's lower-level language
(``triton.experimental.gluon``), does.  Here the next segment is copied
straight from global to shared memory by ``cp.async`` (no registers held
while it is in flight) and read into registers when its round starts: 52-64
registers, 4 programs an SM for 16-bit rows.  More bytes in flight per SM,
the number that decides these kernels (H100, % of copy bandwidth, rows of
40000 to 1048576 columns, partials behind a counter with a release: bf16
75-81 -> 78-83, float32 83-89 -> 86-92).  Once partials were published as
one word each, without the release, the Triton kernel came within a few
points (bf16 81-94 against this kernel's 81-93); the stages still win on
the longest rows (128 and 64 rows of 524288 and 1048576 columns).  Float32
rows now take the Triton kernel that publishes a round ahead
(``softmax_forward_lagged_kernel``), which beat this one's float32 setup.
Rows of more than 32 segments take a second kernel here, which publishes a
round ahead too and keeps whole segments in shared memory (see the end of
the module): rows of 1M columns went from 81% to 86%.

Same algorithm, same partials, same fallback as the Triton kernel; only
for 16-bit CUDA launches made eagerly (``torch.compile`` traces Triton
kernels only), rows whose every start is 16-byte aligned (``cp.async`` copies at
least 4 bytes, and 16 to be fast), on Hopper or newer.  Importing this
module fails on a Triton without the Gluon parts it uses.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

# The Triton kernel's own pieces, compiled as Gluon (which is how Gluon takes in
# tl.max and tl.sum too): the same math, so the same partials.  launch.py imports
# this module; where the import fails, the plan never picks these kernels (Meta.gluon).
from ..blocks.fastmath import exp, finite_or_zero
from ..blocks.held_rows import pack, poll, publish, unpack, wait_for_fill
from .kernels import _block_max_exp, _combine_partials, _rescale

_max_exp = gluon.jit(_block_max_exp.fn)
_combine = gluon.jit(_combine_partials.fn)
_factor = gluon.jit(_rescale.fn)
_pack_word = gluon.jit(pack.fn)
_unpack_word = gluon.jit(unpack.fn)
_publish_word = gluon.jit(publish.fn)
_poll_words = gluon.jit(poll.fn)
_shift = gluon.jit(finite_or_zero.fn)
_exp = gluon.jit(exp.fn)
_wait_for_fill = gluon.jit(wait_for_fill.fn)

# Triton 3.9 renamed cp.async's global-to-shared copy and the CTA barrier.
_async_load = cp.async_load if hasattr(cp, "async_load") else cp.async_copy_global_to_shared
_cta_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier


@gluon.jit
def _copy_segment_in(stage, x_ptr, row, n_rows, n_cols, cols):
    """Start copying `row`'s segment into shared memory `stage` (zeros past the row or the last row)."""
    in_bounds = (cols < n_cols) & (row < n_rows)
    _async_load(stage, x_ptr + row.to(gl.int64) * n_cols + cols, mask=in_bounds)
    cp.commit_group()


@gluon.jit
def _as_float32(x, cols, n_cols, FULL: gl.constexpr):
    """x in float32, -inf past the row.  FULL (the row is whole segments): no lane is past it, and
    the compare and select an element are left out.  The kernel that publishes ahead takes it
    (rows of 1M columns, 90 -> 91-92% of copy); the other ran 1.5-3% slower with it (perf notes 39)."""
    if FULL:
        y = x.to(gl.float32)
    else:
        y = gl.where(cols < n_cols, x.to(gl.float32), -float("inf"))
    return y


@gluon.jit
def _row_words(words_ptr, row, n_segments, max_spins, SEGMENTS_BLOCK: gl.constexpr, layout: gl.constexpr):
    """The row's partial words once all are published (see ops/blocks/held_rows.py's poll).  SEGMENTS_BLOCK
    is at least the program's threads, so `layout` gives each word one copy (see its words_block)."""
    segments = gl.arange(0, SEGMENTS_BLOCK, layout=layout)
    return _poll_words(words_ptr + row.to(gl.int64) * n_segments + segments, segments < n_segments, max_spins)


@gluon.jit
def _partials_here(x_ptr, row, n_cols, n_segments, SEGMENT: gl.constexpr, SEGMENTS_BLOCK: gl.constexpr,
                   layout: gl.constexpr, small: gl.constexpr):  # fmt: skip
    """Every segment's (max, sum) of `row`, computed by this program from global memory: the same
    values in the same layout as their owners reduce, so the same bits."""
    segments = gl.arange(0, SEGMENTS_BLOCK, layout=small)
    part_max = gl.full([SEGMENTS_BLOCK], -float("inf"), gl.float32, small)
    part_sum = gl.zeros([SEGMENTS_BLOCK], gl.float32, small)
    for segment in range(0, n_segments):
        cols = segment * SEGMENT + gl.arange(0, SEGMENT, layout=layout)
        x = gl.load(x_ptr + row.to(gl.int64) * n_cols + cols, mask=cols < n_cols, other=0.0)
        seg_max, numerator = _max_exp(_as_float32(x, cols, n_cols, False))
        part_max = gl.where(segments == segment, seg_max, part_max)
        part_sum = gl.where(segments == segment, gl.sum(numerator, axis=0), part_sum)
    return part_max, part_sum


@gluon.jit
def softmax_forward_staged_kernel(
    x_ptr, y_ptr, words_ptr, n_rows, n_cols, n_segments, rows_at_once, max_spins,
    SEGMENT: gl.constexpr, SEGMENTS_BLOCK: gl.constexpr, STAGES: gl.constexpr, VEC: gl.constexpr,
    OVERLAPPED: gl.constexpr,
):
    """Rows held on chip across programs, the next STAGES - 1 rounds' segments staged in shared memory.

    Program p owns segment p % n_segments of rows p // n_segments + k * rows_at_once.  A round:
    wait for its segment's copy, publish (max, sum) of the segment as one word, wait for the row's
    other words, combine, write y = exp(x - segment max) times one factor."""
    WARPS: gl.constexpr = gl.num_warps()
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])  # VEC elements = 16 bytes a thread
    small: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    stages = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [STAGES, SEGMENT], gl.SwizzledSharedLayout(1, 1, 1, [0]))

    pid = gl.program_id(0)
    segment = pid % n_segments
    first_row = pid // n_segments
    cols = segment * SEGMENT + gl.arange(0, SEGMENT, layout=layout)
    for early in gl.static_range(STAGES - 1):
        _copy_segment_in(stages.index(early), x_ptr, first_row + early * rows_at_once, n_rows, n_cols, cols)
    _wait_for_fill(OVERLAPPED)
    for round in range(0, gl.cdiv(n_rows - first_row, rows_at_once)):
        row = first_row + round * rows_at_once
        # The stage refilled now was read into registers a round ago, by every warp once all pass here.
        _cta_barrier()
        ahead = round + STAGES - 1
        _copy_segment_in(stages.index(ahead % STAGES), x_ptr, first_row + ahead * rows_at_once, n_rows, n_cols, cols)
        cp.wait_group(STAGES - 1)  # every copy but the STAGES - 1 newest has landed: this round's
        seg_max, numerator = _max_exp(_as_float32(stages.index(round % STAGES).load(layout), cols, n_cols, False))
        word = _pack_word(seg_max, gl.sum(numerator, axis=0))
        _publish_word(words_ptr, row.to(gl.int64) * n_segments + segment, word)
        words, published = _row_words(words_ptr, row, n_segments, max_spins, SEGMENTS_BLOCK, small)
        if published:
            part_max, part_sum = _unpack_word(words)
        else:  # waited too long (fewer programs resident than the grid): compute the row's partials here
            part_max, part_sum = _partials_here(x_ptr, row, n_cols, n_segments, SEGMENT, SEGMENTS_BLOCK, layout, small)
            # Read this segment again rather than keep its numerators in registers through that loop.
            x = gl.load(x_ptr + row.to(gl.int64) * n_cols + cols, mask=cols < n_cols, other=0.0)
            seg_max, numerator = _max_exp(_as_float32(x, cols, n_cols, False))
        row_max, row_sum = _combine(part_max, part_sum)
        y = numerator * _factor(seg_max, row_max, row_sum)
        gl.store(y_ptr + row.to(gl.int64) * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=cols < n_cols)


# ---------------------------------------------------------------------------
# Rows of more than 32 segments (plan.py, Tuning.ahead_past_segments): publish a round ahead.
# ---------------------------------------------------------------------------
# Above, every program of a round waits for the slowest of the row's programs
# before it writes; with 128 or 256 programs a row (rows of 1M or 2M columns)
# that wait costs 10-20 points of copy bandwidth.  The kernel below publishes
# the partial of its next row before it waits for this row's words, which
# then had a whole round to arrive.  It needs the next round's partial before
# this round's y is written, so it keeps no numerators in registers: the
# segment stays in shared memory (three stages: the row being written, the
# next row being reduced, the row after that in flight) and exp(x - max) is
# computed twice, once for the sum and once for y.  The extra work costs 4-7
# points on rows of few segments, where the wait was short anyway.


@gluon.jit
def _chunk_cols(segment, c, SEGMENT: gl.constexpr, CHUNK: gl.constexpr, layout: gl.constexpr):
    return segment * SEGMENT + c * CHUNK + gl.arange(0, CHUNK, layout=layout)


@gluon.jit
def _read_chunk(stage, row_ptr, segment, c, n_cols, SEGMENT: gl.constexpr, CHUNK: gl.constexpr, layout: gl.constexpr,
                FULL: gl.constexpr):  # fmt: skip
    """Chunk c of a segment in float32 (-inf past the row): from shared memory `stage`, or from global
    memory at `row_ptr` where `stage` is None.  A chunk is one `layout` of the program's threads, so
    from shared memory each thread reads the elements its own copies wrote."""
    cols = _chunk_cols(segment, c, SEGMENT, CHUNK, layout)
    if stage is None:
        x = gl.load(row_ptr + cols, mask=cols < n_cols, other=0.0)
    else:
        x = stage.slice(c * CHUNK, CHUNK).load(layout)
    return _as_float32(x, cols, n_cols, FULL)


@gluon.jit
def _segment_max_sum(stage, row_ptr, segment, n_cols, SEGMENT: gl.constexpr, CHUNK: gl.constexpr,
                     layout: gl.constexpr, FULL: gl.constexpr):  # fmt: skip
    """(max, sum of exp(x - max)) of a segment, read a chunk at a time (see _read_chunk): each lane
    keeps a running max, then a running sum, reduced across the program once.  The same lanes add
    the same values from either memory, so a program computing another's partial gets its bits."""
    run_max = gl.full([CHUNK], -float("inf"), gl.float32, layout)
    for c in gl.static_range(SEGMENT // CHUNK):
        run_max = gl.maximum(run_max, _read_chunk(stage, row_ptr, segment, c, n_cols, SEGMENT, CHUNK, layout, FULL))
    seg_max = gl.max(run_max, axis=0)
    run_sum = gl.zeros([CHUNK], gl.float32, layout)
    for c in gl.static_range(SEGMENT // CHUNK):
        run_sum += _exp(_read_chunk(stage, row_ptr, segment, c, n_cols, SEGMENT, CHUNK, layout, FULL) - _shift(seg_max))
    return seg_max, gl.sum(run_sum, axis=0)


@gluon.jit
def _chunked_partials_here(x_ptr, row, n_cols, n_segments, SEGMENT: gl.constexpr, SEGMENTS_BLOCK: gl.constexpr,
                           CHUNK: gl.constexpr, layout: gl.constexpr, small: gl.constexpr,
                           FULL: gl.constexpr):  # fmt: skip
    """Every segment's (max, sum) of `row`, computed here as the owners compute them (see _partials_here)."""
    segments = gl.arange(0, SEGMENTS_BLOCK, layout=small)
    part_max = gl.full([SEGMENTS_BLOCK], -float("inf"), gl.float32, small)
    part_sum = gl.zeros([SEGMENTS_BLOCK], gl.float32, small)
    for segment in range(0, n_segments):
        row_ptr = x_ptr + row.to(gl.int64) * n_cols
        seg_max, seg_sum = _segment_max_sum(None, row_ptr, segment, n_cols, SEGMENT, CHUNK, layout, FULL)
        part_max = gl.where(segments == segment, seg_max, part_max)
        part_sum = gl.where(segments == segment, seg_sum, part_sum)
    return part_max, part_sum


@gluon.jit
def softmax_forward_staged_ahead_kernel(
    x_ptr, y_ptr, words_ptr, n_rows, n_cols, n_segments, rows_at_once, max_spins,
    SEGMENT: gl.constexpr, SEGMENTS_BLOCK: gl.constexpr, STAGES: gl.constexpr, VEC: gl.constexpr,
    OVERLAPPED: gl.constexpr, FULL: gl.constexpr = False,
):
    """Rows held on chip across programs, publishing a round ahead; segments in shared memory.

    Program p owns segment p % n_segments of rows p // n_segments + k * rows_at_once, as above.
    Round r: publish row r + 1's (max, sum) from its staged segment, wait for row r's words (published
    a round ago), write row r's y from its staged segment, and refill that stage with row r + STAGES."""
    WARPS: gl.constexpr = gl.num_warps()
    CHUNK: gl.constexpr = VEC * 32 * WARPS  # one 16-byte piece a thread
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    small: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    stages = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [STAGES, SEGMENT], gl.SwizzledSharedLayout(1, 1, 1, [0]))

    pid = gl.program_id(0)
    segment = pid % n_segments
    first_row = pid // n_segments  # below n_rows: the grid has at most n_rows rows at once
    cols = segment * SEGMENT + gl.arange(0, SEGMENT, layout=layout)
    for early in gl.static_range(STAGES):
        _copy_segment_in(stages.index(early), x_ptr, first_row + early * rows_at_once, n_rows, n_cols, cols)
    cp.wait_group(STAGES - 1)  # the first row's copy has landed
    seg_max, seg_sum = _segment_max_sum(stages.index(0), x_ptr, segment, n_cols, SEGMENT, CHUNK, layout, FULL)
    _wait_for_fill(OVERLAPPED)
    _publish_word(words_ptr, first_row.to(gl.int64) * n_segments + segment, _pack_word(seg_max, seg_sum))
    for round in range(0, gl.cdiv(n_rows - first_row, rows_at_once)):
        row = first_row + round * rows_at_once
        next_row = row + rows_at_once
        cp.wait_group(STAGES - 2)  # the next row's copy has landed; later ones may be in flight
        next_stage = stages.index((round + 1) % STAGES)
        next_max, next_sum = _segment_max_sum(next_stage, x_ptr, segment, n_cols, SEGMENT, CHUNK, layout, FULL)
        if next_row < n_rows:
            _publish_word(words_ptr, next_row.to(gl.int64) * n_segments + segment, _pack_word(next_max, next_sum))
        words, published = _row_words(words_ptr, row, n_segments, max_spins, SEGMENTS_BLOCK, small)
        if published:
            part_max, part_sum = _unpack_word(words)
        else:  # waited too long: compute the row's partials here
            part_max, part_sum = _chunked_partials_here(x_ptr, row, n_cols, n_segments, SEGMENT, SEGMENTS_BLOCK, CHUNK,
                                                        layout, small, FULL)  # fmt: skip
        row_max, row_sum = _combine(part_max, part_sum)
        factor = _factor(seg_max, row_max, row_sum)
        stage = stages.index(round % STAGES)
        y_row = y_ptr + row.to(gl.int64) * n_cols
        for c in gl.static_range(SEGMENT // CHUNK):
            y = _exp(_read_chunk(stage, x_ptr, segment, c, n_cols, SEGMENT, CHUNK, layout, FULL) - _shift(seg_max)) * factor
            chunk_cols = _chunk_cols(segment, c, SEGMENT, CHUNK, layout)
            gl.store(y_row + chunk_cols, y.to(y_ptr.dtype.element_ty), mask=chunk_cols < n_cols)
        _cta_barrier()  # every warp has read this stage: refill it
        _copy_segment_in(stage, x_ptr, first_row + (round + STAGES) * rows_at_once, n_rows, n_cols, cols)
        seg_max = next_max
