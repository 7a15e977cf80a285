"""tk ops under torch.autocast cast their inputs as PyTorch casts the op each one stands in for.

The expected dtypes are not written down here: each op is run next to its
spec's PyTorch reference under the same autocast, on the CPU and (marked
`gpu`) on CUDA, whose autocast lists differ.  So a PyTorch release that moves
an op between its lists fails this test rather than leaving tk behind.
"""

import pytest
import torch
import torch.nn.functional as F
from reference import DEVICES, TOLERANCE, rel_error
from test_model import CPU_CASE, CUDA_CASE, assert_as_accurate, loss_and_grads, make_batch, make_model

import ops  # noqa: F401
from examples.gpt_block import TK_OPS, TORCH_OPS
from ops.runtime import native as _native
from ops.runtime.autocast import (
    FLOAT32,
    FLOAT32_RESULT,
    LOWER_PRECISION,
    POLICIES,
    _autocast_kernel,
    autocast_key,
    follow_autocast,
)
from ops.spec import SPECS

AUTOCAST_DTYPES = [torch.bfloat16, torch.float16]


def outputs(result):
    return result if isinstance(result, tuple) else (result,)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("autocast_dtype", AUTOCAST_DTYPES)
@pytest.mark.parametrize("name", sorted(SPECS))
def test_each_op_gives_the_dtype_pytorch_gives_under_autocast(device, autocast_dtype, name):
    """float32 inputs: the lists cast them (matmul) or keep them; the values stay PyTorch's."""
    spec = SPECS[name]
    inputs = spec.make_inputs(spec.shapes["cpu"][0], torch.float32, device)
    with torch.autocast(device, dtype=autocast_dtype):
        got, want = outputs(spec.tk(*inputs)), outputs(spec.reference(*inputs))
    # An op on the lower-precision list computes in the autocast dtype even where its result is
    # float32 (linear cross entropy's loss and float32 leaves' gradients come through 16-bit logits,
    # as F.linear's): its roundings are the autocast dtype's, and two routes to the same 16-bit
    # logits (cuBLAS into a padded buffer, or F.linear) may round a logit the other way.
    lowest = autocast_dtype if POLICIES.get(name, {}).get(device) == LOWER_PRECISION else None
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype, f"{name}: tk gives {g.dtype}, PyTorch {w.dtype}"
        # Both computed from the same cast inputs: apart by two roundings at most.
        tolerance = max(TOLERANCE.get(g.dtype, 0.0), TOLERANCE[lowest] if lowest else 0.0)
        assert rel_error(g, w) <= 2 * tolerance + 1e-6, name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("autocast_dtype", AUTOCAST_DTYPES)
def test_16bit_inputs_under_autocast(device, autocast_dtype):
    """Inputs already in a 16-bit dtype: float32 where PyTorch's list says so (softmax and layer_norm
    on CUDA, cross_entropy everywhere), the autocast dtype for matmul, as they came elsewhere."""
    other = torch.float16 if autocast_dtype == torch.bfloat16 else torch.bfloat16
    for name in ("matmul", "softmax", "layer_norm", "rms_norm", "cross_entropy", "gelu"):
        spec = SPECS[name]
        inputs = spec.make_inputs(spec.shapes["cpu"][0], other, device)
        with torch.autocast(device, dtype=autocast_dtype):
            got, want = spec.tk(*inputs), spec.reference(*inputs)
        assert got.dtype == want.dtype, f"{name}: tk gives {got.dtype}, PyTorch {want.dtype}"


def test_float64_is_not_cast():
    a, b = torch.randn(5, 6, dtype=torch.float64), torch.randn(6, 7, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.ops.tk.matmul(a, b).dtype == torch.matmul(a, b).dtype == torch.float64


def test_without_autocast_nothing_is_cast():
    a, b = torch.randn(5, 6), torch.randn(6, 7)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        assert torch.ops.tk.matmul(a, b).dtype == torch.float32
    assert torch.ops.tk.matmul(a, b).dtype == torch.float32


def test_a_float32_weight_meets_an_autocast_activation():
    """The first thing that broke an autocast model: an activation autocast left in bfloat16 times a
    float32 weight.  Gradients reach the float32 leaves in float32, through the cast."""
    x, w1, w2 = (torch.randn(s, requires_grad=True) for s in [(8, 16), (16, 12), (12, 4)])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = torch.ops.tk.matmul(x, w1)
        out = torch.ops.tk.matmul(h, w2)
        want = torch.matmul(torch.matmul(x, w1), w2)
    assert h.dtype == out.dtype == want.dtype == torch.bfloat16
    assert rel_error(out, want) <= 2 * TOLERANCE[torch.bfloat16]
    out.float().sum().backward()
    assert x.grad.dtype == w1.grad.dtype == w2.grad.dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
def test_an_autocast_training_step_of_the_tk_model_matches_pytorchs(device):
    """The GPT block of examples/ with float32 weights, forward and backward under autocast in
    bfloat16: tk's loss and gradients have PyTorch's dtypes and are as accurate as PyTorch's."""
    config, batch, seq = CUDA_CASE if device == "cuda" else CPU_CASE
    torch_model = make_model(config, device)
    tk_model = torch_model.with_ops(TK_OPS)
    ref64 = torch_model.with_ops(TORCH_OPS).double()
    tokens, targets = make_batch(config, batch, seq, device)
    with torch.autocast(device, dtype=torch.bfloat16):
        tk_loss, tk_grads = loss_and_grads(tk_model, tokens, targets)
        torch_loss, torch_grads = loss_and_grads(torch_model, tokens, targets)
    loss64, grads64 = loss_and_grads(ref64, tokens, targets)
    assert_as_accurate("loss", tk_loss, torch_loss, loss64, torch.bfloat16)
    for name, grad in tk_grads.items():
        assert_as_accurate(f"grad of {name}", grad, torch_grads[name], grads64[name], torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_under_autocast_matches_eager(device):
    """tk's results compiled are eager's (dtypes and values); their dtypes are PyTorch's own ops'.
    (PyTorch's eager and compiled F.cross_entropy under CUDA autocast differ by 7e-5 relative at
    this size on torch 2.11; tk's loss is the float64 one's to 3e-8 both ways, so it is checked
    against float64, and PyTorch's ops only for their dtypes.)"""
    a, b = torch.randn(64, 48, device=device), torch.randn(48, 80, device=device)
    target = torch.arange(64, device=device) % 80

    def f(a, b):
        with torch.autocast(device, dtype=torch.bfloat16):
            product = torch.ops.tk.matmul(a, b)
            tk_results = (
                product,
                torch.ops.tk.softmax(product, -1),
                torch.ops.tk.cross_entropy(product, target),
                torch.ops.tk.layer_norm(product, [80], None, None, 1e-5),
            )
            torch_results = (
                torch.softmax(product, -1),
                torch.nn.functional.cross_entropy(product, target),
                F.layer_norm(product, (80,), None, None, 1e-5),
            )
            return tk_results, torch_results

    torch._dynamo.reset()
    compiled, compiled_torch = torch.compile(f, fullgraph=True)(a, b)
    eager, eager_torch = f(a, b)
    for c, e in zip(compiled, eager, strict=True):
        assert c.dtype == e.dtype
        torch.testing.assert_close(c, e)
    assert [t.dtype for t in compiled[1:]] == [t.dtype for t in compiled_torch] == [t.dtype for t in eager_torch]
    assert compiled[0].dtype == torch.bfloat16 and compiled[2].dtype == torch.float32
    loss64 = torch.nn.functional.cross_entropy(eager[0].double(), target)
    assert abs(compiled[2].double() - loss64).item() <= 1e-6 * abs(loss64).item()


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown autocast policy 'float8' for cpu"):
        follow_autocast("gelu", {"cpu": "float8"})
    with pytest.raises(ValueError, match="policy 'float32_result' needs a `dtype` argument"):
        follow_autocast("gelu", {"cpu": FLOAT32_RESULT})


@pytest.mark.gpu
def test_cross_entropy_under_autocast_makes_no_float32_copy_of_the_logits():
    """F.cross_entropy under autocast casts the logits to float32 (kept for its backward too);
    tk asks for a float32 loss instead: the same loss and a bfloat16 gradient, and no copy."""
    logits = torch.randn(4096, 32000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, 32000, (4096,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        torch.ops.tk.cross_entropy(logits, target)  # warm
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        loss = torch.ops.tk.cross_entropy(logits, target)
        torch.cuda.synchronize()
        assert torch.cuda.max_memory_allocated() - before < logits.numel(), "the logits were copied"
        want = F.cross_entropy(logits, target)
    assert loss.dtype == want.dtype == torch.float32
    (dlogits,) = torch.autograd.grad(loss, logits)
    (want_grad,) = torch.autograd.grad(want, logits)
    assert dlogits.dtype == want_grad.dtype == torch.bfloat16
    x64 = logits.detach().double().requires_grad_()
    loss64 = F.cross_entropy(x64, target)
    loss64.backward()
    assert abs(loss.double() - loss64).item() <= 1e-6 * abs(loss64).item()
    assert rel_error(dlogits, x64.grad) <= rel_error(want_grad, x64.grad) * 1.01 + 1e-6


@pytest.mark.gpu
def test_softmax_under_autocast_reads_a_16bit_x_without_a_float32_copy():
    """As torch.softmax on CUDA: autocast asks for a float32 result, and x is read as it is.
    A cast first would allocate a float32 copy of x as large as y."""
    x = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        torch.ops.tk.softmax(x, -1)  # warm: the native lane records its first calls
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        y = torch.ops.tk.softmax(x, -1)
        torch.cuda.synchronize()
        grown = torch.cuda.max_memory_allocated() - before
    assert grown < 2 * y.numel() * 4, f"x was copied to float32 first: {grown} bytes allocated for y"
    assert y.dtype == torch.softmax(x, -1, dtype=torch.float32).dtype == torch.float32
    torch.testing.assert_close(y, torch.softmax(x, -1, dtype=torch.float32))
    x.requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = torch.ops.tk.softmax(x, -1)
    grad = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, grad)
    x64 = x.detach().double().requires_grad_()
    (dx64,) = torch.autograd.grad(torch.softmax(x64, -1), x64, grad.double())
    assert dx.dtype == torch.bfloat16 and rel_error(dx, dx64) <= TOLERANCE[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["layer_norm", "rms_norm"])
def test_norms_under_autocast_read_a_16bit_x_without_a_float32_copy(name):
    """PyTorch casts its norms' inputs to float32 under CUDA autocast (rms_norm from 2.12 on):
    tk asks for a float32 result instead, with the same dtype and a float32 result's accuracy,
    and allocates no float32 copy of x, which would be as large as y."""
    n = 4096
    x = (3 + torch.randn(2048, n, device="cuda", dtype=torch.bfloat16)).requires_grad_()
    weight = (1 + 0.1 * torch.randn(n, device="cuda")).requires_grad_()
    bias = (0.1 * torch.randn(n, device="cuda")).requires_grad_()
    if name == "layer_norm":
        tk_fn = lambda x, w, b: torch.ops.tk.layer_norm(x, [n], w, b, 1e-5)  # noqa: E731
        torch_fn = lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5)  # noqa: E731
        params = (weight, bias)
    else:
        tk_fn = lambda x, w: torch.ops.tk.rms_norm(x, w, 1e-6)  # noqa: E731
        torch_fn = lambda x, w: F.rms_norm(x, (n,), w, 1e-6)  # noqa: E731
        params = (weight,)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        tk_fn(x.detach(), *params)  # warm: the native lane records its first calls
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        y = tk_fn(x.detach(), *(p.detach() for p in params))
        torch.cuda.synchronize()
        grown = torch.cuda.max_memory_allocated() - before
        want = torch_fn(x, *params)
        y = tk_fn(x, *params)
    assert y.dtype == want.dtype, f"tk gives {y.dtype}, PyTorch {want.dtype}"
    assert grown < 1.5 * y.numel() * y.element_size(), f"x was copied first: {grown} bytes allocated for y"
    inputs64 = [t.detach().double().requires_grad_() for t in (x, *params)]
    y64 = torch_fn(*inputs64)
    assert rel_error(y, y64) <= TOLERANCE[y.dtype]
    grad = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, *params), grad)
    grads64 = torch.autograd.grad(y64, inputs64, grad.double())
    want_grads = torch.autograd.grad(want, (x, *params), grad)
    for got, got64, theirs, leaf in zip(grads, grads64, want_grads, (x, *params), strict=True):
        assert got.dtype == theirs.dtype == leaf.dtype
        assert rel_error(got, got64) <= max(TOLERANCE[got.dtype], 1.01 * rel_error(theirs, got64))


# ------------------------------------------------- the casts made in C++ on CUDA

_CAN_BUILD = _native.build_tools_present()


@pytest.fixture(scope="module")
def seen_ops():
    """Two test ops that record the dtypes they receive: one behind follow_autocast's Python kernel,
    one behind the native lane's C++ kernel (which tk's own ops take on CUDA), both on the CPU."""
    native = _native.module() if _CAN_BUILD else None
    if native is None:
        pytest.skip("the native lane is not built on this machine")
    lib = torch.library.Library("tk_autocast_test", "DEF")
    seen = []
    for name in ("python_result", "native_result"):  # FLOAT32_RESULT: a dtype argument, set or not
        lib.define(f"{name}(Tensor a, Tensor? b, ScalarType? dtype=None) -> Tensor")

        def record_dtype(a, b, dtype=None):
            seen.append((a.dtype, None if b is None else b.dtype, dtype))
            return a.clone()

        lib.impl(name, record_dtype, "CPU")
        if name.startswith("native"):
            native.register_autocast("tk_autocast_test", name, "cpu", FLOAT32_RESULT)
        else:
            op = getattr(torch.ops.tk_autocast_test, name).default
            lib.impl(name, _autocast_kernel(op, "cpu", FLOAT32_RESULT), autocast_key("cpu"), with_keyset=True)
    for name in ("python_lower", "native_lower", "python_float32", "native_float32"):
        lib.define(f"{name}(Tensor a, Tensor? b, Tensor c) -> Tensor")

        def record(a, b, c):
            seen.append(tuple(None if t is None else t.dtype for t in (a, b, c)))
            return a.double() + c.double() + (0 if b is None else b.double())

        lib.impl(name, record, "CPU")
        op = getattr(torch.ops.tk_autocast_test, name).default
        policy = FLOAT32 if name.endswith("float32") else LOWER_PRECISION
        if name.startswith("native"):
            native.register_autocast("tk_autocast_test", name, "cpu", policy)
        else:
            lib.impl(name, _autocast_kernel(op, "cpu", policy), autocast_key("cpu"), with_keyset=True)
    yield seen, lib


@pytest.mark.parametrize("policy", ["lower", "float32"])
@pytest.mark.parametrize("autocast_dtype", AUTOCAST_DTYPES)
def test_the_native_casts_are_the_python_ones(seen_ops, policy, autocast_dtype):
    seen, _ = seen_ops
    cases = [
        (torch.randn(3), torch.randn(3, dtype=torch.float16), torch.randn(3, dtype=torch.float64)),
        (torch.randn(3, dtype=torch.bfloat16), None, torch.arange(3)),
    ]
    for a, b, c in cases:
        got = {}
        for lane in ("python", "native"):
            op = getattr(torch.ops.tk_autocast_test, f"{lane}_{policy}")
            seen.clear()
            with torch.autocast("cpu", dtype=autocast_dtype):
                value = op(a, b, c)
            got[lane] = (seen[0], value)
            seen.clear()
            op(a, b, c)  # autocast off: as given
            assert seen[0] == tuple(None if t is None else t.dtype for t in (a, b, c))
        assert got["python"][0] == got["native"][0]
        torch.testing.assert_close(got["python"][1], got["native"][1])
        cast = torch.float32 if policy == "float32" else autocast_dtype

        def expected(t):  # floating tensors cast, float64 and integers kept
            if t is None:
                return None
            return cast if t.is_floating_point() and t.dtype != torch.float64 else t.dtype

        assert got["native"][0] == tuple(map(expected, (a, b, c)))


def test_the_native_lane_refuses_what_it_cannot_do(seen_ops):
    native = _native.module()
    with pytest.raises(ValueError, match="tk_autocast_test::native_lower: unknown autocast policy float8"):
        native.register_autocast("tk_autocast_test", "native_lower", "cpu", "float8")
    with pytest.raises(ValueError, match="native_lower: autocast policy float32_result needs a `dtype` argument"):
        native.register_autocast("tk_autocast_test", "native_lower", "cpu", FLOAT32_RESULT)


@pytest.mark.parametrize("autocast_dtype", AUTOCAST_DTYPES)
def test_a_float32_result_is_asked_for_as_pytorch_asks_for_it(seen_ops, autocast_dtype):
    """FLOAT32_RESULT (torch.softmax and the norms on CUDA): the first input as it comes, the
    others cast to float32 as FLOAT32 casts them; an unset dtype becomes float32 when the first
    input is a floating tensor autocast would cast; a given one stays."""
    seen, _ = seen_ops
    bf16, half, f64 = (torch.randn(3, dtype=d) for d in (torch.bfloat16, torch.float16, torch.float64))
    cases = [  # args, kwargs, what the op is expected to receive
        ((bf16, None), {}, (torch.bfloat16, None, torch.float32)),
        ((bf16.float(), half), {}, (torch.float32, torch.float32, torch.float32)),
        ((half, bf16, None), {}, (torch.float16, torch.float32, torch.float32)),  # a norm's x and weight
        ((half, f64, None), {}, (torch.float16, torch.float64, torch.float32)),  # float64 is never cast
        ((bf16, None), {"dtype": torch.float16}, (torch.bfloat16, None, torch.float16)),
        ((bf16, half, torch.float64), {}, (torch.bfloat16, torch.float32, torch.float64)),
        ((f64, half), {}, (torch.float64, torch.float32, None)),  # a float64 first input: as given
        ((torch.arange(3), None), {}, (torch.int64, None, None)),  # not floating: as given
    ]
    for lane in ("python", "native"):
        op = getattr(torch.ops.tk_autocast_test, f"{lane}_result")
        for args, kwargs, expected in cases:
            seen.clear()
            with torch.autocast("cpu", dtype=autocast_dtype):
                op(*args, **kwargs)
            assert seen == [expected], (lane, args, kwargs)
            seen.clear()
            op(*args, **kwargs)  # autocast off: as given
            assert seen[0][2] == kwargs.get("dtype", args[2] if len(args) > 2 else None)


def test_a_device_type_autocast_does_not_know_is_refused():
    with pytest.raises(ValueError, match="torch.autocast has no 'meta' device type"):
        follow_autocast("gelu", {"meta": LOWER_PRECISION})


def test_each_op_keeps_the_policies_it_follows():
    """The test above reads an op's policy from here: matmul and linear cross entropy compute in the
    autocast dtype on both devices, the norms keep float32 on CUDA."""
    assert POLICIES["matmul"] == {"cuda": LOWER_PRECISION, "cpu": LOWER_PRECISION}
    assert POLICIES["linear_cross_entropy"]["cuda"] == LOWER_PRECISION
    assert POLICIES["layer_norm"]["cuda"] in (FLOAT32, FLOAT32_RESULT)
