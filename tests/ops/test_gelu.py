"""gelu against a float64 reference: dtypes, odd shapes, strides, empties, gradients, every 16-bit value.

Each test runs on the CPU (the Triton kernels through the interpreter, small
sizes) and on CUDA (compiled kernels, realistic sizes; marked `gpu`).
"""


import pytest
import torch
import torch.nn.functional as F
from reference import DEVICES, DTYPES, assert_close, leaf64, pytorch_gelu, strided_versions

from ops import gelu as gelu_ops  # the modules, for their design constants


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


@pytest.mark.parametrize("device", DEVICES)
def test_gelu_tanh_keeps_its_far_negative_tail(device):
    """0.5 * x * (1 + tanh(u)) rounds to 0 below about x = -6 in float32; x * sigmoid(2u) does not."""
    x = torch.linspace(-9, -5, 101, device=device)  # below -9 the exact answer underflows float32
    y = torch.ops.tk.gelu(x, "tanh")
    u = 0.7978845608028654 * (x.double() + 0.044715 * x.double() ** 3)
    exact = x.double() * torch.sigmoid(2 * u)  # the same function, in float64
    assert (y < 0).all()
    assert_close(y, exact, torch.float32)
