"""softmax against a float64 reference: every design, dtypes, dims, odd shapes, empties, gradients.

Each test runs on the CPU (the Triton kernels through the interpreter, small
sizes) and on CUDA (compiled kernels, realistic sizes; marked `gpu`).
"""

import re
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from ptx_checks import assert_publishes_without_release, assert_waits_for_the_fill_before_the_scratch, build_for_hopper
from reference import DEVICES, DTYPES, TOLERANCE, assert_close, leaf64, pytorch_gelu, rel_error, strided_versions

from ops import gelu as gelu_ops  # the modules, for their design constants
from ops.matmul import op as matmul_ops
from ops.softmax import op as softmax_ops
from ops.blocks.alignment import column_multiple
from ops.blocks import held_rows as cooperative
from ops.blocks.held_rows import UNPUBLISHED, unpublished_words, words_block


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
    launch = softmax_ops._launch
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(softmax_ops, "_launch", lambda kernels, tensors, *a: (seen.append(tensors), launch(kernels, tensors, *a)))
        x = torch.randn(3, 40, dtype=torch.bfloat16)
        y = torch.ops.tk.softmax(x, -1, torch.float32)
        torch.ops.tk.softmax(x.float(), -1, torch.bfloat16)
    assert [t.dtype for t in seen[0]] == [torch.bfloat16, torch.float32] and seen[0][0].data_ptr() == x.data_ptr()
    assert [t.dtype for t in seen[1]] == [torch.bfloat16, torch.bfloat16]  # float32 x: cast first
    torch.testing.assert_close(y, torch.softmax(x, -1, dtype=torch.float32), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("x_dtype, dtype", [(torch.bfloat16, torch.float32), (torch.float32, torch.float16)])
def test_softmax_with_a_dtype_in_every_design(small_blocks, launched, monkeypatch, x_dtype, dtype):
    """Every design writes its result in a dtype other than its inputs'.  Rows held on chip take
    the setup of the widest dtype: a 16-bit x with a float32 y, the float32 kernels both ways."""
    held = "lagged" if dtype == torch.float32 else "cooperative"  # a float32 x is cast to float16 first
    for shape, design in [((37, 10), "single"), ((9, 70), "looped"), ((3, 120), "split"), ((5, 100), held)]:
        monkeypatch.setitem(softmax_ops._COOPERATIVE_ROWS, "cpu", design == held)
        launched.clear()
        check_softmax_with_dtype(torch.ops.tk.softmax, (4 * torch.randn(shape)).to(x_dtype), -1, dtype)
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


# ---------------------------------------------------- softmax: split rows
#
# The CPU constants shrunk so that rows of a few hundred columns take every
# design: blocks of at most 64 columns, chunks of 16, segments of at least 32,
# and about 8 programs.  `launched` records which kernels ran, so that each
# test checks it reached the design it means to test.


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setitem(softmax_ops._MAX_BLOCK, "cpu", 64)
    monkeypatch.setitem(softmax_ops._CHUNK, "cpu", 16)
    monkeypatch.setattr(softmax_ops, "_MIN_SEGMENT_CHUNKS", 2)
    monkeypatch.setattr(softmax_ops, "_CPU_PROGRAMS", 8)
    monkeypatch.setitem(softmax_ops._ROW_TILE, "cpu", 256)  # short rows: tiles of up to 256 elements


@pytest.fixture
def launched(monkeypatch):
    """The names of the softmax kernels launched, in order (the three launch helpers spied on)."""
    names = []

    def spy_on(helper, name_of):
        run = getattr(softmax_ops, helper)

        def spy(kernel, *args, **kwargs):
            names.append(name_of(kernel))
            return run(kernel, *args, **kwargs)

        monkeypatch.setattr(softmax_ops, helper, spy)

    spy_on("_run", lambda kernel: kernel.__name__)
    spy_on("_run_rows", lambda kernel: kernel.__name__)
    spy_on("_run_cooperative", lambda setup: setup.kernel.fn.__name__)
    spy_on("_run_staged", lambda setup: setup.kernel.fn.__name__)
    return names


@pytest.fixture
def cooperative_rows(monkeypatch):
    """Rows held across programs on CPU too (segments of 32 columns, 8 programs).
    The interpreter runs programs one at a time, so each computes its row's
    partials itself: the path a GPU program takes when the others do not come."""
    monkeypatch.setitem(softmax_ops._COOPERATIVE_ROWS, "cpu", True)


DESIGN_KERNELS = {  # forward, then backward
    "single": ["softmax_forward_kernel", "softmax_backward_kernel"],
    "looped": ["softmax_forward_online_kernel", "softmax_backward_looped_kernel"],
    "split": [
        "softmax_partial_stats_kernel",
        "softmax_normalize_segments_kernel",
        "softmax_backward_partial_dot_kernel",
        "softmax_backward_segments_kernel",
    ],
    "cooperative": ["softmax_forward_cooperative_kernel", "softmax_backward_lagged_kernel"],  # 16-bit rows
    "lagged": ["softmax_forward_lagged_kernel", "softmax_backward_lagged_kernel"],  # float32 rows
    "staged": ["softmax_forward_staged_kernel", "softmax_backward_lagged_kernel"],  # the Gluon forward
    "staged_ahead": ["softmax_forward_staged_ahead_kernel", "softmax_backward_lagged_kernel"],  # its longest rows
}


def held_design(dtype) -> str:
    """The design of rows held on chip across programs, by dtype (float64 has none)."""
    return "lagged" if dtype == torch.float32 else "cooperative"


def staged_forward_here() -> bool:
    """Whether eager forwards of long, aligned rows take the Gluon kernel on this GPU (see ops/_softmax_gluon.py)."""
    return softmax_ops._softmax_gluon is not None and torch.cuda.get_device_capability()[0] >= 9


def staged_design(n_cols: int) -> str:
    """Which Gluon forward an aligned row of 16-bit x and y takes: past 64 segments, the one publishing ahead."""
    return "staged_ahead" if n_cols > softmax_ops._AHEAD_PAST_SEGMENTS * 8192 else "staged"


def test_softmax_short_rows_rule(monkeypatch):
    """Short rows stack into tiles of up to _ROW_TILE elements, but the grid keeps
    _target_programs programs (4 an SM); long rows keep a program each."""
    monkeypatch.setattr(softmax_ops, "_sm_count", lambda index: 132)  # an H100: at least 528 programs
    assert softmax_ops._ROW_TILE["cuda"] == 1024  # the numbers below follow from it
    cuda = torch.device("cuda", 0)

    def rows(n_rows, n_cols):
        return softmax_ops._rows_per_program(n_rows, softmax_ops.next_power_of_2(n_cols), cuda)

    assert rows(65536, 128) == 8  # the tile: 8192 programs, where one row each ran 65536
    assert rows(16384, 64) == 16
    assert rows(4096, 128) == 4  # 1024 programs: 8 rows would leave 512
    assert rows(4096, 512) == 2
    assert rows(1000, 100) == rows(300, 1000) == rows(1, 2) == 1  # too few rows to stack
    assert rows(4096, 1024) == rows(4096, 16384) == 1
    for n_rows in [1, 3, 100, 4096, 10**6]:
        for n_cols in [1, 7, 128, 1000, 5000]:
            block = softmax_ops.next_power_of_2(n_cols)
            per_program = rows(n_rows, n_cols)
            assert per_program & (per_program - 1) == 0  # a power of two: a tl.arange length
            assert per_program * block <= max(1024, block)
            assert per_program == 1 or n_rows // per_program >= 528


def test_softmax_split_rule(monkeypatch):
    monkeypatch.setattr(softmax_ops, "_sm_count", lambda index: 132)  # an H100
    cuda = torch.device("cuda", 0)
    assert softmax_ops._CHUNK["cuda"] == 16384  # the numbers below follow from it
    assert softmax_ops._split(64, 1 << 20, cuda) == (8, 131072)  # 9 wanted (528 programs); whole chunks leave 8
    assert softmax_ops._split(256, 262144, cuda) == (3, 98304)
    assert softmax_ops._split(1, 1 << 20, cuda) == (16, 65536)  # no segment below 4 chunks
    assert softmax_ops._split(1024, 65536, cuda)[0] == 1  # enough rows: one program per row
    assert softmax_ops._split(4, 20000, cuda)[0] == 1  # too short to split
    assert softmax_ops._split(2, 1 << 20, torch.device("cpu")) == (4, 262144)
    for n_rows in [1, 3, 64, 600]:
        for n_cols in [16385, 65536, 100_003, 1 << 20]:
            n_segments, segment_len = softmax_ops._split(n_rows, n_cols, cuda)
            assert segment_len % softmax_ops._CHUNK["cuda"] == 0  # whole chunks
            assert (n_segments - 1) * segment_len < n_cols <= n_segments * segment_len  # none empty, all covered


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
def test_softmax_designs_match_float64(small_blocks, launched, dtype):
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
        check_softmax_and_gradient(torch.ops.tk.softmax, (4 * torch.randn(shape)).to(dtype), dim)
        assert launched == DESIGN_KERNELS[design], shape


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_split_rows_with_minus_inf_and_extreme_values(small_blocks, launched, monkeypatch, dtype):
    # 8 rows (7 in the backward) of 3 segments: columns [0, 80), [80, 160) and [160, 200).
    monkeypatch.setattr(softmax_ops, "_CPU_PROGRAMS", 21)
    x = torch.randn(8, 200, dtype=dtype)
    x[0] = -float("inf")  # all -inf: NaN, as in torch.softmax
    x[1, :80] = -float("inf")  # the first segment all -inf
    x[2, 80:160] = -float("inf")  # the middle one
    x[3, 160:] = -float("inf")  # the last one
    x[4, :170] = -float("inf")  # only a part of the last segment counts
    x[5] = x[5] * 1e30  # huge values: each segment's max far from the others'
    x[6, 150] = 1e38  # one value dominates
    x[7] = x[7] - 1e4  # far below 0: a padding lane of the partials must not count as 0
    y = torch.ops.tk.softmax(x, -1)
    torch.testing.assert_close(y, torch.softmax(x, -1), equal_nan=True)
    assert y[0].isnan().all() and not y[1:].isnan().any()
    grad, y = torch.randn_like(x[1:]), y[1:]
    dx = torch.ops.tk.softmax_backward(grad, y, -1)
    y64 = y.double()
    assert_close(dx, y64 * (grad - (grad * y64).sum(-1, keepdim=True)), dtype)
    assert launched == DESIGN_KERNELS["split"]


def test_softmax_split_gradcheck(small_blocks, launched):
    for shape, dim in [((2, 100), -1), ((100, 2), 0)]:  # 3 segments: 48, 48 and 4 columns
        x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda t: torch.ops.tk.softmax(t, dim), (x,), fast_mode=True)
    assert set(launched) == set(DESIGN_KERNELS["split"])


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_cooperative_rows_match_float64(small_blocks, cooperative_rows, launched, dtype):
    cases = [  # 8 programs, segments of 32 columns
        ((5, 100), -1),  # 4 segments, the last of 4 columns; 2 rows a round, 3 rounds
        ((3, 256), -1),  # 8 segments exactly: one row a round
        ((1, 250), -1),  # one row
        ((2, 100, 3), 1),  # a non-last dim, elements 3 apart
        ((7, 65), -1),  # 3 segments, the last of one column; 2 rows a round, the last round 1
    ]
    for shape, dim in cases:
        launched.clear()
        check_softmax_and_gradient(torch.ops.tk.softmax, (4 * torch.randn(shape)).to(dtype), dim)
        expected = DESIGN_KERNELS[held_design(dtype) if dtype != torch.float64 else "split"]  # no float64 setup
        assert launched == expected, (shape, launched)


def test_softmax_cooperative_rows_with_minus_inf_and_extreme_values(small_blocks, cooperative_rows, launched):
    x = torch.randn(8, 100)  # segments [0, 32), [32, 64), [64, 96), [96, 100)
    x[0] = -float("inf")  # all -inf: NaN, as in torch.softmax
    x[1, :32] = -float("inf")  # a whole segment -inf
    x[2, 96:] = -float("inf")  # the short last one
    x[3, :98] = -float("inf")  # only a part of the last segment counts
    x[4] = x[4] * 1e30  # each segment's max far from the others'
    x[5, 50] = 1e38  # one value dominates
    x[6] = x[6] - 1e4  # far below 0: a padding lane of the partials must not count as 0
    x[7, :32], x[7, 32:] = -float("inf"), x[7, 32:] - 1e4  # exp(0 - row max) of the -inf segment overflows
    y = torch.ops.tk.softmax(x, -1)
    torch.testing.assert_close(y, torch.softmax(x, -1), equal_nan=True)
    assert y[0].isnan().all() and not y[1:].isnan().any()
    assert launched == DESIGN_KERNELS["lagged"][:1]


def _held_setup(direction, element_size):
    """The _Cooperative setup of rows held across programs for a direction and element size."""
    return {"forward": softmax_ops._COOPERATIVE_FORWARD, "backward": softmax_ops._COOPERATIVE_BACKWARD}[direction][element_size]


def _cooperative_twice(kernel_name, tensors, n_cols, load_next):
    """Launch a cooperative kernel on CPU twice over the same scratch: first no
    program waits (each computes and publishes; the last of a row finds the
    others' words), then every program finds all words of its rows published
    and combines those.  Both outputs, and the words the first launch published."""
    n_rows = tensors[-1].numel() // n_cols
    setup = _held_setup(kernel_name, tensors[-1].element_size())
    n_segments, rows_at_once = softmax_ops._cooperative_plan(setup, n_rows, n_cols, torch.device("cpu"))
    words = unpublished_words(tensors[-1], n_rows, n_segments)
    flags = {"NATIVE_16BIT": False} if kernel_name == "backward" else {}
    flags["COL_MULTIPLE"] = column_multiple(n_cols)
    if not setup.lagged:
        flags["LOAD_NEXT"] = load_next
    outputs, published = [], None
    for max_spins in (0, 1):
        tensors[-1].fill_(float("nan"))
        softmax_ops.launcher(setup.kernel, tensors[-1])[(rows_at_once * n_segments,)](
            *tensors, words, n_rows, n_cols, 1, n_segments, rows_at_once, max_spins,
            SEGMENT=softmax_ops._CPU_SEGMENT, SEGMENTS_BLOCK=words_block(setup.warps, n_segments), OVERLAPPED=False,
            **flags,
        )
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


def _load_places(direction, dtype):
    """The load places to try for a direction's setup: one run (no place) for a lagged kernel."""
    return (None,) if _held_setup(direction, torch.empty((), dtype=dtype).element_size()).lagged else LOAD_PLACES


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # the two setups of each direction
def test_softmax_cooperative_published_partials_give_the_same_bits(small_blocks, cooperative_rows, dtype):
    """The path a GPU takes when all programs run at once (partials read from the
    scratch) and the one it takes when they do not (computed here): same bits,
    wherever the next round's loads are issued, and whether a program publishes
    a round ahead (float32 forwards, every backward).  The words hold each
    segment's (max, sum of exp(x - max)), and for the backward its sum(dy * y)."""
    x = (4 * torch.randn(5, 100)).to(dtype)
    x[2, 40:70] = float("nan")  # a NaN partial: its word must still count as published
    grad, y = torch.randn(5, 100).to(dtype), torch.softmax(x, -1)
    forward, backward = [], []
    for load_next in _load_places("forward", dtype):
        outputs, forward_words = _cooperative_twice("forward", (x, torch.empty_like(x)), 100, load_next)
        forward += outputs
    for load_next in _load_places("backward", dtype):
        outputs, backward_words = _cooperative_twice("backward", (grad, y, torch.empty_like(y)), 100, load_next)
        backward += outputs
    assert all(_same_bits(out, forward[0]) for out in forward[1:])
    assert all(_same_bits(out, backward[0]) for out in backward[1:])
    finite = [0, 1, 3, 4]  # rows without the NaN: those of row 2 are all NaN, as in PyTorch
    assert forward[0][2].isnan().all() and backward[0][2].isnan().all()
    assert_close(forward[0][finite], torch.softmax(x.double(), -1)[finite], dtype)
    y64, grad64 = y.double()[finite], grad.double()[finite]
    assert_close(backward[0][finite], y64 * (grad64 - (grad64 * y64).sum(-1, keepdim=True)), dtype)

    # Every word published, and it holds its segment's partial (segments of _CPU_SEGMENT columns).
    assert (forward_words != UNPUBLISHED.value).all()
    assert (backward_words != UNPUBLISHED.value).all()
    segment = softmax_ops._CPU_SEGMENT
    padded = F.pad(x.double(), (0, 128 - 100), value=-float("inf")).view(5, -1, segment)
    segment_max = padded.amax(-1)
    word_max, word_sum = _unpacked(forward_words)
    torch.testing.assert_close(word_max[finite].double(), segment_max[finite])
    torch.testing.assert_close(word_sum[finite].double(), (padded - segment_max[..., None]).exp().sum(-1)[finite])
    assert word_sum[2, 1:3].isnan().all()  # the segments with NaN: their sum, then their row, are NaN
    _, word_dot = _unpacked(backward_words)
    dots = F.pad(grad.double() * y.double(), (0, 128 - 100)).view(5, -1, segment).sum(-1)
    torch.testing.assert_close(word_dot[finite].double(), dots[finite], rtol=1e-2, atol=1e-3)


def test_softmax_cooperative_next_load_rule():
    """The 16-bit forward loads the next round before the partial in rows of up to
    32 segments, during the wait in longer ones; the other setups publish a round ahead."""
    assert [softmax_ops._next_load(n) for n in (1, 8, 32, 33, 128)] == ["before_partial"] * 3 + ["during_wait"] * 2
    forward, backward = softmax_ops._COOPERATIVE_FORWARD, softmax_ops._COOPERATIVE_BACKWARD
    assert not forward[2].lagged and forward[4].lagged and backward[2].lagged and backward[4].lagged


def test_softmax_cooperative_rule(monkeypatch):
    """The grid is what the GPU runs at once; the rows are spread evenly over rounds."""
    h100 = type("Props", (), {"max_threads_per_multi_processor": 2048, "shared_memory_per_multiprocessor": 233472})()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=None: h100)
    from ops.runtime.device import resident_programs_per_sm

    resident_programs_per_sm.cache_clear()
    try:
        assert resident_programs_per_sm(0, 8, 80) == 3  # 65536 registers // (80 * 256)
        assert resident_programs_per_sm(0, 8, 128) == 2
        assert resident_programs_per_sm(0, 2, 32) == 32  # the thread limit: 2048 // 64
        # One-warp programs: the warps that fit, rounded down to a multiple of 4 (measured on an H100:
        # at 144 and 120 registers, plans of 14 and 17 an SM left rows waiting on programs never run).
        one_warp = [resident_programs_per_sm(0, 1, r) for r in (96, 120, 128, 144, 160, 80, 72)]
        assert one_warp == [20, 16, 16, 12, 12, 24, 28]
        assert resident_programs_per_sm(0, 1, 140) == 12  # 140 registers are given as 144 (units of 256 a warp)
        assert resident_programs_per_sm(0, 2, 144) == 6
        monkeypatch.setattr(cooperative, "sm_count", lambda index: 132)
        cuda = torch.device("cuda", 0)
        bf16, fp32 = softmax_ops._COOPERATIVE_FORWARD[2], softmax_ops._COOPERATIVE_FORWARD[4]
        backward_bf16, backward_fp32 = softmax_ops._COOPERATIVE_BACKWARD[2], softmax_ops._COOPERATIVE_BACKWARD[4]
        assert (bf16.segment, fp32.segment, backward_fp32.segment) == (8192, 4096, 2048)  # the numbers below follow
        assert softmax_ops._cooperative_plan(bf16, 1024, 65536, cuda) == (8, 49)  # 396 programs: 21 rounds of 49 rows
        assert softmax_ops._cooperative_plan(fp32, 1024, 65536, cuda) == (16, 32)  # 528 programs: 32 rounds of 32
        assert softmax_ops._cooperative_plan(backward_bf16, 1024, 40000, cuda) == (10, 52)  # 528 // 10 rows, 20 rounds
        assert softmax_ops._cooperative_plan(backward_fp32, 1024, 40000, cuda) == (20, 32)  # 660 programs (5 an SM)
        assert softmax_ops._cooperative_plan(bf16, 64, 1 << 20, cuda) == (128, 3)  # 3 rows at once: 22 rounds
        assert softmax_ops._cooperative_plan(fp32, 5, 40000, cuda) == (10, 5)  # fewer rows than the grid holds
        assert softmax_ops._cooperative_plan(bf16, 8, 396 * 8192, cuda) == (396, 1)  # the longest row held
        assert softmax_ops._cooperative_plan(bf16, 8, 396 * 8192 + 1, cuda) is None  # longer: split rows
        assert softmax_ops._cooperative_plan(bf16, 8, 1 << 20, torch.device("cpu")) is None  # off on CPU
        assert 8 not in softmax_ops._COOPERATIVE_FORWARD  # float64 keeps the other designs
        assert resident_programs_per_sm(0, 8, 64, 32768) == 4  # registers bind: 65536 // (64 * 256)
        assert resident_programs_per_sm(0, 8, 64, 65536) == 3  # shared memory binds: 233472 // (65536 + 1024)
        # A row's words: one copy a thread at least (8 warps: 256 lanes), a power of two.
        assert [words_block(bf16.warps, n) for n in (1, 5, 256, 257, 396)] == [256, 256, 256, 512, 512]
        if softmax_ops._STAGED_FORWARD:  # the Gluon forward, 16-bit only: 4 an SM
            assert set(softmax_ops._STAGED_FORWARD) == {2}
            assert softmax_ops._cooperative_plan(softmax_ops._STAGED_FORWARD[2], 1024, 65536, cuda) == (8, 64)  # 528
            ahead = softmax_ops._STAGED_AHEAD_FORWARD  # 8 an SM: 1056 programs, 4 rows of 256 segments at once
            assert softmax_ops._cooperative_plan(ahead, 64, 1 << 20, cuda) == (256, 4)
    finally:
        resident_programs_per_sm.cache_clear()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_softmax_cooperative_rows_on_the_gpu(launched, monkeypatch, dtype):
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
    for shape, dim, aligned in cases:
        launched.clear()
        x = (4 * torch.randn(shape, device="cuda")).to(dtype)
        y, grad, dx = check_softmax_and_gradient(torch.ops.tk.softmax, x, dim)
        design = held_design(dtype)
        if aligned and dtype != torch.float32 and staged_forward_here():
            design = staged_design(shape[-1])
        assert launched == DESIGN_KERNELS[design], (shape, launched)
        with monkeypatch.context() as patch:  # no program waits: each computes its row's partials
            patch.setitem(softmax_ops._MAX_SPINS, "cuda", 0)
            assert torch.equal(torch.ops.tk.softmax(x, dim), y)
            assert torch.equal(torch.ops.tk.softmax_backward(grad, y, dim), dx)
        with monkeypatch.context() as patch:  # each kernel starts after its scratch fill ends
            patch.setattr(cooperative, "OVERLAP_FILL", False)
            assert torch.equal(torch.ops.tk.softmax(x, dim), y)
            assert torch.equal(torch.ops.tk.softmax_backward(grad, y, dim), dx)
        if design == "cooperative":  # the one kernel with a choice of where the next round's loads go
            for segments in (0, 1 << 30):  # issued at the other place: same bits
                with monkeypatch.context() as patch:
                    patch.setattr(softmax_ops, "_LOAD_BEFORE_PARTIAL_SEGMENTS", segments)
                    assert torch.equal(torch.ops.tk.softmax(x, dim), y)
    compiled = torch.compile(lambda t, dim: torch.ops.tk.softmax(t, dim), fullgraph=True)
    launched.clear()
    check_softmax_and_gradient(compiled, (4 * torch.randn(64, 100_000, device="cuda")).to(dtype), -1)
    # Traced for Inductor: the forward on every compile; the backward's trace may come from Inductor's cache.
    assert launched[:1] == DESIGN_KERNELS[held_design(dtype)][:1], launched


@pytest.mark.gpu
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16])
def test_softmax_float32_result_of_long_16bit_rows_on_the_gpu(launched, monkeypatch, x_dtype):
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
        with monkeypatch.context() as patch:
            patch.setitem(softmax_ops._MAX_SPINS, "cuda", 0)
            assert torch.equal(torch.ops.tk.softmax(x, -1, torch.float32), y)


class _FakeCudaTensor:
    """What _staged_setup reads of a tensor, without a GPU."""

    def __init__(self, element_size, data_ptr=0):
        self.device = torch.device("cuda", 0)
        self._element_size, self._data_ptr = element_size, data_ptr

    def element_size(self):
        return self._element_size

    def data_ptr(self):
        return self._data_ptr


def test_softmax_staged_forward_rule(monkeypatch):
    """The Gluon forward applies to eager launches of 16-bit rows along the last
    dim, 16-byte aligned, on Hopper or newer; else a Triton kernel."""
    if not softmax_ops._STAGED_FORWARD:
        pytest.skip("this Triton has no Gluon")
    monkeypatch.setattr(softmax_ops, "launching_directly", lambda: True)
    monkeypatch.setattr(softmax_ops, "cuda_capability", lambda index: (9, 0))
    forward, backward = softmax_ops._FORWARD, softmax_ops._BACKWARD

    def setup(kernels=forward, n_cols=65536, inner=1, size=2, offset=0, y_size=None):
        tensors = (_FakeCudaTensor(size, offset), _FakeCudaTensor(y_size or size))
        return softmax_ops._staged_setup(kernels, (*tensors[:1], *tensors) if kernels is backward else tensors, n_cols, inner)

    assert setup() is softmax_ops._STAGED_FORWARD[2]
    assert setup(y_size=4) is softmax_ops._STAGED_FORWARD[2]  # a float32 result of a 16-bit x: staged too
    ahead = softmax_ops._STAGED_AHEAD_FORWARD  # past 32 segments of 8192 columns: the kernel publishing ahead
    assert setup(n_cols=32 * 8192) is softmax_ops._STAGED_FORWARD[2]
    assert setup(n_cols=32 * 8192 + 16) is ahead and setup(n_cols=1 << 21) is ahead
    assert setup(n_cols=1 << 20, y_size=4) is softmax_ops._STAGED_FORWARD[2]  # its stores were not waiting
    assert setup(n_cols=(1 << 20) + 8) is None and setup(n_cols=1 << 20, offset=2) is None  # alignment first
    assert setup(size=4) is None  # float32: the lagged Triton kernel
    assert setup(size=4, y_size=2) is None  # (a float32 x is cast to a 16-bit dtype first: never launched)
    assert setup(size=8) is None  # float64
    assert setup(kernels=backward) is None
    assert setup(inner=3) is None  # softmax along a dim other than the last
    assert setup(n_cols=65536 + 8) is None  # rows 16-byte aligned for bf16, but Triton specializes on 16 elements
    assert setup(offset=2) is None  # a view starting one element in
    monkeypatch.setattr(softmax_ops, "cuda_capability", lambda index: (8, 0))
    assert setup() is None  # before Hopper: tested on Hopper only
    monkeypatch.setattr(softmax_ops, "cuda_capability", lambda index: (9, 0))
    monkeypatch.setattr(softmax_ops, "launching_directly", lambda: False)
    assert setup() is None  # traced for Inductor, which takes Triton kernels only


def test_softmax_staged_forward_compiles_for_hopper():
    """The Gluon kernel builds for sm_90 with the installed Triton (no GPU needed):
    its copies are cp.async, its stages fit the shared memory the rule counts; and so does
    the kernel that publishes a round ahead."""
    if softmax_ops._softmax_gluon is None:
        pytest.skip("this Triton has no Gluon")
    from triton.experimental.gluon._runtime import GluonASTSource

    for setup, y_dtype in [(softmax_ops._STAGED_FORWARD[2], "bf16"), (softmax_ops._STAGED_FORWARD[2], "fp32"),
                           (softmax_ops._STAGED_AHEAD_FORWARD, "bf16")]:  # fmt: skip
        kernel = setup.kernel
        assert ("FULL" in kernel.arg_names) == setup.full_rows  # _run_staged passes FULL by the setup's word
        signature = {name: "i32" for name in kernel.arg_names}
        signature.update(x_ptr="*bf16", y_ptr=f"*{y_dtype}", words_ptr="*i64")
        for overlapped in (False, True):
            constants = dict(SEGMENT=setup.segment, SEGMENTS_BLOCK=words_block(setup.warps, 8),
                             STAGES=setup.stages, VEC=4 if y_dtype == "fp32" else 8, OVERLAPPED=overlapped)  # fmt: skip
            if setup.full_rows:
                constants["FULL"] = overlapped  # both bodies: masked and not
            signature.update({name: "constexpr" for name in constants})
            aligned = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in ("x_ptr", "y_ptr", "n_cols")}
            compiled = build_for_hopper(GluonASTSource(kernel, signature, constants, aligned), setup)
            assert "cp.async" in compiled.asm["ptx"]
            assert setup.shared <= compiled.metadata.shared <= setup.shared + 1024
            assert_publishes_without_release(compiled.asm["ptx"])
            assert_waits_for_the_fill_before_the_scratch(compiled.asm["ptx"], overlapped, first_load="cp.async")


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("element_size", [2, 4])
def test_softmax_cooperative_kernels_publish_without_release(direction, element_size):
    """The Triton kernels built for sm_90 with the installed Triton (no GPU needed):
    the publish the cooperative design rests on (see ops/softmax.py)."""
    from triton.compiler import ASTSource

    setup = _held_setup(direction, element_size)
    kernel = setup.kernel.fn
    pointers = [name for name in kernel.arg_names if name.endswith("_ptr")]
    signature = {name: "i32" for name in kernel.arg_names}
    signature.update({name: "*bf16" if element_size == 2 else "*fp32" for name in pointers}, words_ptr="*i64")
    for overlapped in (False, True):
        constants = dict(SEGMENT=setup.segment, SEGMENTS_BLOCK=words_block(setup.warps, 8), OVERLAPPED=overlapped)
        if not setup.lagged:
            constants["LOAD_NEXT"] = "during_wait"
        if direction == "backward":
            constants["NATIVE_16BIT"] = True
        signature.update({name: "constexpr" for name in constants})
        ptx = build_for_hopper(ASTSource(kernel, signature, constants), setup).asm["ptx"]
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
    assert launched == DESIGN_KERNELS[held_design(dtype)][:1]
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
