"""swiglu and geglu: the fused gates of gated MLPs, forward and backward, against float64."""


import pytest
import torch
import torch.nn.functional as F
from reference import (
    DEVICES,
    DTYPES,
    assert_close,
)
from test_elementwise import backward, float64_backward, layouts, pick  # the family's helpers

# sigmoid(x) = 1 / (1 + exp(-x)): for x below about -88, exp overflows to inf in
# float32 and the sigmoid is 0, as it should be; numpy (the interpreter) warns.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

tk = torch.ops.tk
def gelu_tanh(x):
    """F.gelu(x, approximate="tanh") as x * sigmoid(2u): the same function, but
    0.5 * (1 + tanh(u)) cancels for x below about -6, even in float64."""
    return x * torch.sigmoid(2 * (2 / torch.pi) ** 0.5 * (x + 0.044715 * x**3))


GATES = {
    "swiglu": (lambda g, u: tk.swiglu(g, u), lambda g, u: F.silu(g) * u),
    "geglu-tanh": (lambda g, u: tk.geglu(g, u, "tanh"), lambda g, u: gelu_tanh(g) * u),
    "geglu-none": (lambda g, u: tk.geglu(g, u, "none"), lambda g, u: F.gelu(g, approximate="none") * u),
}


def test_geglu_approximates_with_tanh_by_default():
    gate, up = 3 * torch.randn(2, 999, dtype=torch.float64)
    assert torch.equal(tk.geglu(gate, up), tk.geglu(gate, up, "tanh"))
    assert not torch.equal(tk.geglu(gate, up), tk.geglu(gate, up, "none"))


def test_the_tanh_gelu_reference_is_pytorchs():
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(gelu_tanh(x), F.gelu(x, approximate="tanh"), rtol=1e-12, atol=1e-12)
    (grad,) = torch.autograd.grad(gelu_tanh(x).sum(), x)
    (want,) = torch.autograd.grad(F.gelu(x, approximate="tanh").sum(), x)
    torch.testing.assert_close(grad, want, rtol=1e-12, atol=1e-12)


def gate_shapes(device):
    # No single elements here: with random values, one far in the negative tail
    # would measure only the erf form's cancellation there (see ops/swiglu.py);
    # test_gates_at_extreme_values and test_gates_of_empty_and_0d cover them.
    return pick(device, [(5, 1000), (3, 7, 13), (2 * 65536 + 3,)], [(1, 4096), (1000, 4099), (4096, 14336)])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", GATES)
def test_gates_match_float64(device, dtype, name):
    tk_fn, torch_fn = GATES[name]
    for shape in gate_shapes(device):
        gate = 3 * torch.randn(shape, device=device, dtype=dtype)
        up = torch.randn(shape, device=device, dtype=dtype)
        pairs = [(lg, g, lu, u) for lg, g in layouts(gate) for lu, u in layouts(up) if lg == lu or lu == "contiguous"]
        for layout_gate, g, layout_up, u in pairs:
            out = tk_fn(g, u)
            assert out.shape == g.shape, (layout_gate, layout_up)
            assert_close(out, torch_fn(g.double(), u.double()), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["swiglu", "geglu-none"])
def test_gates_of_the_halves_of_a_fused_projection(device, name):
    tk_fn, torch_fn = GATES[name]
    projected = torch.randn(pick(device, (33, 2 * 70), (4096, 2 * 14336)), device=device, dtype=torch.bfloat16)
    gate, up = projected.chunk(2, dim=-1)  # strided views: copied once each
    assert_close(tk_fn(gate, up), torch_fn(gate.double(), up.double()), torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", GATES)
def test_gates_backward_matches_pytorch(device, dtype, name):
    tk_fn, torch_fn = GATES[name]
    shape = pick(device, (37, 129), (4096, 4097))
    gate = 3 * torch.randn(shape, device=device, dtype=dtype)
    up = torch.randn(shape, device=device, dtype=dtype)
    for layout, grad in layouts(torch.randn_like(gate)):
        d_gate, d_up = backward(tk_fn, gate, up, grad=grad)
        d_gate64, d_up64 = float64_backward(torch_fn, gate, up, grad=grad)
        assert_close(d_gate, d_gate64, dtype)
        assert_close(d_up, d_up64, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_gates_backward_ops_compute_both_gradients_in_one_call(device):
    gate, up, grad = torch.randn(3, 9, 31, device=device, dtype=torch.float64)
    s = torch.sigmoid(gate)
    d_gate, d_up = tk.swiglu_backward(grad, gate, up)
    assert_close(d_gate, grad * up * (s + gate * s * (1 - s)), torch.float64)
    assert_close(d_up, grad * gate * s, torch.float64)
    for approximate in ["none", "tanh"]:
        d_gate, d_up = tk.geglu_backward(grad, gate, up, approximate)
        (d_gate64,) = float64_backward(lambda g: F.gelu(g, approximate=approximate), gate, grad=grad * up)
        assert_close(d_gate, d_gate64, torch.float64)
        assert_close(d_up, grad * F.gelu(gate, approximate=approximate), torch.float64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gates_at_extreme_values(device, dtype):
    """Large gates saturate sigmoid and tanh: no overflow to NaN, same answer as PyTorch."""
    gate = torch.tensor([-1e4, -100.0, -30.0, -5.0, 0.0, 5.0, 30.0, 100.0, 1e4], device=device).to(dtype)
    up = torch.linspace(-2, 2, gate.numel(), device=device).to(dtype)
    grad = torch.ones_like(gate)
    for name, (tk_fn, torch_fn) in GATES.items():
        out = tk_fn(gate, up)
        assert torch.isfinite(out).all(), name
        # atol: the erf form keeps only its absolute precision in the far negative tail
        torch.testing.assert_close(out.double(), torch_fn(gate.double(), up.double()), rtol=1e-2, atol=1e-5)
        for got, want in zip(backward(tk_fn, gate, up, grad=grad), float64_backward(torch_fn, gate, up, grad=grad)):
            assert torch.isfinite(got).all(), name
            torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_gates_of_empty_and_0d(device):
    gate, up = torch.tensor(-1.25, device=device), torch.tensor(0.75, device=device)
    for name, (tk_fn, torch_fn) in GATES.items():
        assert_close(tk_fn(gate, up), torch_fn(gate.double(), up.double()), torch.float32)
        assert_close(tk_fn(gate[None], up[None]), torch_fn(gate[None].double(), up[None].double()), torch.float32)
    for shape in [(0,), (0, 5), (5, 0)]:
        gate, up = torch.empty(shape, device=device), torch.empty(shape, device=device)
        for name, (tk_fn, _) in GATES.items():
            assert tk_fn(gate, up).shape == shape, name
        assert [t.shape for t in tk.swiglu_backward(gate, gate, up)] == [shape, shape]
        assert [t.shape for t in tk.geglu_backward(gate, gate, up, "none")] == [shape, shape]
