"""Every softmax plan is one the kernels can run, for any call: properties of choose_plan over random
row counts, row lengths (odd ones and those each side of the blocks), strides between a row's
elements, element sizes, directions, call contexts and devices, checked without launching anything.

test_softmax.py runs each design on chosen shapes; these say that the rule never hands a kernel a
block that does not cover a row, split segments that do not tile a row, held segments that do not
cover a row's (framed) columns or do not fit the grid, a frame where rows need none, or a Gluon
kernel a call it was not written for.
"""

import dataclasses

from hypothesis import given, settings, strategies as st
from plan_strategies import DEVICES, ELEMENT_SIZES, row_counts, row_lengths

from ops.blocks.alignment import frame_run
from ops.blocks.sizes import cdiv, next_power_of_2
from ops.softmax.plan import (
    BACKWARD,
    FORWARD,
    GLUON_FAMILIES,
    TUNING,
    BlockPlan,
    HeldPlan,
    LoopedPlan,
    Meta,
    SplitPlan,
    choose_plan,
)

# and rows past a block of whole 16-element runs: the Gluon kernels' rows
N_COLS = st.one_of(
    row_lengths(1, 22, segments=(2048, 4096, 8192)),
    st.integers(2049, 1 << 18).map(lambda k: 16 * k),
    st.sampled_from([7168, 7169, 14336, 14337, 16384, 16385, 28672, 28673]),  # each side of the block-fill rules
)
N_ROWS = row_counts(1)
SETTINGS = settings(max_examples=800, derandomize=True, database=None, deadline=None)

# Every held design of the tuning, by (family, segment, warps, registers): its grid on a device
DESIGNS = [getattr(TUNING, f.name) for f in dataclasses.fields(TUNING) if hasattr(getattr(TUNING, f.name), "family")]


def _programs(plan: HeldPlan, facts) -> int:
    (setup,) = {
        d.setup
        for d in DESIGNS
        if (d.family, d.setup.segment, d.setup.warps, d.setup.registers)
        == (plan.family, plan.segment, plan.warps, plan.registers)
    }
    return setup.programs(facts)


@SETTINGS
@given(
    direction=st.sampled_from([FORWARD, BACKWARD]),
    n_rows=N_ROWS,
    n_cols=N_COLS,
    inner=st.sampled_from([1, 1, 1, 3, 64]),
    sizes=ELEMENT_SIZES,
    facts=DEVICES,
    context=st.fixed_dictionaries(  # mostly True: the Gluon kernels need all of eager, aligned and gluon
        {name: st.sampled_from([True, True, True, False]) for name in ("eager", "aligned", "overlap_fill", "gluon")}
    ),
)
def test_every_softmax_plan_covers_its_rows(direction, n_rows, n_cols, inner, sizes, facts, context):
    meta = Meta(direction, n_rows, n_cols, inner, *sizes, facts, **context)
    plan = choose_plan(meta)
    rows = plan.rows
    assert (rows.n_rows, rows.n_cols, rows.inner) == (n_rows, n_cols, inner) and n_cols % rows.col_multiple == 0
    fits = _fits_a_block(meta)
    if isinstance(plan, BlockPlan):
        assert fits and plan.block_n == next_power_of_2(n_cols)
        assert not (_sparse_16bit_backward(meta) and plan.block_n in (8192, 16384))  # those take the reloading pass
        assert not _float32_forward_of_16384(meta)
        assert plan.block_m >= 1 and plan.block_m & (plan.block_m - 1) == 0 and plan.block_m <= max(n_rows, 1)
        assert plan.grid == (cdiv(n_rows, plan.block_m),) and 1 <= plan.warps <= 32
        return
    if isinstance(plan, LoopedPlan) and fits:  # the reloading pass: one chunk
        assert _sparse_16bit_backward(meta) or _float32_forward_of_16384(meta)
        assert plan.chunk == next_power_of_2(n_cols) and plan.grid == (n_rows,)
        return
    assert not fits or (isinstance(plan, HeldPlan) and _held_though_it_fits(meta))
    if isinstance(plan, HeldPlan):
        _check_held(plan, meta)
    elif isinstance(plan, SplitPlan):
        assert plan.n_segments >= 2 and plan.segment_len % plan.chunk == 0
        assert (plan.n_segments - 1) * plan.segment_len < n_cols <= plan.n_segments * plan.segment_len
        assert plan.segments_block >= plan.n_segments and plan.grid == (n_rows, plan.n_segments)
    else:
        assert isinstance(plan, LoopedPlan) and plan.grid == (n_rows,)


def _fits_a_block(meta: Meta) -> bool:
    max_block = TUNING.max_block if meta.facts.cuda else TUNING.cpu_max_block
    return next_power_of_2(meta.n_cols) <= max_block


def _sparse_16bit_backward(meta: Meta) -> bool:
    """A GPU backward of 16-bit rows that fill at most 7/8 of their power-of-two block."""
    widest = max(meta.input_bytes, meta.output_bytes)
    block = next_power_of_2(meta.n_cols)
    return meta.facts.cuda and meta.direction == BACKWARD and widest == 2 and meta.n_cols * 8 <= 7 * block


def _float32_forward_of_16384(meta: Meta) -> bool:
    float32 = meta.input_bytes == meta.output_bytes == 4
    return meta.facts.cuda and meta.direction == FORWARD and float32 and next_power_of_2(meta.n_cols) == 16384


def _held_though_it_fits(meta: Meta) -> bool:
    """The backward's rows that fit a block but are held on a GPU: float32 past 16384 columns, 16-bit
    rows that fill at most 7/8 of a block of 32768."""
    if not meta.facts.cuda or meta.direction != BACKWARD:
        return False
    block, widest = next_power_of_2(meta.n_cols), max(meta.input_bytes, meta.output_bytes)
    return (widest == 4 and block > 16384) or (block == 32768 and _sparse_16bit_backward(meta))


def _check_held(plan: HeldPlan, meta: Meta):
    """Held rows: 16/32-bit only; the Gluon kernels only for eager, aligned, 16-bit forwards along the
    last dim on Hopper with Gluon, rows of 16-element multiples, and never framed; the Triton kernels
    framed exactly where rows start off 16-byte boundaries; segments cover a row's columns from its
    frame; a row's segments and the rows at once fit the design's grid."""
    n_cols, facts = meta.n_cols, meta.facts
    assert max(meta.input_bytes, meta.output_bytes) in (2, 4)
    if plan.family in GLUON_FAMILIES:
        assert meta.direction == FORWARD and meta.eager and meta.aligned and meta.gluon and facts.hopper
        assert meta.input_bytes == 2 and meta.inner == 1 and n_cols % 16 == 0 and plan.frame == 0
    else:
        assert plan.frame == frame_run(n_cols, meta.inner, meta.input_bytes, meta.output_bytes)
    assert plan.frame == 0 or meta.inner == 1
    assert plan.n_segments * plan.segment >= n_cols + max(plan.frame - 1, 0)
    assert 1 <= plan.rows_at_once <= meta.n_rows and plan.segments_block >= plan.n_segments
    assert plan.grid == (plan.rows_at_once * plan.n_segments,)
    if facts.cuda:
        assert plan.grid[0] <= _programs(plan, facts)
    assert plan.full is None or plan.full == (n_cols % plan.segment == 0)
