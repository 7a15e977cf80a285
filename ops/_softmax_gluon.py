"""Softmax's cooperative forward in Gluon: the next round's segment waits in shared memory.

The cooperative forward (``softmax_forward_cooperative_kernel``) holds a row
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
# tl.max and tl.sum too): the same math, so the same partials.  ops/softmax.py
# imports this module after defining them.
from .softmax import _block_max_exp, _combine_partials, _pack, _poll, _publish, _rescale, _unpack

_max_exp = gluon.jit(_block_max_exp.fn)
_combine = gluon.jit(_combine_partials.fn)
_factor = gluon.jit(_rescale.fn)
_pack_word = gluon.jit(_pack.fn)
_unpack_word = gluon.jit(_unpack.fn)
_publish_word = gluon.jit(_publish.fn)
_poll_words = gluon.jit(_poll.fn)

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
def _as_float32(x, cols, n_cols):
    return gl.where(cols < n_cols, x.to(gl.float32), -float("inf"))


@gluon.jit
def _row_words(words_ptr, row, n_segments, max_spins, SEGMENTS_BLOCK: gl.constexpr, layout: gl.constexpr):
    """The row's partial words once all are published (see ops/softmax.py's _poll).  SEGMENTS_BLOCK
    is at least the program's threads, so `layout` gives each word one copy (see _words_block)."""
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
        seg_max, numerator = _max_exp(_as_float32(x, cols, n_cols))
        part_max = gl.where(segments == segment, seg_max, part_max)
        part_sum = gl.where(segments == segment, gl.sum(numerator, axis=0), part_sum)
    return part_max, part_sum


@gluon.jit
def softmax_forward_staged_kernel(
    x_ptr, y_ptr, words_ptr, n_rows, n_cols, n_segments, rows_at_once, max_spins,
    SEGMENT: gl.constexpr, SEGMENTS_BLOCK: gl.constexpr, STAGES: gl.constexpr, VEC: gl.constexpr,
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
    for round in range(0, gl.cdiv(n_rows - first_row, rows_at_once)):
        row = first_row + round * rows_at_once
        # The stage refilled now was read into registers a round ago, by every warp once all pass here.
        _cta_barrier()
        ahead = round + STAGES - 1
        _copy_segment_in(stages.index(ahead % STAGES), x_ptr, first_row + ahead * rows_at_once, n_rows, n_cols, cols)
        cp.wait_group(STAGES - 1)  # every copy but the STAGES - 1 newest has landed: this round's
        seg_max, numerator = _max_exp(_as_float32(stages.index(round % STAGES).load(layout), cols, n_cols))
        word = _pack_word(seg_max, gl.sum(numerator, axis=0))
        _publish_word(words_ptr, row.to(gl.int64) * n_segments + segment, word)
        words, published = _row_words(words_ptr, row, n_segments, max_spins, SEGMENTS_BLOCK, small)
        if published:
            part_max, part_sum = _unpack_word(words)
        else:  # waited too long (fewer programs resident than the grid): compute the row's partials here
            part_max, part_sum = _partials_here(x_ptr, row, n_cols, n_segments, SEGMENT, SEGMENTS_BLOCK, layout, small)
            # Read this segment again rather than keep its numerators in registers through that loop.
            x = gl.load(x_ptr + row.to(gl.int64) * n_cols + cols, mask=cols < n_cols, other=0.0)
            seg_max, numerator = _max_exp(_as_float32(x, cols, n_cols))
        row_max, row_sum = _combine(part_max, part_sum)
        y = numerator * _factor(seg_max, row_max, row_sum)
        gl.store(y_ptr + row.to(gl.int64) * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=cols < n_cols)
