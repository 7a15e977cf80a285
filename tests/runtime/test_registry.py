"""The ops as PyTorch sees them: opcheck, clear errors, torch.compile, the registry."""

import pytest
import torch
import torch.nn.functional as F
from reference import DEVICES, assert_close, assert_raises_clearly, error_cases, leaf64

import ops


# (op, args, kwargs) for opcheck, on small inputs of each device.
def opcheck_cases(device):
    def t(*shape, grad=False, dtype=torch.float32):
        return torch.randn(shape, device=device, dtype=dtype, requires_grad=grad)

    return [
        (torch.ops.tk.gelu.default, (t(5, 7, grad=True),), {"approximate": "tanh"}),
        (torch.ops.tk.gelu.default, (t(4, 1, 3).transpose(0, 2),), {}),
        (torch.ops.tk.gelu_backward.default, (t(5, 7), t(5, 7), "none"), {}),
        (torch.ops.tk.softmax.default, (t(5, 7, grad=True), 0), {}),
        (torch.ops.tk.softmax.default, (t(3, 4, 5, dtype=torch.bfloat16), -1), {}),
        (torch.ops.tk.softmax_backward.default, (t(5, 7), t(5, 7), 1), {}),
        (torch.ops.tk.matmul.default, (t(5, 7, grad=True), t(7, 3, grad=True)), {}),
        (torch.ops.tk.matmul.default, (t(2, 5, 7, grad=True), t(7, 3, grad=True)), {}),
        (torch.ops.tk.matmul_backward.default, (t(5, 3), t(5, 7), t(7, 3), True, True), {}),
        (torch.ops.tk.matmul_backward.default, (t(2, 5, 3), t(5, 7), t(2, 7, 3), True, False), {}),
        (torch.ops.tk.rope.default, (t(1, 2, 3, 8, grad=True), t(1, 1, 3, 8, grad=True), t(1, 3, 8), t(1, 3, 8)), {}),
        (torch.ops.tk.rope_backward.default, (t(1, 2, 3, 8), t(1, 1, 3, 8), t(1, 3, 8), t(1, 3, 8), 1, torch.bfloat16), {}),
    ]


@pytest.mark.timeout(900)  # pytest-timeout's limit, where installed: compiles or autotunes for minutes on a GPU
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for op, args, kwargs in opcheck_cases(device):
        torch.library.opcheck(op, args, kwargs)


def test_every_op_is_in_the_tk_namespace_with_a_spec():
    for name in ["gelu", "softmax", "matmul"]:
        assert hasattr(torch.ops.tk, name)
        spec = ops.get_spec(name)
        assert set(spec.tolerance) >= set(spec.dtypes)
        assert spec.shapes["cpu"] and spec.shapes["cuda"]
    with pytest.raises(KeyError, match="unknown op 'nope'; known ops: .*gelu.*matmul.*softmax"):
        ops.get_spec("nope")


# --------------------------------------------------------------------- errors

ERROR_CASES = [
    ("gelu int", lambda: torch.ops.tk.gelu(torch.ones(3, dtype=torch.int64)), TypeError, "x has dtype int64"),
    ("gelu bool", lambda: torch.ops.tk.gelu(torch.ones(3, dtype=torch.bool)), TypeError, "x has dtype bool"),
    ("gelu approximate", lambda: torch.ops.tk.gelu(torch.ones(3), "fast"), ValueError, "approximate must be"),
    ("softmax int", lambda: torch.ops.tk.softmax(torch.ones(3, dtype=torch.int32), 0), TypeError, "x has dtype int32"),
    ("softmax dim", lambda: torch.ops.tk.softmax(torch.ones(3, 4), 2), IndexError, "dim 2 is out of range"),
    ("softmax dim neg", lambda: torch.ops.tk.softmax(torch.ones(3, 4), -3), IndexError, "dim -3 is out of range"),
    (
        "softmax_backward shapes",
        lambda: torch.ops.tk.softmax_backward(torch.ones(3, 4), torch.ones(4, 3), 0),
        ValueError,
        "grad has shape",
    ),
    (
        "matmul inner",
        lambda: torch.ops.tk.matmul(torch.ones(3, 4), torch.ones(5, 6)),
        ValueError,
        "inner dimensions 4 and 5 differ",
    ),
    ("matmul rank 1", lambda: torch.ops.tk.matmul(torch.ones(3), torch.ones(3, 3)), ValueError, "a must be 2 or 3-D"),
    (
        "matmul_backward grad shape",
        lambda: torch.ops.tk.matmul_backward(torch.ones(3, 5), torch.ones(3, 4), torch.ones(4, 6), True, True),
        ValueError,
        r"grad has shape \(3, 5\), the product's is \(3, 6\)",
    ),
    (
        "matmul_backward grad dtype",
        lambda: torch.ops.tk.matmul_backward(torch.ones(3, 6).half(), torch.ones(3, 4), torch.ones(4, 6), True, True),
        TypeError,
        "grad has dtype torch.float16 but a has dtype torch.float32",
    ),
    (
        "matmul rank 4",
        lambda: torch.ops.tk.matmul(torch.ones(3, 3), torch.ones(1, 1, 3, 3)),
        ValueError,
        "b must be 2 or 3-D",
    ),
    (
        "matmul batch",
        lambda: torch.ops.tk.matmul(torch.ones(2, 3, 4), torch.ones(3, 4, 5)),
        ValueError,
        "batch sizes differ: a has 2, b has 3",
    ),
    (
        "matmul dtypes",
        lambda: torch.ops.tk.matmul(torch.ones(3, 4), torch.ones(4, 5, dtype=torch.float16)),
        TypeError,
        "a has dtype torch.float32 but b has dtype torch.float16",
    ),
    (
        "matmul devices",
        lambda: torch.ops.tk.matmul(torch.ones(3, 4), torch.ones(4, 5, device="meta")),
        ValueError,
        "a is on cpu but b is on meta",
    ),
    ("matmul int", lambda: torch.ops.tk.matmul(torch.ones(3, 4, dtype=torch.int8), torch.ones(4, 5)), TypeError, "a has dtype int8"),
]


@error_cases(ERROR_CASES)
def test_bad_input_raises_a_clear_error(case):
    assert_raises_clearly(case)


@pytest.mark.gpu
def test_device_mismatch_on_cuda():
    with pytest.raises(ValueError, match="a is on cuda:0 but b is on cpu"):
        torch.ops.tk.matmul(torch.ones(3, 4, device="cuda"), torch.ones(4, 5))


# -------------------------------------------------------- torch.compile model


class TinyMLP(torch.nn.Module):
    """A model that calls the three ops the way a user would."""

    def __init__(self, dim=48, hidden=80, classes=10):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(dim, hidden) / dim**0.5)
        self.w2 = torch.nn.Parameter(torch.randn(hidden, classes) / hidden**0.5)

    def forward(self, x):
        h = torch.ops.tk.gelu(torch.ops.tk.matmul(x, self.w1), "tanh")
        return torch.ops.tk.softmax(torch.ops.tk.matmul(h, self.w2), -1)


class TorchMLP(TinyMLP):
    def forward(self, x):
        h = F.gelu(x @ self.w1, approximate="tanh")
        return torch.softmax(h @ self.w2, -1)


@pytest.mark.timeout(900)  # pytest-timeout's limit, where installed: compiles or autotunes for minutes on a GPU
@pytest.mark.parametrize("device", DEVICES)
def test_compiled_model_matches_eager_and_pytorch(device):
    torch._dynamo.reset()
    model = TinyMLP().to(device)
    x = torch.randn(37, 48, device=device)
    compiled = torch.compile(model, fullgraph=True)  # fullgraph: any graph break is an error

    eager_out = model(x)
    compiled_out = compiled(x)
    torch.testing.assert_close(compiled_out, eager_out, rtol=1e-5, atol=1e-6)

    reference = TorchMLP().to(device)
    reference.load_state_dict(model.state_dict())
    torch.testing.assert_close(eager_out, reference(x), rtol=1e-4, atol=1e-6)

    target = torch.randn_like(eager_out)
    (compiled_out * target).sum().backward()
    compiled_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    (reference(x) * target).sum().backward()
    for got, want in zip(compiled_grads, [p.grad for p in reference.parameters()]):
        assert_close(got, want.double(), torch.float32, scale=10)


def test_compiled_cpu_graph_calls_the_interpreted_ops():
    """On CPU the compiled graph keeps tk's opaque CPU ops (the Triton kernels, interpreted)."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    model = TinyMLP()
    _, code = run_and_get_code(torch.compile(model, fullgraph=True), torch.randn(5, 48))
    source = "\n".join(code)
    for op in ["tk.matmul_cpu", "tk.gelu_cpu", "tk.softmax_cpu"]:
        assert op in source, f"{op} missing from the compiled code"


@pytest.mark.gpu
def test_compiled_cuda_graph_contains_the_hand_written_kernels():
    """On CUDA, Inductor's output code launches tk's own Triton kernels."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    model = TinyMLP().cuda()
    x = torch.randn(64, 48, device="cuda", requires_grad=False)
    _, code = run_and_get_code(torch.compile(model, fullgraph=True), x)
    source = "\n".join(code)
    for kernel in ["matmul_kernel", "gelu_forward_kernel", "softmax_forward_kernel"]:
        assert kernel in source, f"{kernel} missing from Inductor's output code"
    assert "tk.gelu_cpu" not in source


def test_float64_gradients_through_the_model():
    model = TinyMLP().double()
    x = leaf64(torch.randn(4, 48))
    assert torch.autograd.gradcheck(lambda t: model(t), (x,), fast_mode=True)


def test_eager_calls_have_a_direct_kernel():
    """Eager calls skip custom_op's Python wrappers: each op has kernels for
    the AutogradCUDA, CUDA, AutogradCPU and CPU keys, while tracing keeps the
    triton_op (Autograd and CompositeExplicitAutograd registrations from
    torch.library)."""
    names = ["gelu", "gelu_backward", "softmax", "softmax_backward", "matmul", "matmul_backward", "copy", "square"]
    names += ["square_backward"]
    names += ["add", "rgb_to_grayscale", "rgb_to_grayscale_backward", "swiglu", "swiglu_backward", "geglu", "geglu_backward"]
    names += ["cross_entropy_forward", "cross_entropy_backward", "rms_norm", "rms_norm_backward", "layer_norm", "layer_norm_backward"]
    names += ["rope", "rope_backward", "linear_cross_entropy_forward", "linear_cross_entropy_backward"]
    from ops.runtime.library import NATIVE_CUDA as _NATIVE_CUDA

    for name in names:
        table = torch._C._dispatch_dump(f"tk::{name}")
        for key in ("AutogradCUDA", "CUDA", "AutogradCPU", "CPU"):
            line = table.split(f"\n{key}:")[1].splitlines()[0]
            home = "ops/runtime/native.cpp" if _NATIVE_CUDA and "CUDA" in key else "ops/runtime/library.py"  # C++ in front on GPUs; tk's fragment
            assert home in line, f"{name}: {key} kernel is {line}"
        assert "Autograd[alias]" in table and "CompositeExplicitAutograd[alias]" in table


def test_the_eager_route_sends_grads_and_tracing_elsewhere():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from ops.runtime.registry import _GRAD, _PLAIN, _TRACED, _eager_route

    x = torch.randn(3)
    assert _eager_route((x, "tanh")) == _PLAIN
    assert _eager_route((torch.nn.Parameter(x.clone()).detach(),)) == _PLAIN
    leaf = x.clone().requires_grad_()
    assert _eager_route((x, leaf)) == _GRAD
    with torch.no_grad():
        assert _eager_route((leaf,)) == _PLAIN
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(x)
        assert _eager_route((fake,)) == _TRACED

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Watch():
        assert _eager_route((x,)) == _TRACED
        assert _eager_route((leaf,)) == _TRACED


@pytest.mark.parametrize("device", DEVICES)
def test_eager_gradients_take_the_direct_autograd_function(device, monkeypatch):
    """An eager call that needs a gradient runs the op's own formula in a plain
    autograd.Function around the body; its gradients are custom_op's, bit for bit.
    Covers an argument left to its default (setup_context still sees it), a
    second input without a gradient, and a tuple output."""
    from ops.runtime import registry as _registry

    dtype = torch.float64 if device == "cpu" else torch.float32  # tk.matmul has no float64 on CUDA
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 37, generator=gen, dtype=torch.float64).to(device, dtype)
    w = torch.randn(37, 11, generator=gen, dtype=torch.float64).to(device, dtype)
    target = torch.randint(0, 37, (6,), generator=gen).to(device)
    cases = {
        "gelu": lambda t: torch.ops.tk.gelu(t),  # approximate left to its default
        "softmax": lambda t: torch.ops.tk.softmax(t, -1),
        "matmul": lambda t: torch.ops.tk.matmul(t, w),  # w needs no gradient
        "cross_entropy_forward": lambda t: torch.ops.tk.cross_entropy_forward(t, target, -100, "none", 0.0)[0],
    }

    def upstream(y):  # the same random upstream gradient for every route (a constant one gives softmax 0)
        return torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(device, y.dtype)

    def grads(route):
        out = {}
        for name, f in cases.items():
            leaf = x.clone().requires_grad_()
            y = f(leaf)
            assert type(y.grad_fn).__name__.startswith(route.format(name=name)), (name, type(y.grad_fn).__name__)
            (out[name],) = torch.autograd.grad(y, leaf, upstream(y))
        return out

    direct = grads("{name}_directBackward")
    monkeypatch.setattr(_registry._DirectAutograd, "ready", lambda self: False)
    generated = grads("GeneratedBackwardFor_tk_{name}")
    for name in cases:
        assert torch.equal(direct[name], generated[name]), name
    reference = {
        "gelu": F.gelu, "softmax": lambda t: torch.softmax(t, -1), "matmul": lambda t: t @ w.double(),
        "cross_entropy_forward": lambda t: F.cross_entropy(t, target, reduction="none"),
    }  # fmt: skip
    for name, f in reference.items():
        leaf = leaf64(x)
        y = f(leaf)
        (want,) = torch.autograd.grad(y, leaf, upstream(y))
        assert_close(direct[name], want, dtype)


def test_double_backward_through_the_direct_path_says_there_is_no_formula():
    """The backward ops have no formula of their own: create_graph=True and a
    second grad fail with torch.library's message, not a wrong answer."""
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    (dx,) = torch.autograd.grad(torch.ops.tk.gelu(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="no autograd formula"):
        torch.autograd.grad(dx.sum(), x)


def test_a_saved_tensor_changed_in_place_is_caught_at_backward():
    """The direct autograd path saves what the formula needs with
    save_for_backward (gelu and matmul their inputs, softmax its output), so
    autograd's version counter sees an in-place change and refuses to compute
    a stale gradient, as for PyTorch's own ops.  softmax does not need its
    input: changing that is fine."""
    cases = [(torch.ops.tk.gelu, "input"), (lambda t: torch.ops.tk.matmul(t, t.T), "input"),
             (lambda t: torch.ops.tk.softmax(t, -1), "output")]  # fmt: skip
    for forward, saved in cases:
        x = torch.randn(4, 4, requires_grad=True).clone()
        y = forward(x)
        (x if saved == "input" else y).mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
    x = torch.randn(4, 4, requires_grad=True).clone()
    y = torch.ops.tk.softmax(x, -1)
    x.mul_(2)  # softmax's input is not saved: the backward runs
    y.sum().backward()


# Ops whose harness call traces on fake CUDA tensors anywhere (cross entropy, the fused loss and rope build
# their inputs or references with calls that need a CUDA build: not listed).
_FAKE_CUDA_OPS = ["add", "copy", "cross_entropy_backward", "geglu", "gelu", "gelu_backward", "gelu_tanh",
                  "gelu_tanh_backward", "layer_norm", "layer_norm_backward", "matmul", "rgb_to_grayscale", "rms_norm",
                  "rms_norm_backward", "softmax", "softmax_backward", "square", "swiglu"]  # fmt: skip


@pytest.mark.parametrize("name", _FAKE_CUDA_OPS)
def test_calls_on_fake_cuda_tensors_trace_without_a_gpu(name):
    """A CUDA call traced on fake tensors (export, compile) plans as on the GPU, on a host without one too:
    the device's facts are then the H100's (DeviceFacts), not an error from torch.cuda.  Its results have
    the reference's shapes and dtypes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    spec = ops.get_spec(name)
    with FakeTensorMode():
        args = spec.make_inputs(spec.shapes["cuda"][0], torch.bfloat16, torch.device("cuda"))
        got, want = spec.tk(*args), spec.reference(*args)
    got, want = (out if isinstance(out, tuple) else (out,) for out in (got, want))
    assert [(g.shape, g.dtype, g.device.type) for g in got] == [(w.shape, w.dtype, "cuda") for w in want]
