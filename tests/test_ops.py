"""Every tk op against a float64 reference: dtypes, odd shapes, strides, empties, gradients.

Each test runs on the CPU (the Triton kernels through the interpreter, small
sizes) and on CUDA (compiled kernels, realistic sizes; marked `gpu`).
"""

import re
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from reference import DEVICES, DTYPES, TOLERANCE, assert_close, leaf64, pytorch_gelu, rel_error, strided_versions

from ops import gelu as gelu_ops  # the modules, for their design constants
from ops import matmul as matmul_ops
from ops import softmax as softmax_ops
from ops._alignment import column_multiple
from ops import _cooperative as cooperative
from ops._cooperative import UNPUBLISHED, unpublished_words, words_block


def pick(device, cpu, cuda):
    return cuda if device == "cuda" else cpu


# ----------------------------------------------------------------------- gelu


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_float64(device, dtype, approximate):
    shapes = pick(device, [(1,), (1000,), (3, 4097), (7, 1, 13)], [(1,), (4097,), (3000, 4099), (1 << 26,)])
    for shape in shapes:
        x = 3 * torch.randn(shape, device=device, dtype=dtype)
        for layout, view in strided_versions(x):
            y = torch.ops.tk.gelu(view, approximate)
            assert y.shape == view.shape, layout
            assert_close(y, F.gelu(view.double(), approximate=approximate), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_gelu_keeps_the_layout_of_a_dense_input(device):
    x = torch.randn(64, 33, device=device).t()
    assert torch.ops.tk.gelu(x).stride() == x.stride()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_backward_matches_pytorch(device, dtype, approximate):
    x = 3 * torch.randn(pick(device, (37, 129), (4096, 4097)), device=device, dtype=dtype)
    grad = torch.randn_like(x)
    x_tk = x.clone().requires_grad_()
    torch.ops.tk.gelu(x_tk, approximate).backward(grad)
    x64 = leaf64(x)
    F.gelu(x64, approximate=approximate).backward(grad.double())
    assert_close(x_tk.grad, x64.grad, dtype)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_gradcheck(approximate):
    x = torch.randn(2, 33, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: torch.ops.tk.gelu(t, approximate), (x,))


@pytest.mark.parametrize("device", DEVICES)
def test_gelu_of_empty_and_special_values(device):
    assert torch.ops.tk.gelu(torch.empty(0, 5, device=device)).shape == (0, 5)
    assert torch.ops.tk.gelu(torch.tensor(2.0, device=device)).shape == ()
    for dtype in (torch.float32, torch.float16, torch.bfloat16):  # the 16-bit erf forward has a form of its own
        x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e4, -1e4], device=device, dtype=dtype)
        for approximate in ["none", "tanh"]:
            expected = pytorch_gelu(x, approximate)
            torch.testing.assert_close(torch.ops.tk.gelu(x, approximate), expected, equal_nan=True, atol=0, rtol=1e-6)


def test_the_16bit_gelu_form_in_float64():
    """The 16-bit erf GELU (ops/gelu.py, _normal_cdf_16bit) takes Phi(-|x|) as
    t exp(P(t) - z^2) / 2 with t = 1 / (1 + z/2), z = |x| / sqrt 2.  In float64
    that is erfc(z) / 2 to under 8e-7 relative, out to z = 12 (erfc 1e-64,
    far below float32's smallest number)."""
    z = torch.linspace(0, 12, 200_001, dtype=torch.float64)
    t = 1 / (1 + z / 2)
    p = sum(c * t**i for i, c in enumerate(gelu_ops.ERFC_POLY))
    assert (t * torch.exp(p - z * z) / torch.special.erfc(z) - 1).abs().max() < 8e-7


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Units in the last place between two 16-bit float tensors (+0 and -0 are 0 apart)."""

    def ordered(t):  # sign and magnitude bits -> integers in the order of the values
        bits = t.view(torch.int16).int()
        return torch.where(bits < 0, -(bits + 32768), bits)

    return (ordered(a) - ordered(b)).abs()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_erf_gelu_of_every_16bit_value(device, dtype):
    """Every finite value of the dtype in [-16, 16] (past it gelu is x or -0):
    the result is the exact answer correctly rounded or, for at most 0.5% of
    the values, the 16-bit number next to it; never further.

    The exact answer is x * erfc(-x / sqrt 2) / 2 in float64.  F.gelu in
    float64 is not: it computes 1 + erf(x / sqrt 2), which cancels for
    negative x (2% off at x = -8, where bfloat16 still holds the answer)."""
    if device == "cpu" and dtype == torch.bfloat16:
        pytest.skip("Triton's interpreter converts float32 to bfloat16 by truncation, not rounding")
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    x = x[torch.isfinite(x) & (x.abs() <= 16)].to(device)
    x64 = x.double()
    exact = x64 * torch.special.erfc(-x64 * 0.5**0.5) / 2
    distance = ulp_distance(torch.ops.tk.gelu(x), exact.to(dtype))
    assert distance.max() <= 1
    assert (distance == 1).float().mean() <= 5e-3, (distance == 1).sum()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_erf_gelu_derivative_of_every_16bit_value(device, dtype):
    """The 16-bit erf backward (Phi(x) + x phi(x), Phi from _normal_cdf_16bit)
    at every finite value in [-16, 16], grad 1: as the forward, correctly
    rounded or one 16-bit number off, for at most 0.5% of the values.

    One exception: near x = -0.75, where the derivative is 0, the two terms
    cancel and any float32 evaluation is off by a few units of the (small)
    result; there the error must stay within Phi's own: 4e-6 of Phi(x), the
    polynomial's 8e-7 and the GPU's approximate exp2 and division (float16,
    H100: 4 units, 2.2e-6 of Phi, at x = -0.7515).
    PyTorch's float32 formula, 1 + erf(x / sqrt 2), cancels for negative x
    too: in bfloat16 it is up to 8 units off near x = -5.5 (H100)."""
    if device == "cpu" and dtype == torch.bfloat16:
        pytest.skip("Triton's interpreter converts float32 to bfloat16 by truncation, not rounding")
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    x = x[torch.isfinite(x) & (x.abs() <= 16)].to(device)
    x64 = x.double()
    exact = torch.special.erfc(-x64 * 0.5**0.5) / 2 + x64 * torch.exp(-x64 * x64 / 2) / (2 * torch.pi) ** 0.5
    dx = torch.ops.tk.gelu_backward(torch.ones_like(x), x, "none")
    distance = ulp_distance(dx, exact.to(dtype))
    cancelling = (x64 + 0.7518).abs() < 0.05
    within_phi = (dx.double() - exact).abs() <= 4e-6 * torch.special.erfc(-x64 * 0.5**0.5) / 2
    assert ((distance <= 1) | (cancelling & within_phi)).all(), x[distance > 1]
    assert (distance == 1).float().mean() <= 5e-3, (distance == 1).sum()


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
    from ops._device import resident_programs_per_sm

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


def _build_for_hopper(source, setup):
    """`source` (an ASTSource or GluonASTSource) compiled for sm_90 with `setup`'s warps and register cap."""
    import triton
    from triton.backends.compiler import GPUTarget

    options = {"num_warps": setup.warps, "maxnreg": setup.registers}
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


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
            compiled = _build_for_hopper(GluonASTSource(kernel, signature, constants, aligned), setup)
            assert "cp.async" in compiled.asm["ptx"]
            assert setup.shared <= compiled.metadata.shared <= setup.shared + 1024
            _assert_publishes_without_release(compiled.asm["ptx"])
            _assert_waits_for_the_fill_before_the_scratch(compiled.asm["ptx"], overlapped, first_load="cp.async")


def _assert_waits_for_the_fill_before_the_scratch(ptx, overlapped, first_load="ld.global"):
    """Launched to overlap its scratch fill (OVERLAPPED), a kernel waits for the fill once,
    after it has issued its first loads of the row and before its first publish; otherwise
    it has no wait at all."""
    waits = [m.start() for m in re.finditer(r"griddepcontrol\.wait", ptx)]
    if not overlapped:
        assert waits == []
        return
    assert len(waits) == 1, waits
    assert ptx.index(first_load) < waits[0] < ptx.index("atom.global")


def _assert_publishes_without_release(ptx):
    """A partial goes out as one relaxed 64-bit exchange and comes in by volatile loads;
    nothing in the kernel waits for its earlier stores (a release, a fence)."""
    atomics = set(re.findall(r"atom\.[\w.]+", ptx))
    assert atomics == {"atom.global.gpu.relaxed.exch.b64"}, atomics
    assert "ld.volatile.global.b64" in ptx
    assert not re.search(r"\bfence\.|\.release\b|\.acq_rel\b|membar", ptx)


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
        ptx = _build_for_hopper(ASTSource(kernel, signature, constants), setup).asm["ptx"]
        _assert_publishes_without_release(ptx)
        _assert_waits_for_the_fill_before_the_scratch(ptx, overlapped)


def test_held_rows_kernels_overlap_their_fill_in_eager_calls_on_hopper_outside_graph_capture(monkeypatch):
    """The rule: an eager launch (not traced for Inductor) on Hopper or newer, with a Triton that
    has grid dependency control, while no CUDA graph is being captured; never on CPU."""
    like = _FakeCudaTensor(2)
    monkeypatch.setattr(cooperative, "launching_directly", lambda: True)
    monkeypatch.setattr(cooperative, "cuda_capability", lambda index: (9, 0))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert cooperative.overlaps_fill(like) is (cooperative.gdc_wait is not None)
    if cooperative.gdc_wait is None:
        return
    assert not cooperative.overlaps_fill(torch.empty(3))  # the interpreter
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not cooperative.overlaps_fill(like)  # a graph's kernels follow each other closely already
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(cooperative, "OVERLAP_FILL", False)
    assert not cooperative.overlaps_fill(like)  # the switch tests and probes use
    monkeypatch.setattr(cooperative, "OVERLAP_FILL", True)
    monkeypatch.setattr(cooperative, "cuda_capability", lambda index: (8, 0))
    assert not cooperative.overlaps_fill(like)  # before Hopper: no programmatic dependent launch
    monkeypatch.setattr(cooperative, "cuda_capability", lambda index: (9, 0))

    def no_device_query(index):
        raise AssertionError("a traced call queried the device")

    monkeypatch.setattr(cooperative, "launching_directly", lambda: False)
    monkeypatch.setattr(cooperative, "cuda_capability", no_device_query)
    assert not cooperative.overlaps_fill(like)  # traced for Inductor: the plain kernel


def test_the_scratch_fill_lets_the_next_kernel_start_and_the_held_norm_kernels_wait_for_it():
    """Built for sm_90 (no GPU needed): the fill, launched before a kernel that overlaps it,
    lets that kernel start at once; the norms' held backwards wait for it after their first
    loads and before their first publish, as the softmax kernels do."""
    from triton.compiler import ASTSource

    from ops.layer_norm import LAYER_NORM_KERNELS
    from ops.rms_norm import RMS_NORM_KERNELS

    fill = cooperative.unpublish_kernel
    for overlapped in (False, True):
        signature = {"words_ptr": "*i64", "n": "i32", "BLOCK": "constexpr", "OVERLAPPED": "constexpr"}
        source = ASTSource(fill, signature, {"BLOCK": 1024, "OVERLAPPED": overlapped})
        ptx = _build_for_hopper(source, SimpleNamespace(warps=4, registers=255)).asm["ptx"]
        starts = [m.start() for m in re.finditer(r"griddepcontrol\.launch_dependents", ptx)]
        assert len(starts) == overlapped and all(at < ptx.index("st.global") for at in starts)
        for kernels in (RMS_NORM_KERNELS, LAYER_NORM_KERNELS):
            setup = kernels.held_setups[2][0]
            kernel = kernels.backward_held
            signature = {name: "*bf16" if name.endswith("_ptr") else "i32" for name in kernel.arg_names}
            signature.update(dw_partial_ptr="*fp32", db_partial_ptr="*fp32", words_ptr="*i64", eps="fp32")
            constants = dict(HAS_WEIGHT=True, WEIGHT_GRAD=True, BIAS_GRAD=True, SEGMENT=setup.segment,
                             SEGMENTS_BLOCK=words_block(setup.warps, 8), COL_MULTIPLE=16, OVERLAPPED=overlapped,
                             ROWS_AHEAD=setup.rows_ahead)  # fmt: skip
            signature.update({name: "constexpr" for name in constants})
            ptx = _build_for_hopper(ASTSource(kernel, signature, constants), setup).asm["ptx"]
            _assert_publishes_without_release(ptx)
            _assert_waits_for_the_fill_before_the_scratch(ptx, overlapped)


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


# --------------------------------------------------------------------- matmul

MATMUL_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def matmul_reference(a, b):
    return a.double() @ b.double()  # on the device: cuBLAS float64 is fast there


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", MATMUL_DTYPES)
def test_matmul_matches_float64(device, dtype):
    if device == "cuda" and dtype == torch.float64:
        with pytest.raises(TypeError, match="float64 is supported on CPU tensors only"):
            torch.ops.tk.matmul(torch.ones(2, 2, device=device, dtype=dtype), torch.ones(2, 2, device=device, dtype=dtype))
        return
    shapes = pick(device, [(1, 1, 1), (37, 70, 129), (65, 130, 17)], [(1, 1, 1), (1000, 1001, 999), (16, 4096, 4096)])
    if device == "cuda" and dtype in (torch.float16, torch.bfloat16):
        shapes += [(4096, 4096, 4096), (3000, 200, 5000)]  # each new shape costs an autotuning sweep
    for M, N, K in shapes:
        a = torch.randn(M, K, device=device, dtype=dtype)
        b = torch.randn(K, N, device=device, dtype=dtype)
        assert_close(torch.ops.tk.matmul(a, b), matmul_reference(a, b), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_matmul_of_transposed_and_strided_inputs(device, dtype):
    M, N, K = pick(device, (70, 45, 33), (1500, 1300, 1100))
    a = torch.randn(K, M, device=device, dtype=dtype).t()  # column-major
    b = torch.randn(N, 2 * K, device=device, dtype=dtype)[:, ::2].t()  # every other column, transposed
    assert not a.is_contiguous() and not b.is_contiguous()
    assert_close(torch.ops.tk.matmul(a, b), matmul_reference(a, b), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_batched_and_broadcast(device):
    B, M, N, K = pick(device, (3, 33, 20, 17), (8, 1000, 513, 768))
    dtype = torch.bfloat16
    a3 = torch.randn(B, M, K, device=device, dtype=dtype)
    b3 = torch.randn(B, K, N, device=device, dtype=dtype)
    a2, b2 = a3[0], b3[0]
    for a, b in [(a3, b3), (a3, b2), (a2, b3), (a3.transpose(1, 2).contiguous().transpose(1, 2), b3)]:
        c = torch.ops.tk.matmul(a, b)
        assert c.shape == (B, M, N)
        assert_close(c, matmul_reference(a, b), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_float32_follows_the_tf32_switch(device):
    a = torch.randn(256, 256, device=device)
    b = torch.randn(256, 256, device=device)
    exact = rel_error(torch.ops.tk.matmul(a, b), matmul_reference(a, b))
    assert exact < 1e-6  # IEEE float32 by default, like torch.matmul
    if device == "cuda":
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            tf32 = rel_error(torch.ops.tk.matmul(a, b), matmul_reference(a, b))
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
        assert 1e-5 < tf32 < 1e-2, tf32  # TF32's 10-bit mantissa shows


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_of_empty(device):
    assert torch.ops.tk.matmul(torch.randn(0, 4, device=device), torch.randn(4, 5, device=device)).shape == (0, 5)
    assert torch.ops.tk.matmul(torch.randn(3, 4, device=device), torch.randn(4, 0, device=device)).shape == (3, 0)
    zeros = torch.ops.tk.matmul(torch.randn(3, 0, device=device), torch.randn(0, 5, device=device))
    assert torch.equal(zeros, torch.zeros(3, 5, device=device))  # K == 0: a sum of nothing


def test_matmul_split_k_rule(monkeypatch):
    monkeypatch.setattr(matmul_ops, "sm_count", lambda index: 132)  # an H100
    cuda = torch.device("cuda", 0)
    assert matmul_ops._SPLIT_TILE["cuda"] == (64, 128) and matmul_ops._MIN_SPLIT_K["cuda"] == 512  # the numbers below
    assert matmul_ops._split_k(16, 4096, 4096, 1, cuda) == 4  # decoding: 32 tiles, 4 slices of 1024
    assert matmul_ops._split_k(512, 512, 8192, 1, cuda) == 4  # a weight gradient over 8192 tokens
    assert matmul_ops._split_k(1, 1, 1 << 20, 1, cuda) == 16  # at most 16 slices
    assert matmul_ops._split_k(16, 4096, 700, 1, cuda) == 1  # slices would be shorter than 512
    assert matmul_ops._split_k(1024, 1024, 1024, 1, cuda) == 1  # 128 tiles: the SMs are busy
    assert matmul_ops._split_k(16, 4096, 4096, 8, cuda) == 1  # a batch fills them too
    for M, N, K, batch in [(1, 1, 4096, 1), (64, 128, 10**6, 1), (100, 300, 5000, 3), (16, 8192, 8192, 2)]:
        split = matmul_ops._split_k(M, N, K, batch, cuda)
        tiles = -(-M // 64) * -(-N // 128) * batch
        assert split == 1 or (split * tiles <= 132 and K // split >= 512), (M, N, K, batch, split)
    assert matmul_ops._split_k(16, 64, 1000, 1, torch.device("cpu")) == 8  # the interpreter's scaled-down rule


@pytest.fixture
def slices_summed(monkeypatch):
    """The split count of every matmul whose K was split."""
    splits = []
    sum_slices = matmul_ops._sum_slices

    def spy(partial, c, split):
        splits.append(split)
        return sum_slices(partial, c, split)

    monkeypatch.setattr(matmul_ops, "_sum_slices", spy)
    return splits


@pytest.mark.parametrize("dtype", MATMUL_DTYPES)
def test_matmul_with_k_split_matches_float64(slices_summed, monkeypatch, dtype):
    """K split into slices whose float32 partial sums a second kernel adds (float64
    for float64): by the interpreter's own rule, then forced to more slices than
    K has steps, so that the last slices are empty."""
    a = torch.randn(2, 20, 1000, dtype=dtype)
    b = torch.randn(1000, 70, dtype=dtype)
    assert_close(torch.ops.tk.matmul(a[0], b), matmul_reference(a[0], b), dtype)  # 2 tiles of 64x64
    a_t = a[:, :, :200].transpose(1, 2).contiguous().transpose(1, 2)  # batched, column-major, N = 50: 2 tiles
    assert_close(torch.ops.tk.matmul(a_t, b[:200, :50]), matmul_reference(a_t, b[:200, :50]), dtype)
    assert slices_summed == [4, 3], slices_summed  # 8 "SMs" // 2 tiles = 4; then 200 // 64 = 3 slices of K
    monkeypatch.setattr(matmul_ops, "_split_k", lambda *args: 5)
    a, b = a[:, :, :100], b[:100]  # 2 steps of 64: slices 2, 3 and 4 have nothing to add
    assert_close(torch.ops.tk.matmul(a, b), matmul_reference(a, b), dtype)
    assert slices_summed[-1] == 5


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_matmul_with_k_split_on_the_gpu(slices_summed, dtype):
    """The shapes the rule splits on an H100-class GPU: decoding, a weight
    gradient, a skinny odd one.  Right answer, and the same bits on every run."""
    for M, N, K in [(16, 4096, 4096), (512, 512, 8192), (7, 1000, 3001)]:
        a = torch.randn(M, K, device="cuda", dtype=dtype)
        b = torch.randn(K, N, device="cuda", dtype=dtype)
        c = torch.ops.tk.matmul(a, b)
        assert_close(c, matmul_reference(a, b), dtype)
        assert torch.equal(c, torch.ops.tk.matmul(a, b))
    assert len(slices_summed) == 6 and min(slices_summed) > 1, slices_summed


def _four_layouts(a, b):
    """(a, b) in each combination of row-major and column-major."""
    a_t, b_t = a.t().contiguous().t(), b.t().contiguous().t()
    return [(a, b), (a_t, b), (a, b_t), (a_t, b_t)]


@pytest.fixture
def tma_launches(monkeypatch):
    """The operand layouts of every matmul that took the TMA kernel."""
    launches = []
    launch = matmul_ops._launch_tma

    def spy(a, b, c, layout_a, layout_b):
        launches.append((layout_a[0], layout_b[0]))  # (a column-major?, b column-major?)
        return launch(a, b, c, layout_a, layout_b)

    monkeypatch.setattr(matmul_ops, "_launch_tma", spy)
    return launches


def test_matmul_tma_rule(monkeypatch):
    """Which operands a TMA descriptor can describe, and which problems go to the TMA kernel."""
    x = torch.randn(64, 96, dtype=torch.bfloat16)
    assert matmul_ops._tma_layout(x) == (False, 96)
    assert matmul_ops._tma_layout(x.t()) == (True, 96)
    assert matmul_ops._tma_layout(x[:, 8:]) == (False, 96)  # 16 bytes in: still aligned
    assert matmul_ops._tma_layout(x[:, 1:]) is None  # the base address is 2 bytes off
    assert matmul_ops._tma_layout(x[:, ::2]) is None  # no unit stride
    assert matmul_ops._tma_layout(x.flatten().as_strided((64, 96), (8, 1))) is None  # overlapping rows
    assert matmul_ops._tma_layout(x.flatten()[:96].expand(64, 96)) is None  # one row, repeated (stride 0)
    assert matmul_ops._tma_layout(torch.randn(64, 100, dtype=torch.float16)) is None  # rows 200 bytes apart
    assert matmul_ops._tma_layout(torch.randn(64, 100)) == (False, 100)  # 400 bytes apart

    def layouts(a, b, split=1):
        return matmul_ops._tma_layouts(a, b, a.shape[-2], b.shape[-1], split)

    a, b = torch.randn(136, 96, dtype=torch.bfloat16), torch.randn(96, 264, dtype=torch.bfloat16)
    assert layouts(a, b) is None  # the CPU has no TMA unit
    monkeypatch.setattr(matmul_ops, "tma_available", lambda device: True)
    assert layouts(a, b) == ((False, 96), (False, 264))  # 15 tiles of 64x64 for 8 "SMs"
    assert layouts(a.t().contiguous().t(), b.t().contiguous().t()) == ((True, 136), (True, 96))
    assert layouts(a[:130].t().contiguous().t(), b) is None  # its columns would be 260 bytes apart
    assert layouts(a, b, split=2) is None  # split K takes the pointer kernel
    assert layouts(a[:100], b[:, :100]) is None  # 4 tiles: too few to fill the "SMs"
    assert layouts(a, b[:, :260]) is None  # C's rows would be 520 bytes apart
    assert layouts(a.float(), b.float()) is None  # 16-bit operands only
    assert layouts(a[None], b) is None  # batches take the pointer kernel


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matmul_tma_kernel_matches_float64(tma_launches, monkeypatch, dtype):
    """The TMA kernel under the interpreter: each layout, edges that cut tiles in
    M, N and K, and more tiles than programs (the persistent loop's second round)."""
    monkeypatch.setattr(matmul_ops, "tma_available", lambda device: True)
    for M, N, K in [(136, 600, 72), (520, 136, 8)]:
        a = torch.randn(M, K, dtype=dtype)
        b = torch.randn(K, N, dtype=dtype)
        for a_, b_ in _four_layouts(a, b):
            assert_close(torch.ops.tk.matmul(a_, b_), matmul_reference(a_, b_), dtype)
    assert tma_launches == [(False, False), (True, False), (False, True), (True, True)] * 2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matmul_tma_kernel_on_the_gpu(tma_launches, dtype):
    """Hopper and newer: each layout through the TMA kernel, at sizes that cut
    every kind of tile; a misaligned view falls back to the pointer kernel."""
    M, N, K = 2312, 2120, 1000  # multiples of 8 (16-byte strides either way), of no tile size
    a = torch.randn(M, K + 8, device="cuda", dtype=dtype)
    b = torch.randn(K, N, device="cuda", dtype=dtype)
    for a_, b_ in _four_layouts(a[:, :K], b):
        assert_close(torch.ops.tk.matmul(a_, b_), matmul_reference(a_, b_), dtype)
    assert_close(torch.ops.tk.matmul(a[:, 1 : K + 1], b), matmul_reference(a[:, 1 : K + 1], b), dtype)
    compiled = torch.compile(lambda a, b: torch.ops.tk.matmul(a, b), fullgraph=True)  # Inductor launches it
    a_t = a[:, :K].t().contiguous().t()
    assert_close(compiled(a_t, b), matmul_reference(a_t, b), dtype)
    if torch.cuda.get_device_capability()[0] >= 9:
        assert tma_launches[:4] == [(False, False), (True, False), (False, True), (True, True)], tma_launches
        assert tma_launches[4:] and set(tma_launches[4:]) == {(True, False)}  # traced (once or more) for Inductor
    else:
        assert tma_launches == []


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shapes", [((37, 20), (20, 45)), ((3, 17, 20), (3, 20, 9)), ((3, 17, 20), (20, 9)), ((17, 20), (3, 20, 9))])
def test_matmul_backward_matches_pytorch(device, shapes):
    dtype = torch.float32
    a = torch.randn(shapes[0], device=device, dtype=dtype, requires_grad=True)
    b = torch.randn(shapes[1], device=device, dtype=dtype, requires_grad=True)
    out = torch.ops.tk.matmul(a, b)
    grad = torch.randn_like(out)
    out.backward(grad)
    a64, b64 = leaf64(a), leaf64(b)
    torch.matmul(a64, b64).backward(grad.double())
    assert_close(a.grad, a64.grad, dtype)
    assert_close(b.grad, b64.grad, dtype)


def test_matmul_gradcheck():
    for sa, sb in [((7, 5), (5, 6)), ((2, 7, 5), (5, 6)), ((7, 5), (2, 5, 6))]:
        a = torch.randn(sa, dtype=torch.float64, requires_grad=True)
        b = torch.randn(sb, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(torch.ops.tk.matmul, (a, b), fast_mode=True)


@pytest.mark.parametrize("device", DEVICES)
def test_gelu_tanh_keeps_its_far_negative_tail(device):
    """0.5 * x * (1 + tanh(u)) rounds to 0 below about x = -6 in float32; x * sigmoid(2u) does not."""
    x = torch.linspace(-9, -5, 101, device=device)  # below -9 the exact answer underflows float32
    y = torch.ops.tk.gelu(x, "tanh")
    u = 0.7978845608028654 * (x.double() + 0.044715 * x.double() ** 3)
    exact = x.double() * torch.sigmoid(2 * u)  # the same function, in float64
    assert (y < 0).all()
    assert_close(y, exact, torch.float32)
