"""softmax against a float64 reference: every design, dtypes, dims, odd shapes, empties, gradients.

Each test runs on the CPU (the Triton kernels through the interpreter, small
sizes) and on CUDA (compiled kernels, realistic sizes; marked `gpu`).  Tests
that reach a design with small tensors call the op's Python entry points with a
smaller Tuning (ops/softmax/plan.py); the plan rules are tested on Meta built
for an H100 (ops.runtime.H100), so they run on any machine.
"""

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
import tuned as tuned_ops
from ptx_checks import assert_publishes_without_release, assert_waits_for_the_fill_before_the_scratch, build_for_hopper
from reference import DEVICES, DTYPES, TOLERANCE, assert_close, leaf64, rel_error, strided_versions

from ops.blocks.alignment import frame_run
from ops.blocks.held_rows import UNPUBLISHED, unpublished_words, words_block
from ops.blocks.sizes import cdiv, next_power_of_2
from ops.runtime import H100, H200, INTERPRETER, DeviceFacts
from ops.runtime.direct import run_direct
from ops.softmax import launch as softmax_launch, op as softmax_op
from ops.softmax.plan import (
    BACKWARD,
    FORWARD,
    LAGGED,
    PUBLISH_THEN_WAIT,
    STAGED,
    STAGED_AHEAD,
    TUNING,
    BlockPlan,
    HeldPlan,
    LoopedPlan,
    Meta,
    Rows,
    SplitPlan,
    choose_plan,
)


def pick(device, cpu, cuda):
    return cuda if device == "cuda" else cpu


# -------------------------------------------------------------------- softmax


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_matches_float64_on_every_dim(device, dtype):
    cases = pick(
        device,
        [((37, 129), -1), ((37, 129), 0), ((5, 7, 11), 1), ((5, 7, 11), -3), ((1, 1), -1), ((), 0)],
        [((4096, 16384), -1), ((4097, 1000), 0), ((65, 3001, 7), 1), ((8, 1000, 999), -1)],
    )
    for shape, dim in cases:
        x = 4 * torch.randn(shape, device=device, dtype=dtype)
        for layout, view in strided_versions(x):
            y = torch.ops.tk.softmax(view, dim)
            assert_close(y, torch.softmax(view.double(), dim), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n_cols", [16385, 32769, 70_001, 262_144, 1_048_576])
def test_softmax_rows_longer_than_a_block(device, n_cols):
    for dtype in [torch.float32, torch.bfloat16]:
        x = 4 * torch.randn(pick(device, 2, 64), n_cols, device=device, dtype=dtype)
        assert_close(torch.ops.tk.softmax(x, -1), torch.softmax(x.double(), -1), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n_cols", [100, 70_001])  # one block, and the online kernel
def test_softmax_is_numerically_stable(device, n_cols):
    x = torch.randn(5, n_cols, device=device)
    x[0] = -float("inf")  # a row of -inf: NaN, as in torch.softmax
    x[1, : n_cols // 2] = -float("inf")  # -inf first: the online sum must not turn NaN
    x[2] = x[2] * 1e30  # huge values: no overflow
    x[3, 7] = 1e38
    x[4] = x[4].to(torch.bfloat16).float() * 3e38  # near the float32 limit
    torch.testing.assert_close(torch.ops.tk.softmax(x, -1), torch.softmax(x, -1), equal_nan=True)
    big = (torch.randn(3, n_cols, device=device) * 1e4).to(torch.bfloat16)
    assert_close(torch.ops.tk.softmax(big, -1), torch.softmax(big.double(), -1), torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_cols", [129, 20_000, 40_000, 70_001])  # past 32768: rows held across programs on CUDA
def test_softmax_backward_matches_pytorch(device, dtype, n_cols):
    x = 3 * torch.randn(pick(device, 3, 512), n_cols, device=device, dtype=dtype)
    for dim in [-1, 0] if n_cols < 1000 or device == "cuda" else [-1]:  # dim 0: one program per column
        grad = torch.randn_like(x)
        x_tk = x.clone().requires_grad_()
        torch.ops.tk.softmax(x_tk, dim).backward(grad)
        x64 = leaf64(x)
        torch.softmax(x64, dim).backward(grad.double())
        assert_close(x_tk.grad, x64.grad, dtype, scale=2)


def test_softmax_gradcheck():
    x = torch.randn(4, 6, 5, dtype=torch.float64, requires_grad=True)
    for dim in [0, 1, -1]:
        assert torch.autograd.gradcheck(lambda t: torch.ops.tk.softmax(t, dim), (x,), fast_mode=True)


@pytest.mark.parametrize("device", DEVICES)
def test_softmax_of_empty(device):
    for shape in [(0, 5), (5, 0), (0,)]:
        assert torch.ops.tk.softmax(torch.empty(shape, device=device), -1).shape == shape


# ------------------------------------------------ softmax with a dtype argument
#
# torch.softmax(x, dim, dtype) casts x to dtype first and computes in it.  tk
# does the same, except for a 16-bit x with dtype float32 (what autocast runs
# on CUDA): the kernels read x as it is, which gives the same numbers, and the
# backward writes dx in x's dtype from float32 grad and y.


def check_softmax_with_dtype(softmax, x, dim, dtype, scale=2.0):
    """softmax(x, dim, dtype) and its gradient against float64 of the same definition:
    dtypes as torch.softmax gives them, values within the tolerance of the narrower dtype."""
    want = torch.softmax(torch.empty(0, dtype=x.dtype), -1, dtype=dtype).dtype
    narrower = max((x.dtype, want), key=TOLERANCE.get)
    x_tk = x.clone().requires_grad_()
    y = softmax(x_tk, dim, dtype)
    assert y.dtype == want
    x64 = leaf64(x.to(want))  # the values softmax works on, as float64
    y64 = torch.softmax(x64, dim)
    assert_close(y, y64, want)
    grad = torch.randn_like(y)
    y.backward(grad)
    y64.backward(grad.double())
    assert x_tk.grad.dtype == x.dtype
    assert rel_error(x_tk.grad, x64.grad) <= scale * TOLERANCE[narrower], narrower


WITH_DTYPE = [  # x's dtype, the dtype asked for
    (torch.bfloat16, torch.float32),  # read as it is
    (torch.float16, torch.float32),  # read as it is
    (torch.float32, torch.bfloat16),  # cast first, as torch.softmax
    (torch.bfloat16, torch.float16),
    (torch.float16, torch.float64),
    (torch.float32, torch.float32),  # the dtype x has: as without one
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_dtype, dtype", WITH_DTYPE)
def test_softmax_with_a_dtype_matches_float64(device, x_dtype, dtype):
    cases = pick(
        device,
        [((37, 129), -1), ((5, 7, 11), 1), ((2, 70_001), -1)],
        [((1024, 16384), -1), ((65, 3001, 7), 1), ((300, 70_001), -1), ((3, (1 << 20) + 3), -1)],
    )
    for shape, dim in cases:
        x = (4 * torch.randn(shape, device=device)).to(x_dtype)
        for layout, view in strided_versions(x):
            if layout == "contiguous" or shape[0] < 100:
                check_softmax_with_dtype(torch.ops.tk.softmax, view, dim, dtype)

def test_softmax_reads_a_16bit_x_as_it_is_for_a_float32_result():
    """No float32 copy of x: the kernels get the 16-bit x and a float32 y."""
    seen = []
    run = softmax_op.run
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(softmax_op, "run", lambda plan, tensors: (seen.append(tensors), run(plan, tensors)))
        x = torch.randn(3, 40, dtype=torch.bfloat16)
        y = torch.ops.tk.softmax(x, -1, torch.float32)
        torch.ops.tk.softmax(x.float(), -1, torch.bfloat16)
    assert [t.dtype for t in seen[0]] == [torch.bfloat16, torch.float32] and seen[0][0].data_ptr() == x.data_ptr()
    assert [t.dtype for t in seen[1]] == [torch.bfloat16, torch.bfloat16]  # float32 x: cast first
    torch.testing.assert_close(y, torch.softmax(x, -1, dtype=torch.float32), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("x_dtype, dtype", [(torch.bfloat16, torch.float32), (torch.float32, torch.float16)])
def test_softmax_with_a_dtype_in_every_design(launched, x_dtype, dtype):
    """Every design writes its result in a dtype other than its inputs'.  Rows held on chip take
    the design of the widest dtype: a 16-bit x with a float32 y, the float32 kernels both ways."""
    held = "lagged" if dtype == torch.float32 else "publish_then_wait"  # a float32 x is cast to float16 first
    # Rows of 96 start on 16-byte boundaries: the 16-bit forward keeps its own design (framed rows: lagged).
    for shape, design in [((37, 10), "single"), ((9, 70), "looped"), ((3, 120), "split"), ((5, 96), held)]:
        launched.clear()
        softmax = tuned(replace(SMALL, cpu_held_rows=design == held))
        check_softmax_with_dtype(softmax, (4 * torch.randn(shape)).to(x_dtype), -1, dtype)
        assert launched == DESIGN_KERNELS[design], (shape, launched)



@pytest.mark.parametrize("device", DEVICES)
def test_softmax_with_a_dtype_of_empty_and_under_compile(device):
    for shape in [(0, 5), (5, 0)]:
        y = torch.ops.tk.softmax(torch.empty(shape, device=device, dtype=torch.bfloat16), -1, torch.float32)
        assert y.shape == shape and y.dtype == torch.float32
    compiled = torch.compile(lambda t: torch.ops.tk.softmax(t, -1, dtype=torch.float32), fullgraph=True)
    torch._dynamo.reset()
    x = (4 * torch.randn(pick(device, 4, 512), pick(device, 300, 70_001), device=device)).to(torch.bfloat16)
    check_softmax_with_dtype(lambda t, dim, dtype: compiled(t), x, -1, torch.float32)


def test_softmax_with_a_dtype_passes_opcheck():
    for x, dtype in [(torch.randn(5, 33, dtype=torch.float16), torch.float32), (torch.randn(4, 9), torch.bfloat16)]:
        torch.library.opcheck(torch.ops.tk.softmax.default, (x, -1, dtype))
        torch.library.opcheck(torch.ops.tk.softmax.default, (x.requires_grad_(), 0, dtype))
    grad, y = torch.randn(3, 20), torch.softmax(torch.randn(3, 20), -1)
    torch.library.opcheck(torch.ops.tk.softmax_backward.default, (grad, y, -1, torch.bfloat16))


# ------------------------------------------------ softmax: the designs and their plan
#
# SMALL shrinks the CPU constants so that rows of a few hundred columns take
# every design: blocks of at most 64 columns, chunks of 16, segments of at least
# 32, and about 8 programs; short rows stacked into tiles of up to 256 elements.
# `launched` records which kernels ran, so that each test checks it reached the
# design it means to test.

SMALL = replace(TUNING, cpu_max_block=64, cpu_chunk=16, min_segment_chunks=2, cpu_programs=8, cpu_row_tile=256)
# Rows held across programs on CPU too (segments of 32 columns, 8 programs).  The
# interpreter runs programs one at a time, so each computes its row's partials
# itself: the path a GPU program takes when the others do not come.
SMALL_HELD = replace(SMALL, cpu_held_rows=True)


def tuned(tuning):
    """softmax(x, dim, dtype=None) planned with `tuning`'s constants, forward and backward (tests/tuned.py)."""
    return tuned_ops.softmax(tuning)


def kernel_name(kernel) -> str:
    """A kernel's name, through the wrappers around it (a register cap's autotuner, a JIT function)."""
    while hasattr(kernel, "fn"):
        kernel = kernel.fn
    return kernel.__name__


@pytest.fixture
def launched(monkeypatch):
    """The names of the softmax kernels launched, in order (launch.py's launcher spied on;
    the scratch fills, launched by ops/blocks/held_rows.py, are not listed).  Taking
    monkeypatch also keeps the native lane out, so every call runs the body."""
    names = []
    launch = softmax_launch.launcher

    def spy(kernel, like):
        names.append(kernel_name(kernel))
        return launch(kernel, like)

    monkeypatch.setattr(softmax_launch, "launcher", spy)
    return names


def eagerly(fn, *args, **kwargs):
    """fn(*args, **kwargs) run as an eager call of a tk op runs its body: kernels launched
    directly, so the plan may take the designs of eager launches (the Gluon forwards, a
    kernel that starts while its scratch fill runs)."""
    return run_direct(fn, args, kwargs)


def replanned(direction, inputs, dim, **changes):
    """The output of an eager call over contiguous `inputs` ((x,) forward, (dy, y) backward)
    along `dim`, launched with the plan it gets changed by `changes` (dataclasses.replace)."""
    out = torch.empty_like(inputs[-1])
    dim = dim % out.dim()
    n_cols, inner = out.shape[dim], math.prod(out.shape[dim + 1 :])
    tensors = (*inputs, out)

    def body():
        plan = choose_plan(softmax_op.describe(direction, tensors, n_cols, inner))
        softmax_launch.run(replace(plan, **changes), tensors)

    run_direct(body, (), {})
    return out


DESIGN_KERNELS = {  # forward, then backward
    "single": ["softmax_forward_kernel", "softmax_backward_kernel"],
    "looped": ["softmax_forward_online_kernel", "softmax_backward_looped_kernel"],
    "split": [
        "softmax_partial_stats_kernel",
        "softmax_normalize_segments_kernel",
        "softmax_backward_partial_dot_kernel",
        "softmax_backward_segments_kernel",
    ],
    "publish_then_wait": ["softmax_forward_held_kernel", "softmax_backward_lagged_kernel"],  # 16-bit rows
    "lagged": ["softmax_forward_lagged_kernel", "softmax_backward_lagged_kernel"],  # float32 rows
    "staged": ["softmax_forward_staged_kernel", "softmax_backward_lagged_kernel"],  # the Gluon forward
    "staged_ahead": ["softmax_forward_staged_ahead_kernel", "softmax_backward_lagged_kernel"],  # its longest rows
}


def framed(dtype, shape, dim=-1) -> bool:
    """Whether rows of `shape` along `dim` start off 16-byte boundaries (the held kernels frame them)."""
    inner = math.prod(shape[dim % len(shape) + 1 :])
    return bool(frame_run(shape[dim], inner, torch.empty((), dtype=dtype).element_size()))


def held_design(dtype, shape=None, dim=-1) -> str:
    """The design of rows held on chip across programs, by dtype (float64 has none); the 16-bit forward
    of framed rows is lagged too."""
    if dtype == torch.float32 or (shape is not None and framed(dtype, shape, dim)):
        return "lagged"
    return "publish_then_wait"


def staged_forward_here() -> bool:
    """Whether eager forwards of long, aligned rows take the Gluon kernel on this GPU (see ops/softmax/gluon.py)."""
    return softmax_launch.HAS_GLUON and torch.cuda.get_device_capability()[0] >= 9


def staged_design(n_cols: int) -> str:
    """Which Gluon forward an aligned row of 16-bit x and y takes: past ahead_past_segments
    segments of the staged kernel's, the one publishing ahead."""
    return "staged_ahead" if n_cols > TUNING.ahead_past_segments * TUNING.staged.setup.segment else "staged"


def h100_plan(n_rows, n_cols, element_size=2, direction=FORWARD, tuning=TUNING, **context):
    """The plan of rows along the last dim, inputs and output of one element size, on an H100."""
    meta = Meta(direction, n_rows, n_cols, 1, element_size, element_size, H100, **context)
    return choose_plan(meta, tuning)


def test_softmax_short_rows_rule():
    """Short rows stack into tiles of up to row_tile elements, but the grid keeps
    the target of programs (4 an SM); long rows keep a program each."""
    assert TUNING.row_tile == 1024 and TUNING.programs_per_sm == 4  # the numbers below follow from them

    def rows(n_rows, n_cols):
        plan = h100_plan(n_rows, n_cols)
        assert isinstance(plan, BlockPlan) and plan.block_n == next_power_of_2(n_cols)
        return plan.block_m

    assert rows(65536, 128) == 8  # the tile: 8192 programs, where one row each ran 65536
    assert rows(16384, 64) == 16
    assert rows(4096, 128) == 4  # 1024 programs: 8 rows would leave 512
    assert rows(4096, 512) == 2
    assert rows(1000, 100) == rows(300, 1000) == rows(1, 2) == 1  # too few rows to stack
    assert rows(4096, 1024) == rows(4096, 16384) == 1
    for n_rows in [1, 3, 100, 4096, 10**6]:
        for n_cols in [1, 7, 128, 1000, 5000]:
            plan = h100_plan(n_rows, n_cols)
            per_program, block = plan.block_m, plan.block_n
            assert per_program & (per_program - 1) == 0  # a power of two: a tl.arange length
            assert per_program * block <= max(1024, block)
            assert per_program == 1 or n_rows // per_program >= 528
            assert plan.grid == (math.ceil(n_rows / per_program),)


def test_softmax_split_rule():
    """Rows past a block, read twice: cut into segments while too few rows would fill the GPU."""
    read_twice = replace(TUNING, held_rows=False)  # as float64 rows, and rows too long to hold, are
    assert TUNING.chunk == 16384  # the numbers below follow from it

    def split(n_rows, n_cols, facts=H100, tuning=read_twice):
        plan = choose_plan(Meta(FORWARD, n_rows, n_cols, 1, 2, 2, facts), tuning)
        if isinstance(plan, LoopedPlan):
            return 1, None
        assert isinstance(plan, SplitPlan) and plan.grid == (n_rows, plan.n_segments)
        return plan.n_segments, plan.segment_len

    assert split(64, 1 << 20) == (8, 131072)  # 9 wanted (528 programs); whole chunks leave 8
    assert split(256, 262144) == (3, 98304)
    assert split(1, 1 << 20) == (16, 65536)  # no segment below 4 chunks
    assert split(1024, 65536)[0] == 1  # enough rows: one program per row
    assert split(4, 40000)[0] == 1  # too short to split
    assert split(2, 1 << 20, INTERPRETER) == (4, 262144)
    float64 = choose_plan(Meta(FORWARD, 64, 1 << 20, 1, 8, 8, H100))  # no held design: split by default
    assert isinstance(float64, SplitPlan) and (float64.n_segments, float64.segment_len) == (8, 131072)
    shorter_block = replace(read_twice, max_block=16384)  # rows of 16385 columns past a block too
    for n_rows in [1, 3, 64, 600]:
        for n_cols in [16385, 65536, 100_003, 1 << 20]:
            plan = choose_plan(Meta(FORWARD, n_rows, n_cols, 1, 2, 2, H100), shorter_block)
            assert isinstance(plan, (LoopedPlan, SplitPlan)) and plan.chunk == 16384 and plan.warps == 32
            if isinstance(plan, SplitPlan):
                assert plan.segment_len % plan.chunk == 0  # whole chunks
                assert (plan.n_segments - 1) * plan.segment_len < n_cols <= plan.n_segments * plan.segment_len
                assert plan.segments_block >= plan.n_segments


def check_softmax_and_gradient(softmax, x, dim):
    """softmax(x, dim) and its gradient for a random upstream gradient, against
    float64; returns the output, that gradient and the input's gradient."""
    grad = torch.randn_like(x)
    x_tk = x.clone().requires_grad_()
    y = softmax(x_tk, dim)
    y.backward(grad)
    x64 = leaf64(x)
    y64 = torch.softmax(x64, dim)
    y64.backward(grad.double())
    assert_close(y, y64, x.dtype)
    assert_close(x_tk.grad, x64.grad, x.dtype, scale=2)
    return y.detach(), grad, x_tk.grad



@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_designs_match_float64(launched, dtype):
    cases = [
        ((3, 120), -1, "split"),  # segments of 48, 48 and 24 columns: the row ends inside a chunk
        ((2, 128), -1, "split"),  # 4 segments of 32 exactly
        ((1, 200), -1, "split"),  # one row: 5 segments, the last of 8 columns
        ((2, 100, 3), 1, "split"),  # a non-last dim, elements 3 apart: 2 segments, 64 and 36 columns
        ((9, 70), -1, "looped"),  # enough rows for one program each
        ((3, 50), -1, "single"),  # a row a program: too few rows for 8 programs of more
        ((37, 10), -1, "single"),  # tiles of 4 rows of 16 columns: the last tile holds one row
        ((40, 7, 3), 1, "single"),  # a non-last dim in tiles of 8 rows: elements 3 apart
        ((40, 1), -1, "single"),  # rows of one column, 4 a tile
    ]
    for shape, dim, design in cases:
        launched.clear()
        check_softmax_and_gradient(tuned(SMALL), (4 * torch.randn(shape)).to(dtype), dim)
        assert launched == DESIGN_KERNELS[design], shape


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_split_rows_with_minus_inf_and_extreme_values(launched, dtype):
    # 8 rows (7 in the backward) of 3 segments: columns [0, 80), [80, 160) and [160, 200).
    tuning = replace(SMALL, cpu_programs=21)
    x = torch.randn(8, 200, dtype=dtype)
    x[0] = -float("inf")  # all -inf: NaN, as in torch.softmax
    x[1, :80] = -float("inf")  # the first segment all -inf
    x[2, 80:160] = -float("inf")  # the middle one
    x[3, 160:] = -float("inf")  # the last one
    x[4, :170] = -float("inf")  # only a part of the last segment counts
    x[5] = x[5] * 1e30  # huge values: each segment's max far from the others'
    x[6, 150] = 1e38  # one value dominates
    x[7] = x[7] - 1e4  # far below 0: a padding lane of the partials must not count as 0
    y = softmax_op.forward(x, -1, tuning=tuning)
    torch.testing.assert_close(y, torch.softmax(x, -1), equal_nan=True)
    assert y[0].isnan().all() and not y[1:].isnan().any()
    grad, y = torch.randn_like(x[1:]), y[1:]
    dx = softmax_op.backward(grad, y, -1, tuning=tuning)
    y64 = y.double()
    assert_close(dx, y64 * (grad - (grad * y64).sum(-1, keepdim=True)), dtype)
    assert launched == DESIGN_KERNELS["split"]


def test_softmax_split_gradcheck(launched):
    for shape, dim in [((2, 100), -1), ((100, 2), 0)]:  # 3 segments: 48, 48 and 4 columns
        x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda t: tuned(SMALL)(t, dim), (x,), fast_mode=True)
    assert set(launched) == set(DESIGN_KERNELS["split"])


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_held_rows_match_float64(launched, dtype):
    cases = [  # 8 programs, segments of 32 columns
        ((5, 100), -1),  # 4 segments, the last short; 2 rows a round, 3 rounds (16-bit rows: framed)
        ((3, 256), -1),  # 8 segments exactly: one row a round
        ((1, 249), -1),  # one row; framed, its span (249 + 7 or + 3) still 8 segments
        ((9, 101), -1),  # framed in every dtype but float64: rows start at every skew of a 16-byte run
        ((2, 100, 3), 1),  # a non-last dim, elements 3 apart
        ((7, 65), -1),  # 3 segments, the last of one column; 2 rows a round, the last round 1
    ]
    for shape, dim in cases:
        launched.clear()
        check_softmax_and_gradient(tuned(SMALL_HELD), (4 * torch.randn(shape)).to(dtype), dim)
        if dtype == torch.float64:  # no float64 design: rows read twice, split or one program a row
            assert launched in (DESIGN_KERNELS["split"], DESIGN_KERNELS["looped"]), (shape, launched)
        else:
            assert launched == DESIGN_KERNELS[held_design(dtype, shape, dim)], (shape, launched)


def test_softmax_held_rows_with_minus_inf_and_extreme_values(launched):
    x = torch.randn(8, 100)  # segments [0, 32), [32, 64), [64, 96), [96, 100)
    x[0] = -float("inf")  # all -inf: NaN, as in torch.softmax
    x[1, :32] = -float("inf")  # a whole segment -inf
    x[2, 96:] = -float("inf")  # the short last one
    x[3, :98] = -float("inf")  # only a part of the last segment counts
    x[4] = x[4] * 1e30  # each segment's max far from the others'
    x[5, 50] = 1e38  # one value dominates
    x[6] = x[6] - 1e4  # far below 0: a padding lane of the partials must not count as 0
    x[7, :32], x[7, 32:] = -float("inf"), x[7, 32:] - 1e4  # exp(0 - row max) of the -inf segment overflows
    y = softmax_op.forward(x, -1, tuning=SMALL_HELD)
    torch.testing.assert_close(y, torch.softmax(x, -1), equal_nan=True)
    assert y[0].isnan().all() and not y[1:].isnan().any()
    assert launched == DESIGN_KERNELS["lagged"][:1]


def triton_held_design(direction, element_size, n_cols=None):
    """Tuning's held design in Triton for a direction and the widest element size (and rows of n_cols
    along the last dim: the 16-bit forward of framed rows has its own)."""
    forward = direction == FORWARD
    if element_size == 2:
        if forward and n_cols is not None and frame_run(n_cols, 1, element_size):
            return TUNING.forward_16bit_framed
        return TUNING.forward_16bit if forward else TUNING.backward_16bit
    return TUNING.forward_float32 if forward else TUNING.backward_float32


def _held_twice(direction, tensors, n_cols, load_next):
    """Launch a held plan on CPU twice over the same scratch: first no program
    waits (each computes and publishes; the last of a row finds the others'
    words), then every program finds all words of its rows published and
    combines those.  Both outputs, and the words the first launch published."""
    n_rows = tensors[-1].numel() // n_cols
    meta = Meta(direction, n_rows, n_cols, 1, tensors[0].element_size(), tensors[-1].element_size(), INTERPRETER)
    plan = choose_plan(meta, SMALL_HELD)
    assert isinstance(plan, HeldPlan) and plan.segment == SMALL_HELD.cpu_segment
    assert (plan.load_next is None) == (load_next is None)
    if load_next is not None:
        plan = replace(plan, load_next=load_next)
    words = unpublished_words(tensors[-1], n_rows, plan.n_segments)
    outputs, published = [], None
    for max_spins in (0, 1):
        tensors[-1].fill_(float("nan"))
        softmax_launch.launch_held(replace(plan, max_spins=max_spins), tensors, words, {"OVERLAPPED": False})
        outputs.append(tensors[-1].clone())
        published = words.clone() if published is None else published
    assert torch.equal(words, published)  # the second launch published the same words again
    return outputs, published


def _same_bits(a, b):
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))  # NaN included


def _unpacked(words):
    """A scratch of words as (upper, lower) float32 halves."""
    halves = words.view(torch.int32).view(*words.shape, 2).view(torch.float32)
    return halves[..., 1], halves[..., 0]  # little-endian: the lower half first



LOAD_PLACES = ("before_partial", "during_wait")  # the 16-bit forward's (the lagged kernels take none)


def _load_places(direction, dtype, n_cols):
    """The load places to try for a direction's design: one run (no place) for a lagged kernel."""
    design = triton_held_design(direction, torch.empty((), dtype=dtype).element_size(), n_cols)
    return (None,) if design.family == LAGGED else LOAD_PLACES


def _in_segments(values, padding, element_size):
    """Rows as the held kernels cut them on CPU (segments of cpu_segment columns), padded before and
    after: rows off 16-byte boundaries (16-bit rows of 100: 200 bytes, one row in two) counted in a
    frame from the boundary at or before each row (frame_run), their span n_cols + run - 1."""
    segment, n_rows, n_cols = SMALL_HELD.cpu_segment, *values.shape
    run = frame_run(n_cols, 1, element_size)
    n_segments = cdiv(n_cols + (run - 1 if run else 0), segment)
    rows = []
    for r in range(n_rows):
        skew = (r * n_cols) % run if run else 0
        rows.append(F.pad(values[r], (skew, n_segments * segment - skew - n_cols), value=padding))
    return torch.stack(rows).view(n_rows, n_segments, segment)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # the two designs of each direction
@pytest.mark.parametrize("n_cols", [100, 96])  # 16-bit rows of 100 are framed (the lagged forward), of 96 not
def test_softmax_held_published_partials_give_the_same_bits(dtype, n_cols):
    """The path a GPU takes when all programs run at once (partials read from the
    scratch) and the one it takes when they do not (computed here): same bits,
    wherever the next round's loads are issued, and whether a program publishes
    a round ahead (float32 forwards, every backward).  The words hold each
    segment's (max, sum of exp(x - max)), and for the backward its sum(dy * y)."""
    x = (4 * torch.randn(5, n_cols)).to(dtype)
    x[2, 40:70] = float("nan")  # a NaN partial: its word must still count as published
    grad, y = torch.randn(5, n_cols).to(dtype), torch.softmax(x, -1)
    forward, backward = [], []
    for load_next in _load_places(FORWARD, dtype, n_cols):
        outputs, forward_words = _held_twice(FORWARD, (x, torch.empty_like(x)), n_cols, load_next)
        forward += outputs
    for load_next in _load_places(BACKWARD, dtype, n_cols):
        outputs, backward_words = _held_twice(BACKWARD, (grad, y, torch.empty_like(y)), n_cols, load_next)
        backward += outputs
    assert all(_same_bits(out, forward[0]) for out in forward[1:])
    assert all(_same_bits(out, backward[0]) for out in backward[1:])
    finite = [0, 1, 3, 4]  # rows without the NaN: those of row 2 are all NaN, as in PyTorch
    assert forward[0][2].isnan().all() and backward[0][2].isnan().all()
    assert_close(forward[0][finite], torch.softmax(x.double(), -1)[finite], dtype)
    y64, grad64 = y.double()[finite], grad.double()[finite]
    assert_close(backward[0][finite], y64 * (grad64 - (grad64 * y64).sum(-1, keepdim=True)), dtype)

    # Every word published, and it holds its segment's partial (segments of cpu_segment columns).
    assert (forward_words != UNPUBLISHED.value).all()
    assert (backward_words != UNPUBLISHED.value).all()
    padded = _in_segments(x.double(), -float("inf"), x.element_size())
    segment_max = padded.amax(-1)
    word_max, word_sum = _unpacked(forward_words)
    torch.testing.assert_close(word_max[finite].double(), segment_max[finite])
    torch.testing.assert_close(word_sum[finite].double(), (padded - segment_max[..., None]).exp().sum(-1)[finite])
    assert word_sum[2, 1:3].isnan().all()  # the segments with NaN: their sum, then their row, are NaN
    _, word_dot = _unpacked(backward_words)
    dots = _in_segments(grad.double() * y.double(), 0.0, y.element_size()).sum(-1)
    torch.testing.assert_close(word_dot[finite].double(), dots[finite], rtol=1e-2, atol=1e-3)


def test_softmax_held_next_load_rule():
    """The 16-bit forward loads the next round before the partial in rows of up to
    32 segments, during the wait in longer ones; the other designs publish a round ahead."""

    def load_next(n_segments, element_size=2, direction=FORWARD):
        plan = h100_plan(3, n_segments * 8192, element_size, direction)
        assert isinstance(plan, HeldPlan) and plan.n_segments == n_segments * 8192 // plan.segment
        return plan.load_next

    assert [load_next(n) for n in (5, 8, 32, 33, 128)] == ["before_partial"] * 3 + ["during_wait"] * 2
    assert load_next(8, 4) is load_next(8, 2, BACKWARD) is load_next(8, 4, BACKWARD) is None
    assert TUNING.forward_16bit.family == PUBLISH_THEN_WAIT
    assert TUNING.forward_float32.family == TUNING.backward_16bit.family == TUNING.backward_float32.family == LAGGED


def test_softmax_held_rule():
    """The grid is what the GPU runs at once; the rows are spread evenly over rounds."""
    assert H100.resident_programs_per_sm(8, 80) == 3  # 65536 registers // (80 * 256)
    assert H100.resident_programs_per_sm(8, 128) == 2
    assert H100.resident_programs_per_sm(2, 32) == 32  # the thread limit: 2048 // 64
    # One-warp programs: the warps that fit, rounded down to a multiple of 4 (measured on an H100:
    # at 144 and 120 registers, plans of 14 and 17 an SM left rows waiting on programs never run).
    one_warp = [H100.resident_programs_per_sm(1, r) for r in (96, 120, 128, 144, 160, 80, 72)]
    assert one_warp == [20, 16, 16, 12, 12, 24, 28]
    assert H100.resident_programs_per_sm(1, 140) == 12  # 140 registers are given as 144 (units of 256 a warp)
    assert H100.resident_programs_per_sm(2, 144) == 6
    bf16, fp32 = TUNING.forward_16bit.setup, TUNING.forward_float32.setup
    backward_fp32 = TUNING.backward_float32.setup
    assert (bf16.segment, fp32.segment, backward_fp32.segment) == (8192, 4096, 2048)  # the numbers below follow

    def held(n_rows, n_cols, element_size=2, direction=FORWARD, **context):
        plan = h100_plan(n_rows, n_cols, element_size, direction, **context)
        return (plan.n_segments, plan.rows_at_once) if isinstance(plan, HeldPlan) else None

    assert held(1024, 65536) == (8, 49)  # 396 programs: 21 rounds of 49 rows
    assert held(1024, 65536, 4) == (16, 32)  # 528 programs: 32 rounds of 32
    assert held(1024, 40000, 2, BACKWARD) == (10, 52)  # 528 // 10 rows, 20 rounds
    assert held(1024, 40000, 4, BACKWARD) == (20, 32)  # 660 programs (5 an SM)
    assert held(64, 1 << 20) == (128, 3)  # 3 rows at once: 22 rounds
    assert held(5, 40000, 4) == (10, 5)  # fewer rows than the grid holds
    assert held(8, 396 * 8192) == (396, 1)  # the longest row held
    assert held(8, 396 * 8192 + 1) is None  # longer: split rows
    assert isinstance(h100_plan(8, 396 * 8192 + 1), SplitPlan)
    assert held(8, 1 << 20, 8) is None  # float64 keeps the other designs
    assert held(8, 1 << 20, tuning=replace(TUNING, held_rows=False)) is None  # held rows off
    off_on_cpu = choose_plan(Meta(FORWARD, 8, 1 << 20, 1, 2, 2, INTERPRETER))
    assert not isinstance(off_on_cpu, HeldPlan)  # off on CPU
    assert H100.resident_programs_per_sm(8, 64, 32768) == 4  # registers bind: 65536 // (64 * 256)
    assert H100.resident_programs_per_sm(8, 64, 65536) == 3  # shared memory binds: 233472 // (65536 + 1024)
    # A row's words: one copy a thread at least (8 warps: 256 lanes), a power of two.
    assert [words_block(bf16.warps, n) for n in (1, 5, 256, 257, 396)] == [256, 256, 256, 512, 512]
    # The whole plan of one call: every launch argument the held kernel gets.
    assert h100_plan(1024, 65536, overlap_fill=True) == HeldPlan(
        FORWARD, Rows(1024, 65536, 1, col_multiple=16), PUBLISH_THEN_WAIT, segment=8192,
        warps=8, registers=80, n_segments=8, rows_at_once=49, segments_block=256, max_spins=1 << 16,
        overlapped=True, load_next="before_partial",
    )  # fmt: skip
    # The Gluon forwards, 16-bit only: 4 an SM staged, 8 an SM for the one publishing ahead.
    eager_aligned = {"eager": True, "aligned": True, "gluon": True}
    staged = h100_plan(1024, 65536, **eager_aligned)
    assert staged.family == STAGED and (staged.n_segments, staged.rows_at_once) == (8, 64)  # 528 programs
    assert (staged.stages, staged.vec, staged.registers, staged.full) == (2, 8, 64, None)
    ahead = h100_plan(64, 1 << 20, **eager_aligned)  # 1056 programs, 4 rows of 256 segments at once
    assert ahead.family == STAGED_AHEAD and (ahead.n_segments, ahead.rows_at_once) == (256, 4)
    assert (ahead.stages, ahead.full) == (3, True) and h100_plan(64, (1 << 20) + 16, **eager_aligned).full is False


def test_softmax_rule_by_block_fill():
    """Rows that fit a block, on a GPU (Tuning.backward_float32_max_block, backward_sparse_fill,
    forward_float32_reload_warps): backward float32 rows past 16384 columns held in segments of 2048;
    backward 16-bit rows that fill at most 7/8 of a block of 8192 or 16384 reloaded, one chunk of the
    block, of 32768 held in segments of 2048 on 2 warps; float32 forwards of a block of 16384 reloaded;
    the rest in the block.  The rule reads sizes only: an H100's plans are an H200's."""

    def design(n_cols, element_size=2, direction=BACKWARD, facts=H200):
        plan = choose_plan(Meta(direction, 4095, n_cols, 1, element_size, element_size, facts))
        if isinstance(plan, LoopedPlan):
            assert plan.chunk == next_power_of_2(n_cols)  # one chunk: the row read twice, once each pass
            return ("reload", plan.warps)
        if isinstance(plan, HeldPlan):
            return ("held", plan.segment, plan.warps)
        assert isinstance(plan, BlockPlan)
        return ("block", plan.warps)

    assert [design(n) for n in (4096, 4608, 5120, 7168, 7169, 8192)] == [
        ("block", 8), ("reload", 16), ("reload", 16), ("reload", 16), ("block", 16), ("block", 16)
    ]  # fmt: skip
    assert [design(n) for n in (8193, 11008, 14336, 14337, 16384)] == [
        ("reload", 8), ("reload", 8), ("reload", 8), ("block", 32), ("block", 32)
    ]  # fmt: skip
    assert [design(n) for n in (16385, 20480, 28672, 28673, 32000, 32768)] == [
        ("held", 2048, 2), ("held", 2048, 2), ("held", 2048, 2), ("block", 32), ("block", 32), ("block", 32)
    ]  # fmt: skip
    assert design(40000) == ("held", 4096, 4)  # past a block: the 16-bit backward's own setup
    assert [design(n, 4) for n in (11008, 16384, 16385, 32768)] == [
        ("block", 32), ("block", 32), ("held", 2048, 4), ("held", 2048, 4)
    ]  # fmt: skip
    assert [design(n, 2, FORWARD) for n in (5120, 11008, 20480)] == [("block", 16), ("block", 32), ("block", 32)]
    assert [design(n, 4, FORWARD) for n in (8192, 8193, 16384, 16385, 32768)] == [
        ("block", 16), ("reload", 16), ("reload", 16), ("block", 32), ("block", 32)
    ]  # fmt: skip
    to_float32 = choose_plan(Meta(FORWARD, 4095, 11008, 1, 2, 4, H200))  # a 16-bit x, a float32 y: not measured
    assert isinstance(to_float32, BlockPlan)
    assert design(11008, facts=H100) == ("reload", 8) and design(20480, 4, facts=H100) == ("held", 2048, 4)
    assert design(11008, 8) == ("block", 32)  # float64: no held design, and its block was never measured
    cpu = choose_plan(Meta(BACKWARD, 4095, 11008, 1, 2, 2, INTERPRETER))
    assert isinstance(cpu, BlockPlan)  # the interpreter keeps its own rule
    held_off = replace(TUNING, held_rows=False)  # or a grid too small to hold the row: the block, not read twice
    for n_cols, size in ((20480, 2), (20480, 4)):
        assert isinstance(choose_plan(Meta(BACKWARD, 4095, n_cols, 1, size, size, H200), held_off), BlockPlan)
    one_sm = replace(H200, sm_count=1)  # 8 programs of 2048 columns at once: a row of 10 segments does not fit
    assert isinstance(choose_plan(Meta(BACKWARD, 4095, 20480, 1, 2, 2, one_sm)), BlockPlan)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_softmax_rows_that_fill_a_block_partly_on_the_gpu(launched, dtype):
    """The designs of rows that fit a block but take another (the rule's own test above): the reloading
    pass and the held rows, against float64, odd widths and row counts among them, a strided dim, and
    under torch.compile."""
    widths = [4609, 11008, 14336, 20001] if dtype != torch.float32 else [11008, 16385, 20480, 32000]
    for n_cols in widths:
        for shape, dim in [((37, n_cols), -1), ((3, n_cols, 2), 1)]:
            launched.clear()
            x = (4 * torch.randn(shape, device="cuda")).to(dtype)
            check_softmax_and_gradient(torch.ops.tk.softmax, x, dim)
            meta = Meta(FORWARD, x.numel() // n_cols, n_cols, 1, x.element_size(), x.element_size(), H200)
            forward, backward = choose_plan(meta), choose_plan(replace(meta, direction=BACKWARD))
            expected = [DESIGN_KERNELS[_design_name(forward)][0], DESIGN_KERNELS[_design_name(backward)][1]]
            assert launched == expected, (shape, launched, expected)
    compiled = torch.compile(lambda t, dim: torch.ops.tk.softmax(t, dim), fullgraph=True)
    check_softmax_and_gradient(compiled, (4 * torch.randn(65, widths[1], device="cuda")).to(dtype), -1)


def _design_name(plan) -> str:
    """The DESIGN_KERNELS key of a plan of rows along the last dim, as this test's plans are."""
    if isinstance(plan, HeldPlan):
        return plan.family
    return "single" if isinstance(plan, BlockPlan) else "looped"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_softmax_held_rows_on_the_gpu(launched, dtype):
    """Rows held across programs on the GPU: rows not cut evenly by segments, one
    row and many, a strided dim; the path that computes partials itself gives
    the same bits; and torch.compile launches the kernels too.  Rows along the
    last dim of a multiple of 16 columns take the Gluon forward on Hopper."""
    cases = [  # shape, dim, whether a multiple of 16 columns along the last dim
        ((300, 70001), -1, False),
        ((3, (1 << 20) + 3), -1, False),
        ((66000, 5), 0, False),
        ((1000, 66000), -1, True),
        ((500, 40000), -1, True),
        ((7, 5 * 8192 + 16), -1, True),  # fewer rows than a round holds
        ((21, 80 * 8192 + 16), -1, True),  # the Gluon forward that publishes ahead: 161 segments of 4096
        ((9, 1 << 20), -1, True),  # whole segments: the Gluon forward that publishes ahead drops its masks
    ]
    no_wait = replace(TUNING, max_spins=0)  # no program waits: each computes its row's partials
    for shape, dim, aligned in cases:
        launched.clear()
        x = (4 * torch.randn(shape, device="cuda")).to(dtype)
        y, grad, dx = check_softmax_and_gradient(torch.ops.tk.softmax, x, dim)
        design = held_design(dtype, shape, dim)
        if aligned and dtype != torch.float32 and staged_forward_here():
            design = staged_design(shape[-1])
        assert launched == DESIGN_KERNELS[design], (shape, launched)
        launched.clear()
        assert torch.equal(eagerly(softmax_op.forward, x, dim, tuning=no_wait), y)
        assert torch.equal(eagerly(softmax_op.backward, grad, y, dim, tuning=no_wait), dx)
        assert launched == DESIGN_KERNELS[design], (shape, launched)  # the same design, not waiting
        # Each kernel starts after its scratch fill ends (a held plan: `overlapped` is its field).
        assert torch.equal(replanned(FORWARD, (x,), dim, overlapped=False), y)
        assert torch.equal(replanned(BACKWARD, (grad, y), dim, overlapped=False), dx)
        if design == "publish_then_wait":  # the one kernel with a choice of where the next round's loads go
            for segments in (0, 1 << 30):  # issued at the other place: same bits
                loads_elsewhere = replace(TUNING, load_before_partial_segments=segments)
                assert torch.equal(eagerly(softmax_op.forward, x, dim, tuning=loads_elsewhere), y)
    compiled = torch.compile(lambda t, dim: torch.ops.tk.softmax(t, dim), fullgraph=True)
    launched.clear()
    check_softmax_and_gradient(compiled, (4 * torch.randn(64, 100_000, device="cuda")).to(dtype), -1)
    # Traced for Inductor: the forward on every compile; the backward's trace may come from Inductor's cache.
    assert launched[:1] == DESIGN_KERNELS[held_design(dtype)][:1], launched


@pytest.mark.gpu
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16])
def test_softmax_float32_result_of_long_16bit_rows_on_the_gpu(launched, x_dtype):
    """A 16-bit x with a float32 y, rows held across programs: the Gluon forward where the rows are
    aligned (it stages x), the lagged float32 kernels elsewhere and in every backward; values
    against float64, and the same bits when no program waits."""
    staged = staged_forward_here()
    for shape, aligned in [((500, 40000), True), ((64, 1 << 20), True), ((300, 70001), False)]:
        launched.clear()
        x = (4 * torch.randn(shape, device="cuda")).to(x_dtype)
        check_softmax_with_dtype(torch.ops.tk.softmax, x, -1, torch.float32)
        forward = "staged" if aligned and staged else "lagged"
        assert launched == [DESIGN_KERNELS[forward][0], DESIGN_KERNELS["lagged"][1]], (shape, launched)
        y = torch.ops.tk.softmax(x, -1, torch.float32)
        no_wait = replace(TUNING, max_spins=0)
        assert torch.equal(eagerly(softmax_op.forward, x, -1, torch.float32, tuning=no_wait), y)


A100 = DeviceFacts("cuda", sm_count=108, capability=(8, 0), shared_per_sm=167936)


def test_softmax_staged_forward_rule():
    """The Gluon forward applies to eager launches of 16-bit rows along the last
    dim, 16-byte aligned, on Hopper or newer, with a Triton that has Gluon; else a
    Triton kernel."""

    def family(direction=FORWARD, n_cols=65536, inner=1, size=2, y_size=None, facts=H100, **context):
        call = {"eager": True, "aligned": True, "gluon": True, **context}
        plan = choose_plan(Meta(direction, 64, n_cols, inner, size, y_size or size, facts, **call))
        return plan.family if isinstance(plan, HeldPlan) else None

    assert family() == STAGED
    assert family(y_size=4) == STAGED  # a float32 result of a 16-bit x: staged too
    # past 32 segments of 8192 columns: the kernel publishing ahead
    assert family(n_cols=32 * 8192) == STAGED
    assert family(n_cols=32 * 8192 + 16) == family(n_cols=1 << 21) == STAGED_AHEAD
    assert family(n_cols=1 << 20, y_size=4) == STAGED  # its stores were not waiting
    assert family(n_cols=(1 << 20) + 8) == family(n_cols=1 << 20, aligned=False) == PUBLISH_THEN_WAIT
    assert family(size=4) == LAGGED  # float32: the lagged Triton kernel
    assert family(size=4, y_size=2) == LAGGED  # (a float32 x is cast to a 16-bit dtype first: never launched)
    assert family(size=8) is None  # float64: no held design
    assert family(direction=BACKWARD) == LAGGED
    assert family(inner=3) == PUBLISH_THEN_WAIT  # softmax along a dim other than the last
    assert family(n_cols=65536 + 8) == PUBLISH_THEN_WAIT  # rows 16-byte aligned for bf16, but Triton specializes on 16
    assert family(aligned=False) == PUBLISH_THEN_WAIT  # a view starting one element in
    assert family(facts=A100) == PUBLISH_THEN_WAIT  # before Hopper: tested on Hopper only
    assert family(eager=False) == PUBLISH_THEN_WAIT  # traced for Inductor, which takes Triton kernels only
    assert family(gluon=False) == PUBLISH_THEN_WAIT  # a Triton without the Gluon parts


def test_softmax_describe_reads_the_call():
    """describe: the call's shape and element sizes, the device's facts and the call's context;
    the alignment a staged forward needs is each tensor's start, and a view may start off it."""
    x = torch.randn(6, 5, 40).to(torch.bfloat16)
    y = torch.empty_like(x, dtype=torch.float32)
    meta = softmax_op.describe(FORWARD, (x, y), 5, 40)
    assert meta == Meta(FORWARD, 6 * 40, 5, 40, 2, 4, INTERPRETER, gluon=softmax_launch.HAS_GLUON)  # along dim 1
    eager = run_direct(softmax_op.describe, (FORWARD, (x, y), 5, 40), {})
    assert eager.eager and not eager.aligned and not eager.overlap_fill  # a CPU call: no address is read
    row = torch.empty(4 * 65536, dtype=torch.bfloat16)
    assert softmax_op.starts_aligned((row[:65536], row[8 : 8 + 65536]))
    assert not softmax_op.starts_aligned((row[:65536], row[1 : 1 + 65536]))


def test_softmax_staged_forward_compiles_for_hopper():
    """The Gluon kernel builds for sm_90 with the installed Triton (no GPU needed):
    its copies are cp.async, its stages fit the shared memory the rule counts; and so does
    the kernel that publishes a round ahead."""
    if not softmax_launch.HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    from triton.experimental.gluon._runtime import GluonASTSource

    for design, y_dtype in [(TUNING.staged, "bf16"), (TUNING.staged, "fp32"), (TUNING.staged_ahead, "bf16")]:
        kernel, setup = softmax_launch.held_kernel(FORWARD, design.family), design.setup
        assert ("FULL" in kernel.arg_names) == design.full_rows  # the plan gives FULL by the design's word
        signature = {name: "i32" for name in kernel.arg_names}
        signature.update(x_ptr="*bf16", y_ptr=f"*{y_dtype}", words_ptr="*i64")
        for overlapped in (False, True):
            constants = dict(SEGMENT=setup.segment, SEGMENTS_BLOCK=words_block(setup.warps, 8),
                             STAGES=design.stages, VEC=4 if y_dtype == "fp32" else 8, OVERLAPPED=overlapped)  # fmt: skip
            if design.full_rows:
                constants["FULL"] = overlapped  # both bodies: masked and not
            signature.update({name: "constexpr" for name in constants})
            aligned = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in ("x_ptr", "y_ptr", "n_cols")}
            compiled = build_for_hopper(GluonASTSource(kernel, signature, constants, aligned), setup)
            assert "cp.async" in compiled.asm["ptx"]
            assert setup.shared <= compiled.metadata.shared <= setup.shared + 1024
            assert_publishes_without_release(compiled.asm["ptx"])
            assert_waits_for_the_fill_before_the_scratch(compiled.asm["ptx"], overlapped, first_load="cp.async")


@pytest.mark.parametrize("direction", [FORWARD, BACKWARD])
@pytest.mark.parametrize("element_size", [2, 4])
def test_softmax_held_kernels_publish_without_release(direction, element_size):
    """The Triton kernels built for sm_90 with the installed Triton (no GPU needed):
    the publish the held design rests on (see ops/blocks/held_rows.py)."""
    from triton.compiler import ASTSource

    design = triton_held_design(direction, element_size)
    kernel = softmax_launch.held_kernel(direction, design.family)
    pointers = [name for name in kernel.arg_names if name.endswith("_ptr")]
    signature = {name: "i32" for name in kernel.arg_names}
    signature.update({name: "*bf16" if element_size == 2 else "*fp32" for name in pointers}, words_ptr="*i64")
    for overlapped, frame in [(False, 0), (True, 0), (True, 16 // element_size)]:
        constants = dict(SEGMENT=design.setup.segment, SEGMENTS_BLOCK=words_block(design.setup.warps, 8),
                         OVERLAPPED=overlapped, FRAME=frame)  # fmt: skip
        if design.family == PUBLISH_THEN_WAIT:
            constants["LOAD_NEXT"] = "during_wait"
        signature.update({name: "constexpr" for name in constants})
        ptx = build_for_hopper(ASTSource(kernel, signature, constants), design.setup).asm["ptx"]
        assert_publishes_without_release(ptx)
        assert_waits_for_the_fill_before_the_scratch(ptx, overlapped)


@pytest.mark.gpu
@pytest.mark.parametrize("n_segments", [5, 80])  # of 8192 columns: 80 takes the Gluon forward that publishes ahead
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_softmax_long_row_edges_on_the_gpu(launched, dtype, n_segments):
    """Forwards of rows held across programs (the Gluon kernel for aligned 16-bit
    rows on Hopper, the lagged one for float32): -inf segments beside values near
    the dtype's range, a whole -inf row (NaN, as in torch.softmax), a row start
    off 16 bytes (a Triton kernel for 16-bit rows), and the same answers."""
    staged = dtype != torch.float32 and staged_forward_here()
    n_cols = n_segments * 8192 + 48  # a last segment of 48 columns
    x = (4 * torch.randn(40, n_cols, device="cuda")).to(dtype)
    x[3, : 2 * 8192] = -float("inf")  # two whole segments of -inf
    x[3, 2 * 8192 :] = -1e4 if dtype != torch.float16 else -6e4
    x[5] = -float("inf")
    x[7, 100] = torch.finfo(dtype).max
    launched.clear()
    y = torch.ops.tk.softmax(x, -1)
    assert launched == DESIGN_KERNELS[staged_design(n_cols) if staged else held_design(dtype)][:1]
    expected = torch.softmax(x.double(), -1)
    assert torch.isnan(y[5]).all() and not torch.isnan(torch.cat([y[:5], y[6:]])).any()
    keep = torch.arange(40, device="cuda") != 5
    assert_close(y[keep], expected[keep], dtype)
    off = torch.empty(40 * n_cols + 1, device="cuda", dtype=dtype)[1:].view(40, n_cols)  # 2 or 4 bytes off
    off.copy_(x)
    launched.clear()
    y_off = torch.ops.tk.softmax(off, -1)
    assert launched == DESIGN_KERNELS[held_design(dtype, off.shape)][:1]
    assert torch.isnan(y_off[5]).all()
    assert_close(y_off[keep], expected[keep], dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_softmax_compiled_with_dynamic_shapes(device):
    """dynamic=True: the row count is symbolic while tracing; the tile rule turns
    it into plain ints (a guard), and each shape still gets a right answer."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: torch.ops.tk.softmax(t, -1), fullgraph=True, dynamic=True)
    for n_rows in pick(device, [3, 40, 200], [3, 5000, 70000]):
        x = torch.randn(n_rows, 100, device=device)
        assert_close(compiled(x), torch.softmax(x.double(), -1), torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_softmax_short_rows_on_the_gpu(launched, dtype):
    """Short rows stacked into tiles on the GPU: last tiles part full, rows of
    one column, a strided dim, -inf rows inside a tile; and under torch.compile."""
    cases = [((4096, 128), -1), ((4097, 100), -1), ((3, 5), -1), ((70000, 1), -1), ((64, 33, 129), 1), ((100, 3000), 0)]
    for shape, dim in cases:
        x = (4 * torch.randn(shape, device="cuda")).to(dtype)
        check_softmax_and_gradient(torch.ops.tk.softmax, x, dim)
    x = torch.randn(4097, 100, device="cuda", dtype=dtype)
    x[1::3] = -float("inf")  # every third row NaN, its neighbours in the tile not
    torch.testing.assert_close(torch.ops.tk.softmax(x, -1), torch.softmax(x, -1), equal_nan=True)
    compiled = torch.compile(lambda t, dim: torch.ops.tk.softmax(t, dim), fullgraph=True)
    launched.clear()
    check_softmax_and_gradient(compiled, (4 * torch.randn(1000, 200, device="cuda")).to(dtype), -1)
    assert launched[:1] == DESIGN_KERNELS["single"][:1], launched


@pytest.mark.gpu
def test_softmax_flushes_values_under_the_normal_range_on_the_gpu():
    """exp runs as the GPU's exp2 with subnormals flushed (ops/_math.py): a softmax value under
    2**-126 comes out 0 (torch.softmax keeps exp(-100) = 3.7e-44), every other one as the float64
    reference has it; float64 keeps its subnormals."""
    x = torch.tensor([[0.0, -100.0, -80.0, -1.0]], device="cuda")
    y = torch.ops.tk.softmax(x, -1)
    assert y[0, 1] == 0 and torch.softmax(x, -1)[0, 1] > 0
    torch.testing.assert_close(y[0, [0, 2, 3]].double(), torch.softmax(x.double(), -1)[0, [0, 2, 3]], rtol=1e-6, atol=0)
    assert torch.ops.tk.softmax(x.double(), -1)[0, 1] > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n_cols", [100, 1000, 4096, 40000])
def test_softmax_backward_of_16bit_rows_is_as_accurate_as_pytorchs_row_by_row(device, n_cols):
    """Each product dy * y and the row's sum are taken in float32.  The products were once rounded to
    bfloat16 before the sum, which gave some rows 4-60x the error of PyTorch's own backward."""
    gen = torch.Generator(device=device).manual_seed(0)
    rows = 64 if device == "cpu" else 1024
    x = 3 * torch.randn(rows, n_cols, generator=gen, device=device)
    y = torch.softmax(x, -1).to(torch.bfloat16)
    dy = torch.randn(rows, n_cols, generator=gen, device=device).to(torch.bfloat16)
    y64, dy64 = y.double(), dy.double()
    exact = y64 * (dy64 - (dy64 * y64).sum(-1, keepdim=True))

    def row_errors(dx):
        return (dx.double() - exact).norm(dim=-1) / exact.norm(dim=-1)

    ours = row_errors(torch.ops.tk.softmax_backward(dy, y, -1))
    pytorchs = row_errors(torch.ops.aten._softmax_backward_data(dy, y, -1, torch.bfloat16))
    assert (ours <= 1.5 * pytorchs + 1e-4).all(), f"worst row: {(ours / pytorchs).max():.1f}x PyTorch's error"


@pytest.mark.parametrize("name, variants", [("softmax", ["eager-unfused"]), ("square", ["eager-mul", "eager-pow"])])
def test_the_lesson_variants_compute_the_op(name, variants):
    """The harness's hand-written compositions (the lesson's unfused softmax, square as a * a and
    a ** 2) are the op: against float64 on an odd shape, as the harness checks every variant."""
    from ops.spec import SPECS

    spec = SPECS[name]
    (x,) = spec.make_inputs(spec.shapes["cpu"][0], torch.float32, "cpu")
    want = spec.reference(x.double())
    assert sorted(spec.unfused) == sorted(variants)
    for variant in variants:
        assert rel_error(spec.unfused[variant](x), want) <= TOLERANCE[torch.float32], variant


def test_softmax_held_rows_off_16_byte_boundaries_are_framed():
    """Rows whose starts are off 16-byte boundaries take the Triton held kernels framed at the boundary
    before each row (FRAME: the elements in a 16-byte run of the narrowest tensor), their segments
    covering the row's span (n_cols + FRAME - 1).  Rows that start on boundaries, rows of another dim
    and the Gluon forwards take none."""
    gpt2 = h100_plan(4096, 50257, 2, FORWARD, eager=True, aligned=True, gluon=True)
    assert isinstance(gpt2, HeldPlan) and gpt2.frame == 8 and gpt2.family == LAGGED  # forward_16bit_framed
    assert gpt2.n_segments == cdiv(50257 + 7, TUNING.forward_16bit_framed.setup.segment) == 13
    assert h100_plan(4096, 50257, 2, BACKWARD).frame == 8
    assert h100_plan(4096, 50257, 4, FORWARD).frame == 4
    aligned = h100_plan(64, 8192 * 8 + 8, 2, FORWARD)  # rows on boundaries, not multiples of 16 columns
    assert aligned.frame == 0 and aligned.family == PUBLISH_THEN_WAIT
    assert h100_plan(64, 8192 * 8 + 4, 4, FORWARD).frame == 0  # 16 bytes a 4 float32 columns
    # A span just past whole segments takes one segment more: 65536 + 1 columns, 9 segments with the frame's 7.
    assert h100_plan(64, 65537, 2, BACKWARD).n_segments == cdiv(65537 + 7, 4096)
