"""The native lane (ops/_native.cpp): record a body, replay it from C++, fall back to Python otherwise.

On the CPU the lane is driven end to end through a test op whose "kernel" is
numpy working on raw addresses: the body reports its launches the way
``FastKernel`` does, and the replay hands the C++-computed addresses to a hook
that runs the same numpy code.  So a wrong pointer (input/output/temporary,
offset), a wrong scalar, a wrong output shape or a stale plan gives a wrong
number here.  The GPU tests at the end run every tk op both ways on CUDA.
"""

import contextlib
import ctypes
import itertools
import os
import struct

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ops.runtime import launch as _launch, native as _native

_CAN_BUILD = _native.build_tools_present()
native = _native.module() if _CAN_BUILD else None


def test_the_lane_builds_where_a_compiler_is_present():
    if not _CAN_BUILD:
        pytest.skip("no C++ compiler or ninja on this machine")
    assert native is not None, "ops/_native.cpp did not build (see the warning above)"


needs_native = pytest.mark.skipif(native is None, reason="the native lane is not built on this machine")

# --------------------------------------------------------------------------
# A test op: y = scale * x (float32), through a temporary, with a "kernel"
# that works on addresses.
# --------------------------------------------------------------------------

_TWICE, _SPLIT = 101, 102  # stand-ins for CUfunction handles


def _array(address: int, n: int) -> np.ndarray:
    return np.ctypeslib.as_array(ctypes.cast(address, ctypes.POINTER(ctypes.c_float)), shape=(n,))


def _float(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


hooked_launches = []  # (function, overlapped) of each launch the replay made through the hook


def _kernel(function, grid, threads, shared, slots, overlapped=False):
    """What a launch does, given its argument slots as the C++ side fills them."""
    hooked_launches.append((function, overlapped))
    if function == _TWICE:
        x, tmp, y, n, scale = slots
        n = n & 0xFFFFFFFF
        _array(tmp, n)[:] = _array(x, n) * _float(scale)
        _array(y, n)[:] = _array(tmp, n)
    elif function == _SPLIT:  # two outputs: the first half and the second half of x, each + 1
        x, x_hi, lo, hi, half = slots
        _array(lo, half)[:] = _array(x, half) + 1
        _array(hi, half)[:] = _array(x_hi, half) + 1
    else:
        raise AssertionError(f"unknown function {function}")


def _launch_now(function, values, types, overlapped=False):
    """Run the kernel on the live tensors, and report it as FastKernel reports a direct launch."""
    slots = []
    for code, v in zip(types, values):
        slots.append(v.data_ptr() if code == "O" else _native._bits(code, v) & (2**64 - 1))
    _kernel(function, (1, 1, 1), 32, 0, slots)
    current = getattr(_launch.recording, "current", None)
    if current is not None:
        current.launch(None, function, (1, 1, 1), 1, 0, types, values, overlapped)


class Body:
    """The test op's body, with switches for what a real body might do."""

    def __init__(self):
        self.calls = 0
        self.extra_op = False  # call a PyTorch op that computes (not replayable)
        self.keep = False  # keep the temporary between calls, a cache (a persistent buffer: not replayable)
        self.cache = None
        self.overlapped = False  # report the launch as a programmatic dependent of the one before it

    def __call__(self, x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
        self.calls += 1
        if x.dtype != torch.float32:
            raise TypeError(f"tk_test.twice: x has dtype {x.dtype}; supported: float32")
        x = x.reshape(-1) if x.is_contiguous() else x.contiguous().reshape(-1)
        y = torch.empty_like(x)
        tmp = torch.empty(x.numel(), dtype=torch.float32) if self.cache is None else self.cache
        if self.keep:
            self.cache = tmp
        if self.extra_op:
            x = x + 0
        if x.numel():
            _launch_now(_TWICE, (x, tmp, y, x.numel(), scale), "OOOif", self.overlapped)
        return y


body = Body()


def _split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    half = x.numel() // 2
    lo, hi = torch.empty(half), torch.empty(half)
    _launch_now(_SPLIT, (x, x[half:], lo, hi, half), "OOOOi")  # x[half:]: input 0 at an offset
    return lo, hi


def _as_dtype(x, dtype=None, fallback=torch.float32):
    """A body that reads its dtype arguments (and computes with PyTorch: it goes to Python)."""
    assert isinstance(fallback, torch.dtype) and (dtype is None or isinstance(dtype, torch.dtype)), (dtype, fallback)
    return x.to(dtype or fallback)


def _fallbacks(fn):
    return (lambda keyset, *args, **kwargs: fn(*args, **kwargs)), fn


# Two ops with a declared backward (see register_formula in ops/runtime/formula.py),
# whose gradients the lane's C++ autograd node computes:
#   scaled(x, scale) = scale * x, the body above, and its backward op, which
#   takes one argument of each kind a formula can pass;
#   weighted_sum(a, b) = a + 2 b, a body that computes with PyTorch (never
#   replayed), whose a-gradient is the incoming one itself.
scaled_body = Body()
backward_calls = []


def _scaled_backward(grad, y, x, scale: float, needs: bool, x_dtype: torch.dtype):
    backward_calls.append((y.clone(), x.clone(), scale, needs, x_dtype))
    return grad * scale


def _weighted_sum(a, b):
    return a + 2 * b


def _define_ops_with_formulas():
    from ops.runtime.formula import GRAD, RESULT, Formula, dtype_of, needs_grad

    _LIB.define("scaled(Tensor x, float scale=2.0) -> Tensor")
    _LIB.define("scaled_backward(Tensor grad, Tensor y, Tensor x, float scale, bool needs, ScalarType x_dtype) -> Tensor")
    _LIB.define("weighted_sum(Tensor a, Tensor b) -> Tensor")
    _LIB.define("doubled(Tensor grad) -> Tensor")
    _LIB.impl("scaled_backward", _scaled_backward, "CPU")
    _LIB.impl("doubled", lambda grad: 2 * grad, "CPU")
    _native.register("tk_test", "scaled", scaled_body, *_fallbacks(scaled_body), device="cpu")
    _native.register("tk_test", "weighted_sum", _weighted_sum, *_fallbacks(_weighted_sum), device="cpu")
    scaled = Formula(
        torch.ops.tk_test.scaled.default,
        torch.ops.tk_test.scaled_backward.default,
        (GRAD, RESULT, "x", "scale", needs_grad("x"), dtype_of("x")),
        {"x": 0},
    )
    weighted = Formula(
        torch.ops.tk_test.weighted_sum.default, torch.ops.tk_test.doubled.default, (GRAD,), {"a": GRAD, "b": 0}
    )
    native.set_formula("tk_test", "scaled", scaled.native_description())
    native.set_formula("tk_test", "weighted_sum", weighted.native_description())


if native is not None:
    _LIB = torch.library.Library("tk_test", "DEF")
    _LIB.define("twice(Tensor x, float scale=2.0) -> Tensor")
    _LIB.define("split(Tensor x) -> (Tensor, Tensor)")
    _native.register("tk_test", "twice", body, *_fallbacks(body), device="cpu")
    _native.register("tk_test", "split", _split, *_fallbacks(_split), device="cpu")
    _LIB.define("as_dtype(Tensor x, ScalarType? dtype=None, ScalarType fallback=float) -> Tensor")
    _native.register("tk_test", "as_dtype", _as_dtype, *_fallbacks(_as_dtype), device="cpu")
    _define_ops_with_formulas()


@pytest.fixture
def hooked():
    """The lane launches through the numpy kernel; plans start empty, the body's switches off."""
    native.set_launch_hook(_kernel)
    native.clear()
    body.extra_op, body.cache, body.keep, body.overlapped = False, None, False, False
    yield
    native.set_launch_hook(None)
    native.clear()


def _counts(name="twice"):
    found = native.stats()[f"tk_test::{name}/AutogradCPU"]
    return found["replays"], found["python_calls"]


@needs_native
def test_two_agreeing_recordings_make_a_plan_that_replays_from_cpp(hooked):
    x = torch.randn(1000)
    for call in range(5):
        before = body.calls
        y = torch.ops.tk_test.twice(x, 3.0)
        torch.testing.assert_close(y, x * 3.0, rtol=0, atol=0)
        # Calls 1 and 2 run the body (recording); from call 3 on, C++ replays without it.
        assert body.calls - before == (1 if call < 2 else 0)
    assert _counts() == (3, 2)


@needs_native
def test_a_launch_recorded_as_overlapped_replays_as_one(hooked):
    """A launch FastKernel reports as a programmatic dependent (a binary built with launch_pdl)
    is replayed with that attribute, and a plain one without it: each is its own plan."""
    x = torch.randn(100)
    for overlapped in (True, False):
        body.overlapped = overlapped
        native.clear()
        for _ in range(3):
            torch.testing.assert_close(torch.ops.tk_test.twice(x), 2 * x, rtol=0, atol=0)
        hooked_launches.clear()
        torch.testing.assert_close(torch.ops.tk_test.twice(x), 2 * x, rtol=0, atol=0)
        assert hooked_launches == [(_TWICE, overlapped)]


@needs_native
def test_replays_allocate_fresh_outputs_of_the_recorded_layout(hooked):
    x = torch.randn(64, 33)
    outputs = [torch.ops.tk_test.twice(x) for _ in range(4)]
    assert _counts()[0] == 2
    assert len({o.data_ptr() for o in outputs}) == 4  # no output is handed out twice
    for o in outputs:
        assert o.shape == (64 * 33,) and o.stride() == (1,) and o.dtype == torch.float32
        torch.testing.assert_close(o, x.reshape(-1) * 2.0, rtol=0, atol=0)


@needs_native
def test_each_argument_that_changes_the_work_changes_the_key(hooked):
    base = torch.randn(300)
    cases = [
        (base, 2.0),
        (base, 5.0),  # another scalar: its bits are in the plan, so it needs its own
        (torch.randn(301), 2.0),  # another size
        (torch.randn(20, 15), 2.0),  # another shape
        (torch.randn(15, 20).t(), 2.0),  # the same shape, strides the body copies for
        (base[1:], 2.0),  # a pointer off 16-byte alignment
    ]
    for x, scale in cases:
        for _ in range(3):
            torch.testing.assert_close(torch.ops.tk_test.twice(x, scale), x.reshape(-1) * scale, rtol=0, atol=0)
    # Each aligned, contiguous case replays its third call; the transposed one calls
    # .contiguous() (a PyTorch op that computes), so it always runs in Python.
    replays, python_calls = _counts()
    assert (replays, python_calls) == (len(cases) - 1, 2 * (len(cases) - 1) + 3)


@needs_native
def test_the_replay_uses_the_callers_tensors(hooked):
    for _ in range(2):
        torch.ops.tk_test.twice(torch.randn(128))
    for _ in range(3):  # replays now: each must read its own input
        x = torch.randn(128)
        torch.testing.assert_close(torch.ops.tk_test.twice(x), 2 * x, rtol=0, atol=0)
    assert _counts()[0] == 3


@needs_native
def test_calls_the_lane_does_not_replay_go_to_python(hooked):
    x = torch.randn(256)
    for _ in range(3):
        torch.ops.tk_test.twice(x)
    replays, _ = _counts()
    # An input that needs a gradient, a dispatch mode, inference tensors (CPU key) ...
    w = torch.randn(256, requires_grad=True)
    before = body.calls
    torch.ops.tk_test.twice(w.detach())  # a plain tensor: replayed
    assert body.calls == before
    with pytest.raises(RuntimeError):  # the test op has no autograd formula: Python must have been asked
        torch.ops.tk_test.twice(w).sum().backward()
    assert body.calls == before + 1

    class Nothing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Nothing():
        torch.ops.tk_test.twice(x)
    assert body.calls == before + 2
    assert _counts()[0] == replays + 1


@needs_native
def test_bodies_that_compute_with_pytorch_or_keep_buffers_are_not_replayed(hooked):
    x = torch.randn(100)
    body.extra_op = True
    for _ in range(4):
        torch.testing.assert_close(torch.ops.tk_test.twice(x), 2 * x, rtol=0, atol=0)
    body.extra_op, body.keep = False, True  # the temporary becomes a cache that outlives the call
    native.clear()
    for _ in range(4):
        torch.testing.assert_close(torch.ops.tk_test.twice(x), 2 * x, rtol=0, atol=0)
    assert _counts()[0] == 0


@needs_native
def test_recordings_that_keep_disagreeing_stop_being_recorded(hooked):
    scales = itertools.count(1)
    real = _native._bits
    # Each recording sees another scalar's bits, as if the body chose its launch by chance.
    # (Patched by hand: a test that takes monkeypatch runs with the lane paused, see conftest.)
    _native._bits = lambda code, v: real(code, float(next(scales))) if code == "f" else real(code, v)
    try:
        x = torch.randn(10)
        for _ in range(8):
            torch.ops.tk_test.twice(x)
    finally:
        _native._bits = real
    assert _counts() == (0, 8)
    assert body.calls  # (the body ran: the recordings were made)


@needs_native
def test_paused_lanes_run_python_and_forget_their_plans(hooked):
    x = torch.randn(32)
    for _ in range(3):
        torch.ops.tk_test.twice(x)
    assert _counts() == (1, 2)
    with _native.paused():
        before = body.calls
        torch.ops.tk_test.twice(x)
        assert body.calls == before + 1
    assert _counts() == (0, 0)


@needs_native
def test_errors_keep_their_python_type(hooked):
    with pytest.raises(TypeError, match="float32"):
        torch.ops.tk_test.twice(torch.ones(3, dtype=torch.float64))


@needs_native
def test_dtype_arguments_reach_python_as_dtypes(hooked):
    """A dtype is an int on the dispatcher's stack; the Python kernel gets a torch.dtype."""
    x = torch.randn(3, requires_grad=True)
    for args in [(), (torch.float64,), (None, torch.bfloat16), (torch.float16, torch.float64)]:
        for t in (x, x.detach()):  # the autograd lane and the backend lane
            expected = args[0] if args and args[0] is not None else (args[1] if len(args) > 1 else torch.float32)
            assert torch.ops.tk_test.as_dtype(t, *args).dtype == expected


@needs_native
def test_ops_with_several_outputs_replay_each(hooked):
    for _ in range(4):
        x = torch.randn(16)
        lo, hi = torch.ops.tk_test.split(x)
        torch.testing.assert_close(lo, x[:8] + 1, rtol=0, atol=0)
        torch.testing.assert_close(hi, x[8:] + 1, rtol=0, atol=0)
    assert _counts("split")[0] == 2


# --------------------------------------------------------------------------
# Gradients: the C++ autograd node of an op with a declared formula.
# --------------------------------------------------------------------------


def _nodes(name):
    return native.stats()[f"tk_test::{name}/AutogradCPU"]["nodes"]


@needs_native
def test_a_call_needing_a_gradient_gets_a_cpp_node_that_calls_the_backward_op(hooked):
    backward_calls.clear()
    scaled_body.cache = None
    x = torch.randn(40, requires_grad=True)
    for _ in range(3):  # the forward below the node is recorded twice, then replayed
        y = torch.ops.tk_test.scaled(x, 3.0)
    assert y.grad_fn.name() == "TkScaledBackward" and y.requires_grad
    assert native.stats()["tk_test::scaled/CPU"]["replays"] == 1
    assert _nodes("scaled") == 3
    torch.testing.assert_close(y, 3.0 * x.detach(), rtol=0, atol=0)
    grad = torch.randn(40)
    y.backward(grad)
    torch.testing.assert_close(x.grad, 3.0 * grad, rtol=0, atol=0)
    (saved_y, saved_x, scale, needs, x_dtype) = backward_calls[-1]
    torch.testing.assert_close(saved_y, y.detach(), rtol=0, atol=0)  # RESULT
    torch.testing.assert_close(saved_x, x.detach(), rtol=0, atol=0)  # the argument x
    assert (scale, needs, x_dtype) == (3.0, True, torch.float32)


@needs_native
def test_the_node_gives_the_incoming_gradient_or_a_result_to_the_inputs_that_need_one(hooked):
    a, b = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
    out = torch.ops.tk_test.weighted_sum(a, b)
    assert out.grad_fn.name() == "TkWeightedSumBackward"
    torch.testing.assert_close(out, a.detach() + 2 * b.detach(), rtol=0, atol=0)
    grad = torch.randn(5)
    out.backward(grad)
    torch.testing.assert_close(a.grad, grad, rtol=0, atol=0)
    torch.testing.assert_close(b.grad, 2 * grad, rtol=0, atol=0)
    # Only b needs one: a gets none.
    b.grad = None
    out = torch.ops.tk_test.weighted_sum(a.detach(), b)
    (db,) = torch.autograd.grad(out, b, grad)
    torch.testing.assert_close(db, 2 * grad, rtol=0, atol=0)
    # Both need one, only a is asked for: no gradient for b, and the backward op's answer is dropped.
    out = torch.ops.tk_test.weighted_sum(a, b)
    (da,) = torch.autograd.grad(out, a, grad)
    torch.testing.assert_close(da, grad, rtol=0, atol=0)
    assert b.grad is None


@needs_native
def test_the_backward_op_runs_only_when_its_gradient_is_asked_for(hooked):
    backward_calls.clear()
    x = torch.randn(8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    out = torch.ops.tk_test.scaled(x, 2.0) * w
    torch.autograd.grad(out.sum(), w)  # x's gradient is not asked for
    assert backward_calls == []  # nor is scaled's backward run
    torch.autograd.grad(torch.ops.tk_test.scaled(x, 2.0).sum(), x)
    assert backward_calls[-1][3] is True


@needs_native
def test_the_node_keeps_autograds_rules_for_saved_tensors(hooked):
    x = torch.randn(16, requires_grad=True)
    y = torch.ops.tk_test.scaled(x.clone(), 2.0)
    y.sum().backward()
    with pytest.raises(RuntimeError, match="second time"):  # freed after the first backward
        y.sum().backward()
    x2 = x.detach().clone().requires_grad_()
    y = torch.ops.tk_test.scaled(x2 * 1, 2.0)
    y.sum().backward(retain_graph=True)
    y.sum().backward()  # retained: a second backward runs
    torch.testing.assert_close(x2.grad, torch.full((16,), 4.0), rtol=0, atol=0)
    leaf = torch.randn(16, requires_grad=True)
    x3 = leaf * 1
    y = torch.ops.tk_test.scaled(x3, 2.0)
    with torch.no_grad():
        x3.add_(1)  # the saved input changes
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@needs_native
def test_saved_tensor_hooks_see_what_the_node_saves(hooked):
    packed = []

    def pack(t):
        packed.append(t.shape)
        return t.clone()

    x = torch.randn(12, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = torch.ops.tk_test.scaled(x, 5.0)
    assert packed == [x.shape, y.shape]  # the argument x, then the result
    y.backward(torch.ones(12))
    torch.testing.assert_close(x.grad, torch.full((12,), 5.0), rtol=0, atol=0)


@needs_native
def test_calls_the_node_does_not_take_go_to_python(hooked):
    x = torch.randn(6, requires_grad=True)
    before = _nodes("scaled")
    with torch.no_grad():
        assert not torch.ops.tk_test.scaled(x).requires_grad
    with _native.paused():  # the Python fallback of the test op has no autograd
        assert torch.ops.tk_test.scaled(x).grad_fn is None
    with _PythonPath():
        torch.ops.tk_test.scaled(x)
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.ones(6))
        assert torch.ops.tk_test.scaled(dual).grad_fn is None
    assert _nodes("scaled") == before


@needs_native
def test_formulas_the_node_could_not_run_are_refused_when_declared():
    from ops.runtime.formula import GRAD, Formula

    with pytest.raises(ValueError, match="tk_test::split: register_formula is for an op with one result"):
        Formula(torch.ops.tk_test.split.default, None, (), {"x": GRAD})
    with pytest.raises(ValueError, match="the formula names 'y', not one of its arguments \\['x', 'scale'\\]"):
        Formula(torch.ops.tk_test.scaled.default, None, (), {"y": GRAD})
    refused = {  # message: (op, backward op, tokens, gradient codes)
        "gradient 1 is not one of the 1 results of the backward op": ("weighted_sum", "tk_test::doubled", [(0, 0)], [-1, 1]),
        "no op named tk_test::nope": ("weighted_sum", "tk_test::nope", [(0, 0)], [-1, -2]),
        "argument 2 out of range": ("weighted_sum", "", [(1, 2)], [-1, -2]),
        "argument 5 out of range": ("weighted_sum", "", [(4, 5)], [-1, -2]),  # a dtype_of
        "unknown token 5": ("weighted_sum", "", [(5, 0)], [-1, -2]),
        "2 gradients for 1 arguments": ("doubled", "", [], [-1, -2]),
    }
    for message, (op, backward, tokens, gradients) in refused.items():
        with pytest.raises(ValueError, match=message):
            _native.set_formula("tk_test", op, ("X", backward, tokens, gradients))
    with pytest.raises(ValueError, match="a formula is for an op with one result"):
        _native.set_formula("tk_test", "split", ("X", "", [], [-1]))
    x = torch.randn(3, requires_grad=True)  # the refused formulas left the declared one in place
    assert torch.ops.tk_test.weighted_sum(x, x).grad_fn.name() == "TkWeightedSumBackward"


def test_inputs_that_share_memory_are_not_recorded():
    recording = _native.Recording()
    x = torch.randn(8)
    recording.launch(None, 1, (1, 1, 1), 1, 0, "OO", (x, x[2:]))
    assert recording.describe((x, x[2:]), torch.empty(0)) is None


@pytest.mark.parametrize("cos_dtype", [torch.bfloat16, torch.float32])
def test_rope_bodies_call_nothing_the_lane_cannot_replay(cos_dtype):
    """rope's body, forward and backward, only checks, allocates, takes views and launches (on meta tensors:
    no kernel runs), so its eager CUDA calls replay from C++.  Its result dtype came from torch.promote_types,
    an aten op: every forward call took the Python path (111 against 12 us a call on an H200)."""
    from ops import rope

    q = torch.empty(2, 8, 4, 80, dtype=torch.bfloat16, device="meta").transpose(1, 2)[..., :32]
    k = torch.empty(2, 8, 2, 80, dtype=torch.bfloat16, device="meta").transpose(1, 2)[..., :32]
    cos, sin = (torch.empty(1, 8, 32, dtype=cos_dtype, device="meta") for _ in range(2))
    for body in (rope.forward, rope.backward):
        recording = _native.Recording()
        with _native._Watch(recording):
            outputs = body(q, k, cos, sin)
        assert recording.spoiled is None, (body, recording.spoiled)
        assert outputs[0].dtype == (torch.promote_types(q.dtype, cos_dtype) if body is rope.forward else q.dtype)


def test_promoted_float_is_pytorchs_promotion():
    from ops.runtime import promoted_float
    from ops.runtime.checks import FLOAT_DTYPES

    for a, b in itertools.product(FLOAT_DTYPES, repeat=2):
        assert promoted_float(a, b) == torch.promote_types(a, b), (a, b)


def test_argument_bits_fill_a_64_bit_slot():
    assert _native._bits("f", 1.5) == struct.unpack("<i", struct.pack("<f", 1.5))[0]
    assert _native._bits("d", -2.0) == struct.unpack("<q", struct.pack("<d", -2.0))[0]
    assert _native._bits("i", -3) & 0xFFFFFFFF == 2**32 - 3
    assert _native._bits("K", 2**64 - 1) == -1


def test_a_failed_build_warns_and_leaves_the_python_path(monkeypatch):
    from torch.utils import cpp_extension

    def no_compiler(**kwargs):
        raise RuntimeError("c++: command not found")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    monkeypatch.setattr(_native, "_module", None)
    monkeypatch.setattr(_native, "_tried", False)
    path = os.environ.get("PATH")
    with pytest.warns(UserWarning, match="native lane could not be built.*c\\+\\+: command not found"):
        assert _native.module() is None
    assert _native.module() is None  # tried once: no second warning, no second build
    assert os.environ.get("PATH") == path  # the build's PATH change is undone


def test_a_lock_left_by_a_killed_build_is_removed_before_building(monkeypatch, tmp_path):
    """cpp_extension waits forever on a lock it finds; a killed build leaves one behind."""
    from torch.utils import cpp_extension

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    tag = "".join(c if c.isalnum() else "_" for c in torch.__version__)
    lock = _native.build_directory(f"tk_native_{tag}") / "lock"
    assert lock.is_relative_to(tmp_path)
    lock.touch()
    old = lock.stat().st_mtime - _native.STALE_LOCK_SECONDS - 60
    os.utime(lock, (old, old))
    seen = {}

    def load(**kwargs):
        seen.update(kwargs, lock_present=lock.exists())
        return "built"

    monkeypatch.setattr(cpp_extension, "load", load)
    monkeypatch.setattr(_native, "_module", None)
    monkeypatch.setattr(_native, "_tried", False)
    with pytest.warns(UserWarning, match="removing .*lock.*did not finish"):
        assert _native.module() == "built"
    assert seen["lock_present"] is False
    assert seen["build_directory"] == str(lock.parent)


def test_a_young_lock_is_waited_for_until_it_goes_or_grows_stale(tmp_path):
    import threading

    lock = tmp_path / "lock"
    assert _native.clear_stale_lock(tmp_path) is False  # no lock at all
    lock.touch()  # a build in progress: it ends (the lock goes) while we wait
    threading.Timer(0.3, lock.unlink).start()
    assert _native.clear_stale_lock(tmp_path, max_age_s=30, poll_s=0.05) is False and not lock.exists()
    lock.touch()  # a build killed a moment ago: its lock is removed once it is older than any build takes
    with pytest.warns(UserWarning, match="did not finish"):
        assert _native.clear_stale_lock(tmp_path, max_age_s=0.3, poll_s=0.05) is True
    assert not lock.exists()
    lock.touch()
    old = lock.stat().st_mtime - _native.STALE_LOCK_SECONDS - 1
    os.utime(lock, (old, old))
    with pytest.warns(UserWarning, match="did not finish"):
        assert _native.clear_stale_lock(tmp_path) is True
    assert not lock.exists()


def test_the_lane_stays_off_without_cuda_or_when_turned_off(monkeypatch):
    monkeypatch.setenv("TK_NATIVE", "0")
    assert not _native.enabled_for_cuda()


# --------------------------------------------------------------------------
# On the GPU: every tk op, replayed against its Python path.
# --------------------------------------------------------------------------


class _PythonPath(TorchDispatchMode):
    """Any dispatch mode sends a tk call down the Python path (the lane does not replay under one)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _all_specs():
    import ops

    return sorted(ops.SPECS)


class _TkCalls(TorchDispatchMode):
    """The tk ops a call makes, with their arguments (each still runs)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "tk":
            self.calls.append((func, args, kwargs or {}))
        return func(*args, **(kwargs or {}))


# Bodies that run PyTorch ops by design, and so stay in Python: the fused loss's chunk GEMMs are cuBLAS's.
_PYTHON_BODIES = {"linear_cross_entropy_forward", "linear_cross_entropy_backward"}


@pytest.mark.parametrize("name", _all_specs())
def test_each_ops_body_calls_nothing_the_lane_cannot_replay(name):
    """Every op's body, on its harness inputs as meta tensors (no kernel runs), only checks, allocates, takes
    views and launches: the native lane replays its eager CUDA calls.  One aten op (rope's torch.promote_types
    was one) sends every call through Python, with nothing failing but the time."""
    import ops
    from torch._library.custom_ops import OPDEFS

    spec = ops.get_spec(name)
    args = [a.detach().to("meta") if isinstance(a, torch.Tensor) else a
            for a in spec.make_inputs(spec.shapes["cpu"][0], torch.bfloat16, torch.device("cpu"))]  # fmt: skip
    calls = _TkCalls()
    with calls:
        spec.tk(*args)
    assert calls.calls, name
    for func, call_args, kwargs in calls.calls:
        op = func.name().split("::")[1].split(".")[0]
        if op in _PYTHON_BODIES:
            continue
        body = OPDEFS[f"tk::{op}_cpu"]._init_fn  # the CPU op is custom_op(body): its function is the body
        recording = _native.Recording()
        with _native._Watch(recording):
            body(*call_args, **kwargs)
        assert recording.spoiled is None, (op, recording.spoiled)


def _as_list(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


@pytest.mark.gpu
@pytest.mark.parametrize("name", _all_specs())
def test_each_op_replayed_from_cpp_gives_the_bits_of_its_python_path(name):
    import ops
    from ops.runtime.library import NATIVE_CUDA

    assert NATIVE_CUDA, "the native lane is not registered for CUDA on this GPU machine"
    spec = ops.get_spec(name)
    device = torch.device("cuda")
    shapes = sorted(spec.shapes["cuda"], key=lambda s: spec.bytes_moved(s, torch.float32))[:2]
    for shape, dtype in itertools.product(shapes, spec.dtypes):
        args = spec.make_inputs(shape, dtype, device)
        with _PythonPath():
            expected = _as_list(spec.tk(*args))
        for _ in range(3):  # two recordings, then (where the body allows) a replay
            got = _as_list(spec.tk(*args))
        for e, g in zip(expected, got, strict=True):
            assert (g.shape, g.stride(), g.dtype, g.device) == (e.shape, e.stride(), e.dtype, e.device)
            torch.testing.assert_close(g, e, rtol=0, atol=0, equal_nan=True)


_SHOULD_REPLAY = ["gelu", "gelu_tanh", "gelu_backward", "copy", "add", "square", "softmax", "softmax_backward",
                  "rms_norm", "layer_norm", "matmul", "swiglu", "rope", "rope_backward"]  # fmt: skip


@pytest.mark.gpu
def test_small_calls_of_the_common_ops_are_replayed_from_cpp():
    import ops

    not_replayed = []
    for name in _SHOULD_REPLAY:
        spec = ops.get_spec(name)
        shape = min(spec.shapes["cuda"], key=lambda s: spec.bytes_moved(s, torch.float16))
        args = spec.make_inputs(shape, torch.float16, torch.device("cuda"))
        before = sum(s["replays"] for s in _native.stats().values())
        for _ in range(4):
            spec.tk(*args)
        if sum(s["replays"] for s in _native.stats().values()) == before:
            not_replayed.append(name)
    assert not not_replayed, f"always in Python: {not_replayed}"


def _matmul_2048():
    # Hopper: the TMA kernel, whose tensor descriptors live in global scratch, one buffer a launch
    a, b = (torch.randn(2048, 2048, device="cuda", dtype=torch.float16) for _ in range(2))
    return torch.ops.tk.matmul, (a, b)


def _cross_entropy_mean():
    # its rows summed in 4 parts: partials and a ticket, allocated in the body, the ticket a view
    logits = torch.randn(4096, 1000, device="cuda")
    target = torch.randint(0, 1000, (4096,), device="cuda")
    target[::5] = -100
    return torch.ops.tk.cross_entropy_forward, (logits, target, -100, "mean", 0.0, None)


def _matmul_padded_rows():
    # an LM head with an odd vocabulary: C's rows padded to 16 bytes (matmul's Tuning.pad_c_rows), strides
    # (4008, 1), which the replay must allocate as the Python path does
    x, weight = torch.randn(2048, 512, device="cuda", dtype=torch.bfloat16), torch.randn(4001, 512, device="cuda", dtype=torch.bfloat16)
    return torch.ops.tk.matmul, (x, weight.t())


# Calls whose bodies need buffers besides their outputs: (op, args), made when a test asks.
_LARGE_CALLS = {"matmul 2048^3": _matmul_2048, "cross_entropy mean": _cross_entropy_mean,
                "matmul padded rows": _matmul_padded_rows}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(_LARGE_CALLS))
def test_calls_with_buffers_besides_their_outputs_are_replayed_from_cpp(case):
    """Replayed from C++, with the Python path's bits.  When the fast launcher refused the TMA
    matmul's scratch, every 2048^3 call went through Python, 67-84 µs of host time a call
    against a 27 µs kernel (docs/perf-notes.md, version 40), and no test noticed."""
    if case.startswith("matmul") and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the TMA matmul needs Hopper")
    op, args = _LARGE_CALLS[case]()
    with _PythonPath():
        expected = _as_list(op(*args))
    before = sum(s["replays"] for s in _native.stats().values())
    for _ in range(6):
        got = _as_list(op(*args))
    assert sum(s["replays"] for s in _native.stats().values()) >= before + 3, f"{case}: not replayed from C++"
    for e, g in zip(expected, got, strict=True):
        assert g.stride() == e.stride()
        torch.testing.assert_close(g, e, rtol=0, atol=0, equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_softmax_rows_held_across_programs_are_replayed_from_cpp(dtype):
    """The held-rows softmax allocates its scratch and fills it with a kernel (not
    torch.full, which would keep every call in Python): its calls replay, with the
    Python path's bits, forward and backward, also inside a CUDA graph.  On Hopper the
    replay launches the kernel as a programmatic dependent of the fill, and the fill as usual."""
    from ops.blocks.held_rows import can_overlap_fill
    from ops.runtime import device_facts

    x = torch.randn(8, 65536, device="cuda", dtype=dtype)
    y = torch.softmax(x.float(), -1).to(x.dtype)
    for op, args in ((torch.ops.tk.softmax, (x, -1)), (torch.ops.tk.softmax_backward, (torch.randn_like(x), y, -1))):
        with _PythonPath():
            expected = op(*args)
        before = sum(s["replays"] for s in _native.stats().values())
        for _ in range(4):
            got = op(*args)
        assert sum(s["replays"] for s in _native.stats().values()) > before, op
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = op(*args)
        captured.zero_()
        graph.replay()
        torch.testing.assert_close(captured, expected, rtol=0, atol=0)
        launches = []
        native_module = _native.module()
        native_module.set_launch_hook(lambda *launch: launches.append(launch[-1]))
        try:
            op(*args)  # through the hook: no kernel runs
        finally:
            native_module.set_launch_hook(None)
        assert launches == [False, can_overlap_fill(device_facts(x.device))], op  # the fill, then the kernel


# Ops whose backward is a declared formula (register_formula): a call that needs
# a gradient gets the lane's C++ node.  cross_entropy (two results) keeps a Python formula.
_WITH_NODES = ["add", "copy", "geglu", "gelu", "gelu_tanh", "layer_norm", "matmul", "rms_norm", "softmax", "square", "swiglu"]
_WITH_NODES += ["softmax_to_float32"]  # its node saves x's dtype: dx comes in it


def _floating(a) -> bool:
    return isinstance(a, torch.Tensor) and a.is_floating_point()


@pytest.mark.gpu
@pytest.mark.parametrize("name", _WITH_NODES)
def test_each_cpp_node_gives_the_gradients_of_the_python_formula(name):
    import ops

    spec = ops.get_spec(name)
    shape = min(spec.shapes["cuda"], key=lambda s: spec.bytes_moved(s, torch.float32))
    for dtype in (torch.float32, torch.bfloat16):
        args = spec.make_inputs(shape, dtype, torch.device("cuda"))
        results = []
        for paused in (False, True):
            leaves = [a.detach().requires_grad_() if _floating(a) else a for a in args]
            with _native.paused() if paused else contextlib.nullcontext():
                out = spec.tk(*leaves)
                grad = torch.linspace(-1, 1, out.numel(), device="cuda", dtype=out.dtype).reshape(out.shape)
                inputs = [a for a in leaves if isinstance(a, torch.Tensor) and a.requires_grad]
                results.append((out.grad_fn.name(), out, torch.autograd.grad(out, inputs, grad)))
        (node, out, grads), (python_node, python_out, python_grads) = results
        assert node.startswith("Tk") and node.endswith("Backward") and not python_node.startswith("Tk")
        torch.testing.assert_close(out, python_out, rtol=0, atol=0)
        for g, e in zip(grads, python_grads, strict=True):
            torch.testing.assert_close(g, e, rtol=0, atol=0)


@pytest.mark.gpu
def test_a_formula_registered_later_replaces_the_declared_one_on_both_paths():
    from ops.runtime import GRAD, register_formula
    from ops.tour import square

    x = torch.randn(64, device="cuda", requires_grad=True)
    assert torch.ops.tk.square(x).grad_fn.name() == "TkSquareBackward"
    square.square.register_autograd(lambda ctx, grad: grad * 0, setup_context=lambda ctx, inputs, output: None)
    try:
        y = torch.ops.tk.square(x)
        assert not y.grad_fn.name().startswith("Tk")
        (dx,) = torch.autograd.grad(y.sum(), x)
        assert torch.count_nonzero(dx) == 0  # the new formula, not the one the C++ node had
    finally:
        register_formula(square.square, backward=square.square_backward, arguments=(GRAD, "x"), gradients={"x": 0})
    (dx,) = torch.autograd.grad(torch.ops.tk.square(x).sum(), x)
    torch.testing.assert_close(dx, 2 * x.detach())
