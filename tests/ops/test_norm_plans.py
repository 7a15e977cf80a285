"""Every norm plan is one the kernels can run, for any shape: properties of choose_forward_plan and
choose_backward_plan over random row counts, row lengths (odd ones and those each side of the blocks),
element sizes and devices (an H100, and the same with fewer SMs), checked without launching anything.

The kernels' tests (test_norms.py) run each design on chosen shapes; these say that the rules which
pick a design, its blocks and its grid never hand a kernel a plan outside what it was written for:
a tile that does not cover a row, held rows whose segments do not cover a row's places or do not fit
the grid, framed rows that share no skew, a framed design where the rows need none.
"""

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from plan_strategies import DEVICES, ELEMENT_SIZES, row_counts, row_lengths

from ops.blocks.alignment import frame_run
from ops.blocks.sizes import cdiv, next_power_of_2
from ops.norms.plan import (
    FRAMED_ROWS,
    HELD_ROWS,
    LONG_ROWS,
    NO_ROWS,
    SHORT_ROWS,
    TUNING,
    Meta,
    choose_backward_plan,
    choose_forward_plan,
)

N_COLS = row_lengths(0, 20, segments=(512, 1024, 2048))
N_ROWS = row_counts(0)
SETTINGS = settings(max_examples=400, derandomize=True, database=None, deadline=None)


def _block_limit(limit: int, x_size: int, facts) -> int:
    """A block limit as plan.py reads it: halved for float64 on the GPU (two registers a value)."""
    return limit // 2 if facts.cuda and x_size == 8 else limit


@SETTINGS
@given(centered=st.booleans(), n_rows=N_ROWS, n_cols=N_COLS, sizes=ELEMENT_SIZES, facts=DEVICES)
def test_every_forward_plan_covers_its_rows(centered, n_rows, n_cols, sizes, facts):
    x_size = sizes[0]
    plan = choose_forward_plan(Meta(centered, n_rows, n_cols, x_size, facts=facts))
    if n_rows == 0 or n_cols == 0:
        assert plan.design == NO_ROWS
        return
    frame = frame_run(n_cols, 1, x_size)
    if plan.design == SHORT_ROWS:
        assert plan.block_n == next_power_of_2(n_cols)  # a whole row across
        assert plan.block_n <= _block_limit(TUNING.max_block[facts.kind], x_size, facts)
        assert plan.grid == (cdiv(n_rows, plan.block_m),) and plan.block_m & (plan.block_m - 1) == 0
        assert plan.frame == 0
        framed_max = dict(TUNING.framed_max_block[facts.kind]).get(x_size)
        assert not frame or framed_max is None or plan.block_n <= framed_max  # wider odd rows take the sweeps
    elif plan.design == FRAMED_ROWS:
        assert frame and plan.frame == frame  # only rows off 16-byte boundaries, in their runs
        assert plan.block_n == next_power_of_2(n_cols)  # a row's whole runs end before FRAME + n_cols
        assert plan.block_n <= _block_limit(TUNING.max_block[facts.kind], x_size, facts)
        assert (plan.skews * n_cols) % frame == 0 and plan.skews <= frame  # rows skews apart share a skew
        # program p takes rows p % skews + skews k: every class's rows, block_m a program
        assert plan.grid == (plan.skews * cdiv(cdiv(n_rows, plan.skews), plan.block_m),)
        assert plan.block_m & (plan.block_m - 1) == 0
    else:
        assert plan.design == LONG_ROWS and plan.grid == (n_rows,) and plan.block_m == 1
        assert plan.frame == frame  # framed exactly where rows start off 16-byte boundaries
        assert plan.block_n > 0 and plan.block_n & (plan.block_n - 1) == 0
    assert 1 <= plan.warps <= 32 and n_cols % plan.col_multiple == 0


@SETTINGS
@given(centered=st.booleans(), n_rows=N_ROWS, n_cols=N_COLS, sizes=ELEMENT_SIZES, facts=DEVICES)
def test_every_backward_plan_covers_its_rows_and_fits_its_grid(centered, n_rows, n_cols, sizes, facts):
    x_size, grad_size = sizes
    plan = choose_backward_plan(Meta(centered, n_rows, n_cols, x_size, grad_size, facts))
    if n_rows == 0 or n_cols == 0:
        assert plan.design == NO_ROWS
        return
    short = next_power_of_2(n_cols) <= _block_limit(TUNING.max_block_backward[facts.kind], x_size, facts)
    frame = frame_run(n_cols, 1, x_size, grad_size)
    column_sum = plan.column_sum
    assert column_sum.blocks * column_sum.block_n >= n_cols  # the column sum covers every column
    assert 1 <= plan.partial_rows <= n_rows
    if plan.design == SHORT_ROWS:
        assert short and plan.block_n == next_power_of_2(n_cols)
        assert plan.grid == (plan.partial_rows,) and plan.partial_rows <= cdiv(n_rows, plan.block_m)
    elif plan.design == HELD_ROWS:
        _check_held(plan, centered, n_rows, n_cols, x_size, grad_size, facts, short, frame)
    else:
        assert plan.design == LONG_ROWS and not short
        n_groups, n_chunks = plan.grid
        assert plan.frame == frame  # rows off boundaries framed; the chunks cover a framed row's places
        assert n_chunks == cdiv(n_cols + max(frame - 1, 0), plan.block_n) and n_groups == plan.partial_rows
        if frame and n_groups < n_rows:  # a group's rows (g, g + n_groups, ...) share one skew
            assert (n_groups * n_cols) % frame == 0


def _check_held(plan, centered, n_rows, n_cols, x_size, grad_size, facts, short, frame):
    """A held plan: on the GPU, 16/32-bit only; its segments cover a row's places; a row's segments and
    the rows at once fit the setup's grid; framed rows a program takes share one skew; rows that fit a
    block are held only framed, by a rule of Tuning.held_short_rows."""
    held = plan.held
    assert facts.cuda and max(x_size, grad_size) in (2, 4) and held.frame in (0, frame)
    places = n_cols + max(held.frame - 1, 0)
    assert held.n_segments == cdiv(places, held.segment)
    assert held.setup.max_segments is None or held.n_segments <= held.setup.max_segments
    assert plan.grid == (held.rows_at_once * held.n_segments,) and plan.partial_rows == held.rows_at_once
    assert plan.grid[0] <= held.setup.programs(facts) and 1 <= held.rows_at_once <= n_rows
    assert held.words == (2 if centered else 1) * held.n_segments
    if held.frame and held.rows_at_once < n_rows:
        assert held.rows_at_once % (held.frame // math.gcd(n_cols, held.frame)) == 0
    if short:
        assert held.frame
        block = next_power_of_2(n_cols)
        assert any(
            (rule.centered, rule.element_size) == (centered, max(x_size, grad_size))
            and block in rule.blocks
            and n_rows >= rule.min_rows
            for rule in TUNING.held_short_rows
        )
