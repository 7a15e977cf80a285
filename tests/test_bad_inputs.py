"""The inputs users actually hand an op, good and bad: each case either raises a
clear error naming the op, the argument and the problem, or returns what
PyTorch returns for the same arguments.

The cases are one table, ``CASES``: a name, the arguments (made on a device),
the tk call and either PyTorch's call on the same arguments or the error tk
must raise.  A new op joins with a few rows.  Errors already covered by
``tests/runtime/test_registry.py::ERROR_CASES`` are not repeated here;
docs/reliability.md lists both.

Everything runs on the CPU (Triton's interpreter) and, marked ``gpu``, on
CUDA; a few checks need a GPU only (tensors past 2**31 elements, two GPUs).
"""

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from reference import assert_close, pytorch_gelu

import ops  # noqa: F401  (registers torch.ops.tk.*)
from ops.rope import apply_rotary_pos_emb

tk = torch.ops.tk
# Huge values and infinities make the interpreter's numpy warn of overflow: expected, not a problem.
pytestmark = pytest.mark.filterwarnings("ignore:(overflow|invalid value) encountered:RuntimeWarning")
INF, NAN = float("inf"), float("nan")

# Agreement with PyTorch in the same dtype: both compute in float32 and round
# once, so they differ by an ulp or two of the storage dtype (float32: the
# order of a reduction's sum).  Relative to the largest finite value.
RTOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-12}


@dataclass(frozen=True)
class Raises:
    error: type
    message: str  # a regex the message must contain: the op, the argument, the problem


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[str], tuple]  # device -> the arguments
    tk: Callable  # tk's call on the arguments
    expect: Callable | Raises  # PyTorch's call on the same arguments, or the error tk raises
    devices: tuple = ("cpu", "cuda")


def randn(device, *shape, dtype=torch.float32, scale=1.0):
    return (scale * torch.randn(shape, device=device)).to(dtype)


def values(device, data, dtype=torch.float32):
    return torch.tensor(data, device=device, dtype=dtype)


def with_grad(fn, *inputs):
    """fn's output and the gradients of its inputs for a fixed, varied output gradient
    (ones would give softmax a zero gradient)."""
    leaves = [x.detach().requires_grad_() for x in inputs]  # detach keeps the layout; clone would not
    out = fn(*leaves)
    weight = torch.linspace(-1, 1, out.numel(), device=out.device).reshape(out.shape).to(out.dtype)
    return (out.detach(), *torch.autograd.grad(out, leaves, weight))


def grad_state(out):
    return out.requires_grad, out.grad_fn is None


# ---------------------------------------------------------------------------
# The table.
# ---------------------------------------------------------------------------

CASES = [
    # ------------------------------------------------ dtypes a kernel cannot take
    Case("gelu uint8", lambda d: (torch.ones(3, dtype=torch.uint8, device=d),), tk.gelu,
         Raises(TypeError, r"tk\.gelu: x has dtype uint8; supported: float32, float16, bfloat16, float64")),
    Case("gelu complex64", lambda d: (torch.ones(3, dtype=torch.complex64, device=d),), tk.gelu,
         Raises(TypeError, r"tk\.gelu: x has dtype complex64")),
    Case("gelu float8", lambda d: (torch.ones(3, device=d).to(torch.float8_e4m3fn),), tk.gelu,
         Raises(TypeError, r"tk\.gelu: x has dtype float8_e4m3fn")),
    Case("softmax bool", lambda d: (torch.ones(3, dtype=torch.bool, device=d),), lambda x: tk.softmax(x, 0),
         Raises(TypeError, r"tk\.softmax: x has dtype bool")),
    Case("softmax dtype int32", lambda d: (randn(d, 3),), lambda x: tk.softmax(x, 0, torch.int32),
         Raises(TypeError, r"tk\.softmax: dtype int32 is not a floating dtype; supported: float32, float16, bfloat16, float64")),
    Case("softmax_backward input_dtype bool", lambda d: (randn(d, 3), randn(d, 3)),
         lambda g, y: tk.softmax_backward(g, y, 0, torch.bool),
         Raises(TypeError, r"tk\.softmax_backward: input_dtype bool is not a floating dtype")),
    Case("softmax_backward int64 grad", lambda d: (torch.ones(3, dtype=torch.int64, device=d), randn(d, 3)),
         lambda g, y: tk.softmax_backward(g, y, 0), Raises(TypeError, r"tk\.softmax_backward: grad has dtype int64")),
    Case("gelu_backward int32 x", lambda d: (randn(d, 3), torch.ones(3, dtype=torch.int32, device=d)),
         lambda g, x: tk.gelu_backward(g, x, "none"), Raises(TypeError, r"tk\.gelu_backward: x has dtype int32")),
    Case("gelu_backward dtypes differ", lambda d: (randn(d, 3, dtype=torch.float16), randn(d, 3)),
         lambda g, x: tk.gelu_backward(g, x, "none"),
         Raises(TypeError, r"tk\.gelu_backward: grad has dtype torch\.float16 but x has dtype torch\.float32")),
    Case("matmul bool b", lambda d: (randn(d, 2, 3), torch.ones(3, 2, dtype=torch.bool, device=d)), tk.matmul,
         Raises(TypeError, r"tk\.matmul: b has dtype bool")),
    # ------------------------------------------------ float64: supported (matmul: CPU only, see test_ops)
    Case("gelu float64", lambda d: (randn(d, 7, 33, dtype=torch.float64, scale=3),), lambda x: tk.gelu(x, "tanh"),
         lambda x: F.gelu(x, approximate="tanh")),
    Case("softmax float64", lambda d: (randn(d, 7, 33, dtype=torch.float64, scale=3),), lambda x: tk.softmax(x, 0),
         lambda x: torch.softmax(x, 0)),
    Case("matmul float64 on CPU", lambda d: (randn(d, 9, 70, dtype=torch.float64), randn(d, 70, 5, dtype=torch.float64)),
         tk.matmul, torch.matmul, devices=("cpu",)),
    # ------------------------------------------------ arguments on different devices
    Case("matmul a on cpu with b on cuda", lambda d: (randn("cpu", 3, 4), randn(d, 4, 5)), tk.matmul,
         Raises(ValueError, r"tk\.matmul: a is on cpu but b is on cuda:0"), devices=("cuda",)),
    Case("gelu_backward grad on cuda with x on cpu", lambda d: (randn(d, 3), randn("cpu", 3)),
         lambda g, x: tk.gelu_backward(g, x, "none"),
         Raises(ValueError, r"tk\.gelu_backward: grad is on cuda:0 but x is on cpu"), devices=("cuda",)),
    Case("softmax_backward grad on cpu with y on cuda", lambda d: (randn("cpu", 3), randn(d, 3)),
         lambda g, y: tk.softmax_backward(g, y, 0),
         Raises(ValueError, r"tk\.softmax_backward: grad is on cpu but y is on cuda:0"), devices=("cuda",)),
    Case("softmax_backward grad on cpu with y on meta", lambda d: (randn(d, 3), torch.ones(3, device="meta")),
         lambda g, y: tk.softmax_backward(g, y, 0),
         Raises(ValueError, r"tk\.softmax_backward: grad is on cpu but y is on meta"), devices=("cpu",)),
    # ------------------------------------------------ rank
    Case("matmul 0-D a", lambda d: (randn(d), randn(d, 3, 3)), tk.matmul,
         Raises(ValueError, r"tk\.matmul: a must be 2 or 3-D, got a 0-D tensor of shape \(\)")),
    Case("matmul 1-D b", lambda d: (randn(d, 3, 3), randn(d, 3)), tk.matmul,
         Raises(ValueError, r"tk\.matmul: b must be 2 or 3-D, got a 1-D tensor of shape \(3,\)")),
    Case("matmul 4-D a", lambda d: (randn(d, 1, 2, 3, 3), randn(d, 3, 3)), tk.matmul,
         Raises(ValueError, r"tk\.matmul: a must be 2 or 3-D, got a 4-D tensor")),
    # ------------------------------------------------ shapes that do not multiply
    Case("matmul batched inner dims", lambda d: (randn(d, 2, 3, 4), randn(d, 2, 5, 6)), tk.matmul,
         Raises(ValueError, r"tk\.matmul: a has shape \(2, 3, 4\) and b has shape \(2, 5, 6\): inner dimensions 4 and 5 differ")),
    Case("matmul 2-D by 3-D inner dims", lambda d: (randn(d, 3, 4), randn(d, 2, 5, 6)), tk.matmul,
         Raises(ValueError, r"inner dimensions 4 and 5 differ")),
    Case("matmul batch 1 is not broadcast", lambda d: (randn(d, 1, 3, 4), randn(d, 3, 4, 5)), tk.matmul,
         Raises(ValueError, r"tk\.matmul: batch sizes differ: a has 1, b has 3")),
    Case("gelu_backward shapes differ", lambda d: (randn(d, 3, 4), randn(d, 4, 3)),
         lambda g, x: tk.gelu_backward(g, x, "none"),
         Raises(ValueError, r"tk\.gelu_backward: grad has shape \(3, 4\) but x has \(4, 3\)")),
    # ------------------------------------------------ arguments of the wrong kind
    Case("gelu of a list", lambda d: ([1.0, 2.0],), tk.gelu,
         Raises(RuntimeError, r"Expected a value of type 'Tensor' for argument 'x'")),
    Case("softmax float dim", lambda d: (randn(d, 3), 0.5), tk.softmax,
         Raises(RuntimeError, r"Expected a value of type 'int' for argument 'dim'")),
    Case("gelu approximate None", lambda d: (randn(d, 3), None), tk.gelu,
         Raises(RuntimeError, r"Expected a value of type 'str' for argument 'approximate'")),
    Case("gelu approximate 'TANH'", lambda d: (randn(d, 3), "TANH"), tk.gelu,
         Raises(ValueError, r"tk\.gelu: approximate must be 'none' or 'tanh', got 'TANH'")),
    # ------------------------------------------------ dim
    Case("softmax_backward dim out of range", lambda d: (randn(d, 3, 4), randn(d, 3, 4)),
         lambda g, y: tk.softmax_backward(g, y, 2),
         Raises(IndexError, r"tk\.softmax_backward: dim 2 is out of range for a 2-D tensor \(expected -2 to 1\)")),
    Case("softmax dim 2**40", lambda d: (randn(d, 3),), lambda x: tk.softmax(x, 2**40),
         Raises(IndexError, r"tk\.softmax: dim 1099511627776 is out of range")),
    *[
        Case(f"softmax dim {dim} of 3-D", lambda d: (randn(d, 4, 5, 6, scale=3),),
             lambda x, dim=dim: with_grad(lambda t: tk.softmax(t, dim), x),
             lambda x, dim=dim: with_grad(lambda t: torch.softmax(t, dim), x))
        for dim in (-1, -2, -3, 1)
    ],
    # ------------------------------------------------ 0-D tensors
    Case("gelu 0-D", lambda d: (values(d, -1.5),), lambda x: with_grad(tk.gelu, x), lambda x: with_grad(F.gelu, x)),
    Case("softmax 0-D dim 0", lambda d: (values(d, 7.0),), lambda x: tk.softmax(x, 0), lambda x: torch.softmax(x, 0)),
    Case("softmax 0-D dim -1 of -inf", lambda d: (values(d, -INF),), lambda x: tk.softmax(x, -1),
         lambda x: torch.softmax(x, -1)),
    Case("softmax 0-D dim 1", lambda d: (values(d, 7.0),), lambda x: tk.softmax(x, 1),
         Raises(IndexError, r"tk\.softmax: dim 1 is out of range for a 0-D tensor \(expected -1 to 0\)")),
    Case("softmax_backward 0-D", lambda d: (values(d, 2.0), values(d, 1.0)), lambda g, y: tk.softmax_backward(g, y, 0),
         lambda g, y: y * (g - g * y)),
    # ------------------------------------------------ zero-size dims, in every position
    *[
        Case(f"gelu empty {shape}", lambda d, shape=shape: (randn(d, *shape),), lambda x: with_grad(tk.gelu, x),
             lambda x: with_grad(F.gelu, x))
        for shape in [(0,), (0, 3, 4), (3, 0, 4), (3, 4, 0)]
    ],
    *[
        Case(f"softmax empty {shape} dim {dim}", lambda d, shape=shape: (randn(d, *shape),),
             lambda x, dim=dim: with_grad(lambda t: tk.softmax(t, dim), x),
             lambda x, dim=dim: with_grad(lambda t: torch.softmax(t, dim), x))
        for shape in [(0, 3, 4), (3, 0, 4), (3, 4, 0)]
        for dim in (0, 1, 2)
    ],
    *[
        Case(f"matmul empty {sa} @ {sb}", lambda d, sa=sa, sb=sb: (randn(d, *sa), randn(d, *sb)),
             lambda a, b: with_grad(tk.matmul, a, b), lambda a, b: with_grad(torch.matmul, a, b))
        for sa, sb in [
            ((0, 4), (4, 5)),  # M = 0
            ((3, 4), (4, 0)),  # N = 0
            ((3, 0), (0, 5)),  # K = 0: zeros, a sum of nothing
            ((0, 3, 4), (0, 4, 5)),  # a batch of 0 (once launched a 1-batch grid on empty memory)
            ((0, 3, 4), (4, 5)),  # a batch of 0, b broadcast
            ((3, 4), (0, 4, 5)),  # a batch of 0, a broadcast
            ((2, 3, 0), (2, 0, 5)),  # batched, K = 0
        ]
    ],
    # ------------------------------------------------ layouts: strided, overlapping, offset
    Case("gelu expanded (stride 0)", lambda d: (randn(d, 1, 33).expand(5, 33),), lambda x: with_grad(tk.gelu, x),
         lambda x: with_grad(F.gelu, x)),
    Case("softmax expanded along dim", lambda d: (randn(d, 1, 33).expand(5, 33),),
         lambda x: with_grad(lambda t: tk.softmax(t, 0), x), lambda x: with_grad(lambda t: torch.softmax(t, 0), x)),
    Case("gelu overlapping windows (unfold)", lambda d: (randn(d, 40).unfold(0, 7, 3),),
         lambda x: with_grad(tk.gelu, x), lambda x: with_grad(F.gelu, x)),
    Case("softmax overlapping windows (unfold)", lambda d: (randn(d, 40).unfold(0, 7, 3),),
         lambda x: with_grad(lambda t: tk.softmax(t, 1), x), lambda x: with_grad(lambda t: torch.softmax(t, 1), x)),
    Case("matmul overlapping windows", lambda d: (randn(d, 80).unfold(0, 9, 2), randn(d, 9, 20)[:, ::2]),
         lambda a, b: with_grad(tk.matmul, a, b), lambda a, b: with_grad(torch.matmul, a, b)),
    Case("matmul stride-0 rows and columns", lambda d: (randn(d, 1, 17).expand(6, 17), randn(d, 17, 1).expand(17, 9)),
         tk.matmul, torch.matmul),
    Case("gelu offset view", lambda d: (randn(d, 9, 40)[2:, 3:],), lambda x: with_grad(tk.gelu, x),
         lambda x: with_grad(F.gelu, x)),
    Case("gelu channels_last", lambda d: (randn(d, 2, 5, 6, 7).to(memory_format=torch.channels_last),),
         lambda x: (tk.gelu(x), tk.gelu(x).stride()), lambda x: (F.gelu(x), F.gelu(x).stride())),
    Case("softmax channels_last dim 1", lambda d: (randn(d, 2, 5, 6, 7).to(memory_format=torch.channels_last),),
         lambda x: with_grad(lambda t: tk.softmax(t, 1), x), lambda x: with_grad(lambda t: torch.softmax(t, 1), x)),
    Case("matmul batch stride smallest", lambda d: (randn(d, 5, 3, 7).permute(1, 0, 2), randn(d, 7, 3, 4).transpose(0, 1)),
         lambda a, b: with_grad(tk.matmul, a, b), lambda a, b: with_grad(torch.matmul, a, b)),
    # ------------------------------------------------ one tensor as two arguments
    Case("matmul x @ x", lambda d: (randn(d, 17, 17),), lambda x: tk.matmul(x, x), lambda x: x @ x),
    Case("gelu_backward of x and x", lambda d: (randn(d, 33),), lambda x: tk.gelu_backward(x, x, "tanh"),
         lambda x: torch.ops.aten.gelu_backward(x, x, approximate="tanh")),
    Case("softmax_backward of y and y", lambda d: (torch.softmax(randn(d, 4, 9), -1),),
         lambda y: tk.softmax_backward(y, y, -1), lambda y: torch._softmax_backward_data(y, y, -1, y.dtype)),
    # ------------------------------------------------ NaN and infinities: propagated as PyTorch does
    *[
        Case(f"gelu {approx} NaN and infinities in {str(dtype)[6:]}",
             lambda d, dtype=dtype: (values(d, [NAN, INF, -INF, 0.0, -0.0, 1.0], dtype),),
             lambda x, a=approx: with_grad(lambda t: tk.gelu(t, a), x),
             lambda x, a=approx: with_grad(lambda t: pytorch_gelu(t, a), x))
        for approx in ("none", "tanh")
        for dtype in (torch.float32, torch.bfloat16)
    ],
    Case("softmax rows with NaN or infinities", lambda d: (values(d, [[NAN, 1, 2], [INF, 1, 2], [INF, INF, 0],
                                                                    [-INF, 1, 2], [-INF, -INF, 5]]),),
         lambda x: tk.softmax(x, -1), lambda x: torch.softmax(x, -1)),
    Case("softmax columns all -inf (dim 0)", lambda d: (values(d, [[-INF, 1, -INF], [-INF, 2, 0]]),),
         lambda x: tk.softmax(x, 0), lambda x: torch.softmax(x, 0)),
    Case("softmax_backward NaN grad", lambda d: (values(d, [[NAN, 1, 2], [1, 2, 3]]), torch.softmax(randn(d, 2, 3), -1)),
         lambda g, y: tk.softmax_backward(g, y, -1), lambda g, y: torch._softmax_backward_data(g, y, -1, y.dtype)),
    Case("matmul NaN and infinities and inf * 0", lambda d: (values(d, [[NAN, 1.0], [INF, 1.0], [INF, -INF], [1.0, 2.0]]),
                                                     values(d, [[1.0, 0.0], [1.0, 1.0]])),
         tk.matmul, torch.matmul),
    # ------------------------------------------------ huge values in half precision
    *[
        Case(f"gelu {approx} huge bfloat16", lambda d: (values(d, [3e38, -3e38, 1e30, -1e30, 6e4, -6e4], torch.bfloat16),),
             lambda x, a=approx: with_grad(lambda t: tk.gelu(t, a), x),
             lambda x, a=approx: with_grad(lambda t: pytorch_gelu(t, a), x))
        for approx in ("none", "tanh")
    ],
    Case("gelu float16 at its limits", lambda d: (values(d, [65504, -65504, 300, -300], torch.float16),),
         lambda x: tk.gelu(x, "tanh"), lambda x: F.gelu(x, approximate="tanh")),
    Case("softmax huge bfloat16", lambda d: (values(d, [[3e38, -3e38, 1.0], [3e38, 3e38, -3e38], [1e30, 1e29, 0]],
                                                   torch.bfloat16),),
         lambda x: tk.softmax(x, -1), lambda x: torch.softmax(x, -1)),
    Case("matmul bfloat16 overflow to inf", lambda d: (values(d, [[3e38] * 64, [1.0] * 64], torch.bfloat16),
                                                        torch.ones(64, 2, dtype=torch.bfloat16, device=d)),
         tk.matmul, torch.matmul),
    Case("matmul float16 overflow to inf", lambda d: (torch.full((2, 8), 300.0, dtype=torch.float16, device=d),
                                                       torch.full((8, 2), 300.0, dtype=torch.float16, device=d)),
         tk.matmul, torch.matmul),
    # ------------------------------------------------ requires_grad inputs where no graph is recorded
    Case("gelu requires_grad under no_grad", lambda d: (randn(d, 5).requires_grad_(),),
         lambda x: _no_grad(lambda: grad_state(tk.gelu(x))), lambda x: _no_grad(lambda: grad_state(F.gelu(x)))),
    Case("softmax requires_grad under no_grad", lambda d: (randn(d, 5).requires_grad_(),),
         lambda x: _no_grad(lambda: grad_state(tk.softmax(x, 0))),
         lambda x: _no_grad(lambda: grad_state(torch.softmax(x, 0)))),
    Case("matmul requires_grad under no_grad", lambda d: (randn(d, 3, 4).requires_grad_(), randn(d, 4, 2)),
         lambda a, b: _no_grad(lambda: grad_state(tk.matmul(a, b))),
         lambda a, b: _no_grad(lambda: grad_state(torch.matmul(a, b)))),
    Case("gelu under inference_mode", lambda d: (randn(d, 5).requires_grad_(),),
         lambda x: _inference(lambda: (tk.gelu(x), tk.gelu(x).is_inference())),
         lambda x: _inference(lambda: (F.gelu(x), F.gelu(x).is_inference()))),
    # ------------------------------------------------ rope (ops/rope.py; tests/ops/test_rope.py has the rest)
    Case("rope int32 q", lambda d: (torch.ones(1, 2, 3, 8, dtype=torch.int32, device=d), randn(d, 1, 1, 3, 8),
                                    randn(d, 1, 3, 8), randn(d, 1, 3, 8)),
         tk.rope, Raises(TypeError, r"tk\.rope: q has dtype int32; supported: float32, float16, bfloat16, float64")),
    Case("rope odd head_dim", lambda d: (randn(d, 1, 2, 3, 7), randn(d, 1, 1, 3, 7), randn(d, 1, 3, 7), randn(d, 1, 3, 7)),
         tk.rope, Raises(ValueError, r"tk\.rope: head_dim must be even \(rotate_half splits it in two\), got 7")),
    Case("rope cos on cpu with q on cuda", lambda d: (randn(d, 1, 2, 3, 8), randn(d, 1, 1, 3, 8), randn("cpu", 1, 3, 8),
                                                      randn("cpu", 1, 3, 8)),
         tk.rope, Raises(ValueError, r"tk\.rope: q is on cuda:0 but cos is on cpu"), devices=("cuda",)),
    Case("rope bfloat16 q and k with float32 cos and sin", lambda d: (randn(d, 2, 5, 3, 16, dtype=torch.bfloat16).transpose(1, 2),
                                                                      randn(d, 2, 5, 1, 16, dtype=torch.bfloat16).transpose(1, 2),
                                                                      randn(d, 1, 5, 16), randn(d, 1, 5, 16)),
         lambda q, k, c, s: with_grad(lambda a, b: torch.cat([t.flatten() for t in tk.rope(a, b, c, s)]), q, k),
         lambda q, k, c, s: with_grad(lambda a, b: torch.cat([t.flatten() for t in apply_rotary_pos_emb(a, b, c, s)]), q, k)),
    Case("rope empty batch", lambda d: (randn(d, 0, 2, 3, 8), randn(d, 0, 1, 3, 8), randn(d, 1, 3, 8), randn(d, 1, 3, 8)),
         lambda q, k, c, s: with_grad(lambda a, b: torch.cat([t.flatten() for t in tk.rope(a, b, c, s)]), q, k),
         lambda q, k, c, s: with_grad(lambda a, b: torch.cat([t.flatten() for t in apply_rotary_pos_emb(a, b, c, s)]), q, k)),
    Case("rope requires_grad under no_grad", lambda d: (randn(d, 1, 2, 3, 8).requires_grad_(), randn(d, 1, 1, 3, 8),
                                                        randn(d, 1, 3, 8), randn(d, 1, 3, 8)),
         lambda q, k, c, s: _no_grad(lambda: [grad_state(t) for t in tk.rope(q, k, c, s)]),
         lambda q, k, c, s: _no_grad(lambda: [grad_state(t) for t in apply_rotary_pos_emb(q, k, c, s)])),
    # ------------------------------------------------ limits of a CUDA grid (stride-0 tensors: no memory needed)
    Case("matmul batch past the grid", lambda d: (randn(d, 1, 1, 1).expand(65536, 1, 1), randn(d, 1, 1)),
         tk.matmul, Raises(ValueError, r"tk\.matmul: a batch of 65536 matrices is more than a CUDA grid holds"),
         devices=("cuda",)),
    Case("softmax rows past the grid", lambda d: (randn(d, 1, 1, dtype=torch.bfloat16).expand(2**31, 1),),
         lambda x: tk.softmax(x, -1), Raises(ValueError, r"tk\.softmax: 2147483648 rows of 1 along dim 1 .* more than a CUDA grid holds"),
         devices=("cuda",)),
]  # fmt: skip


def _no_grad(fn):
    with torch.no_grad():
        return fn()


def _inference(fn):
    with torch.inference_mode():
        return fn()


def _params(cases):
    out = []
    for case in cases:
        for device in case.devices:
            marks = [pytest.mark.gpu] if device == "cuda" else []
            out.append(pytest.param(case, device, id=f"{device}-{case.name}", marks=marks))
    return out


def _assert_same(got, want, where="output"):
    """tk's answer is PyTorch's: same structure, shapes, dtypes and devices;
    the same NaN and infinities; finite values within an ulp or two."""
    if isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want), f"{where}: {got!r} vs {want!r}"
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_same(g, w, f"{where}[{i}]")
        return
    if not isinstance(want, torch.Tensor):
        assert got == want, f"{where}: {got!r}, PyTorch gives {want!r}"
        return
    assert isinstance(got, torch.Tensor), f"{where}: {type(got).__name__}, PyTorch gives a tensor"
    assert (got.shape, got.dtype, got.device) == (want.shape, want.dtype, want.device), where
    finite = want[torch.isfinite(want)]
    scale = finite.abs().max().item() if finite.numel() else 1.0
    rtol = RTOL[want.dtype]
    torch.testing.assert_close(got, want, rtol=rtol, atol=rtol * max(scale, 1e-30), equal_nan=True, msg=where)


@pytest.mark.parametrize("case, device", _params(CASES))
def test_bad_input(case, device):
    args = case.make(device)
    if isinstance(case.expect, Raises):
        with pytest.raises(case.expect.error, match=case.expect.message):
            case.tk(*args)
    else:
        _assert_same(case.tk(*args), case.expect(*args))


def test_the_table_has_the_cases_the_reliability_table_promises():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names)), "two cases with one name"
    assert len(CASES) >= 25


# ---------------------------------------------------------------------------
# Outputs are fresh tensors: never an input, a view of one, or overlapping one.
# ---------------------------------------------------------------------------


def _storages(*tensors):
    return {t.untyped_storage().data_ptr() for t in tensors if t.numel()}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_outputs_never_alias_the_inputs(device):
    x = randn(device, 6, 8)
    y = torch.softmax(x, -1)
    x_before, y_before = x.clone(), y.clone()
    calls = [
        (tk.gelu, (x,)),
        (tk.gelu, (x.t(),)),  # dense, transposed: the output keeps the layout, in new memory
        (tk.gelu, (x[:, :1],)),
        (tk.softmax, (x, 0)),
        (tk.softmax, (x[:, 2:3], 1)),  # rows of one: the answer is all ones, still new memory
        (tk.matmul, (x, x.t())),
        (tk.matmul, (torch.eye(6, device=device), x)),  # the identity: same values, new memory
        (tk.gelu_backward, (x, x, "none")),
        (tk.softmax_backward, (y, y, -1)),
    ]
    for op, args in calls:
        out = op(*args)
        inputs = [a for a in args if isinstance(a, torch.Tensor)]
        assert not (_storages(out) & _storages(*inputs)), f"{op}: output shares memory with an input"
        out.fill_(123.0)  # writing the output must leave the inputs alone
        assert torch.equal(x, x_before) and torch.equal(y, y_before), op


# ---------------------------------------------------------------------------
# Checks that need a GPU.
# ---------------------------------------------------------------------------


@pytest.fixture
def two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")


@pytest.mark.gpu
def test_arguments_on_two_gpus(two_gpus):
    a, b = torch.randn(3, 4, device="cuda:0"), torch.randn(4, 5, device="cuda:1")
    with pytest.raises(ValueError, match=r"tk\.matmul: a is on cuda:0 but b is on cuda:1"):
        tk.matmul(a, b)
    with pytest.raises(ValueError, match=r"tk\.gelu_backward: grad is on cuda:1 but x is on cuda:0"):
        tk.gelu_backward(torch.randn(3, device="cuda:1"), torch.randn(3, device="cuda:0"), "none")


@pytest.mark.gpu
def test_an_op_on_the_second_gpu(two_gpus):
    """The kernels must run on the tensors' GPU, not on the current one (cuda:0)."""
    assert torch.cuda.current_device() == 0
    x = torch.randn(1000, 1001, device="cuda:1")
    assert_close(tk.gelu(x), F.gelu(x.double()), torch.float32)
    assert_close(tk.softmax(x, 0), torch.softmax(x.double(), 0), torch.float32)
    assert_close(tk.matmul(x[:, :512], x[:512]), x[:, :512].double() @ x[:512].double(), torch.float32)
    w, b = torch.randn(1001, device="cuda:1"), torch.randn(1001, device="cuda:1")
    x64, w64, b64 = x.double(), w.double(), b.double()
    assert_close(tk.rms_norm(x, w, 1e-6), F.rms_norm(x64, (1001,), w64, 1e-6), torch.float32)
    assert_close(tk.layer_norm(x, [1001], w, b, 1e-5), F.layer_norm(x64, (1001,), w64, b64, 1e-5), torch.float32)
    assert_close(tk.swiglu(x, x.flip(0)), F.silu(x64) * x64.flip(0), torch.float32)
    target = torch.randint(0, 1001, (1000,), device="cuda:1")
    assert_close(tk.cross_entropy(x, target), F.cross_entropy(x64, target), torch.float32)
    torch.cuda.synchronize(1)


@pytest.mark.gpu
def test_backward_and_compile_on_the_second_gpu(two_gpus):
    """Autograd's backward and Inductor's launches must also follow the tensors to cuda:1."""
    x = torch.randn(257, 1001, device="cuda:1", requires_grad=True)
    x64 = x.detach().double().requires_grad_()
    grad = torch.randn(257, 1001, device="cuda:1")
    tk.softmax(x, -1).backward(grad)
    torch.softmax(x64, -1).backward(grad.double())
    assert_close(x.grad, x64.grad, torch.float32)
    compiled = torch.compile(lambda t: tk.gelu(tk.softmax(t, -1), "tanh"), fullgraph=True)
    expected = F.gelu(torch.softmax(x64.detach(), -1), approximate="tanh")
    assert_close(compiled(x.detach()), expected, torch.float32)
    torch.cuda.synchronize(1)


def _free():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.big_memory
def test_matmul_output_past_2_to_the_31_elements():
    """int64 row offsets in the store: rows past 2**31 / N would wrap with int32."""
    M, N, K = 65536 + 3, 32768 + 8, 64  # M * N = 2**31 + 786456
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    c = tk.matmul(a, b)
    assert c.shape == (M, N)
    for rows in [slice(0, 64), slice(65536 - 64, 65536 + 3)]:  # the first rows, and the rows past 2**31
        assert_close(c[rows], a[rows].double() @ b.double(), torch.bfloat16)
    del a, b, c
    _free()


@pytest.mark.gpu
@pytest.mark.big_memory
def test_softmax_along_dim_0_past_2_to_the_31_elements():
    """Rows 2**30 elements apart: a row's offsets pass 2**31 (cols * inner in int64)."""
    inner = (1 << 30) + 3
    x = torch.randn(2, inner, device="cuda", dtype=torch.bfloat16)
    y = tk.softmax(x, 0)
    for window in [slice(0, 4096), slice(inner - 4096, inner)]:
        assert_close(y[:, window], torch.softmax(x[:, window].double(), 0), torch.bfloat16)
    del x, y
    _free()


@pytest.mark.gpu
@pytest.mark.big_memory
def test_softmax_backward_past_2_to_the_31_elements():
    rows, cols = 2049, 1 << 20
    y = torch.softmax(torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16), -1)
    grad = torch.randn_like(y)
    dx = tk.softmax_backward(grad, y, -1)
    for r in [0, rows - 1]:
        y64, g64 = y[r].double(), grad[r].double()
        assert_close(dx[r], y64 * (g64 - (g64 * y64).sum()), torch.bfloat16, scale=2)
    del y, grad, dx
    _free()


# ---------------------------------------------------------------------------
# docs/reliability.md cites tests that exist.
# ---------------------------------------------------------------------------


def test_the_reliability_table_cites_tests_that_exist():
    import re
    from pathlib import Path

    tests = Path(__file__).parent
    text = (tests.parent / "docs" / "reliability.md").read_text()
    cited = re.findall(r"(?<![\w/])((?:\w+/)?test_\w+\.py)::(\w+)", text)
    assert len(cited) > 30
    for file, name in cited:
        source = (tests / file.removeprefix("tests/")).read_text()
        assert f"def {name}(" in source or f"{name} = " in source, f"docs/reliability.md cites {file}::{name}"
    case_names = {c.name for c in CASES}
    for quoted in re.findall(r"test_bad_input\[(?:\*|cpu|cuda)-([^\]]+)\]", text):
        for name in re.split(r", (?=[A-Za-z])", quoted):  # not inside a shape: "(0, 3, 4)"
            assert name in case_names, f"docs/reliability.md cites a case {name!r} that CASES does not have"
