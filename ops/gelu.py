"""GELU: the first elementwise op, forward and backward.

    gelu(x)      = x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2)))          approximate="none"
    gelu_tanh(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))  approximate="tanh"

Each program handles one BLOCK_SIZE slice of the flattened tensor: the
pattern of every elementwise kernel.  The work is one read and one write per
element, so the kernel is bound by memory bandwidth; the math is done in
float32 whatever the storage dtype.
"""

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .blocks.elementwise import (
    block_offsets,
    elements_per_thread,
    elementwise_config,
    elementwise_grid,
    in_whole_block,
    walk_in_one_order,
    whole_blocks_end,
)
from .blocks.fastmath import LOG2E
from .runtime import GRAD, check_same, check_tensor, launcher, register_formula, register_op
from .spec import ELEMENTWISE_SHAPES, ROUNDING_TOLERANCE, OpSpec, describe_numel, model, register_spec

SQRT_1_2 = tl.constexpr(0.7071067811865476)  # 1/sqrt(2)
SQRT_2_PI = tl.constexpr(0.7978845608028654)  # sqrt(2/pi)
INV_SQRT_2PI = tl.constexpr(0.3989422804014327)  # 1/sqrt(2*pi)
TANH_CUBIC = tl.constexpr(0.044715)
TWO_TO_MINUS_64 = tl.constexpr(2.0**-64)

# P in erfc(z) = t * exp(-z^2 + P(t)), t = 1 / (1 + z/2): the polynomial of
# _normal_cdf_16bit, lowest degree first.  A least-squares fit in Chebyshev
# form of ln(erfc(z) / t) + z^2 over z in [0, 12] (erfc in float64); the
# relative error of erfc it gives is under 8e-7 (tests/test_ops.py checks it).
ERFC_POLY = (-1.2654688, 0.998453409, 0.394841542, -0.042764389, 0.355947146, -1.0078109, 0.755545227, -0.188743973)
_P0, _P1, _P2, _P3, _P4, _P5, _P6, _P7 = (tl.constexpr(c) for c in ERFC_POLY)


@triton.jit
def _normal_cdf_16bit(x):
    """Phi(x), the standard normal CDF, to about 1e-6 relative: for results
    rounded to bfloat16 or float16 (8 or 11 bits).

    libdevice's erf picks its polynomial's coefficients per element from two
    ranges: about 37 instructions an element with the loads and stores.  At the
    element rate of a 16-bit tensor that makes the forward issue-bound (on an
    H100, 2^28 float16 elements: 94% of copy bandwidth where eager got 97%).
    This form has one range (30 instructions an element) and no cancellation
    for negative x, where Phi(x) = erfc(|x| / sqrt 2) / 2."""
    z = tl.abs(x) * SQRT_1_2
    t = 1.0 / (1.0 + 0.5 * z)
    p = ((((((_P7 * t + _P6) * t + _P5) * t + _P4) * t + _P3) * t + _P2) * t + _P1) * t + _P0
    # Phi(-|x|) = t exp(P - z^2) / 2.  The GPU's exp2 flushes results under
    # 2^-126 to zero, and Phi(-13) is 6e-39: so exp2 is taken 63 octaves up
    # (the halving folded in) and brought down by a multiply, which keeps
    # float32's subnormals (bfloat16 holds gelu(x) down to x = -13.5).
    tail = t * tl.exp2((p - z * z) * LOG2E + 63.0) * TWO_TO_MINUS_64
    return tl.where(x >= 0, 1.0 - tail, tail)


@triton.jit
def _forward_block(x_ptr, y_ptr, offsets, mask, APPROXIMATE_TANH: tl.constexpr):
    x = tl.load(x_ptr + offsets, mask=mask)
    if x.dtype != tl.float64:  # resolved at compile time: half and float32 inputs compute in float32
        x = x.to(tl.float32)
    if APPROXIMATE_TANH:
        # 0.5 * (1 + tanh(u)) is sigmoid(2u): the same function without the
        # cancellation of 1 + tanh(u) for large negative x (it would give 0).
        inner = SQRT_2_PI * (x + TANH_CUBIC * x * x * x)
        y = x * tl.sigmoid(2.0 * inner)
    elif y_ptr.dtype.element_ty.primitive_bitwidth == 16:
        y = x * _normal_cdf_16bit(x)
    else:
        y = 0.5 * x * (1.0 + tl.math.erf(x * SQRT_1_2))
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gelu_forward_kernel(x_ptr, y_ptr, n_elements, APPROXIMATE_TANH: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    offsets = block_offsets(BLOCK_SIZE)
    # Whole blocks apart from the tail, so that any n gets 16-byte accesses (ops/blocks/elementwise.py).
    if in_whole_block(n_elements, BLOCK_SIZE):
        _forward_block(x_ptr, y_ptr, offsets, offsets < whole_blocks_end(n_elements, BLOCK_SIZE), APPROXIMATE_TANH)
    else:  # the last block hangs past the end
        _forward_block(x_ptr, y_ptr, offsets, offsets < n_elements, APPROXIMATE_TANH)


@triton.jit
def _backward_block(grad_ptr, x_ptr, dx_ptr, offsets, mask, APPROXIMATE_TANH: tl.constexpr):
    x = tl.load(x_ptr + offsets, mask=mask)
    grad = tl.load(grad_ptr + offsets, mask=mask)
    if x.dtype != tl.float64:
        x = x.to(tl.float32)
        grad = grad.to(tl.float32)
    if APPROXIMATE_TANH:
        # y = x * s with s = sigmoid(2u): dy/dx = s + 2 x s (1 - s) du/dx
        inner = SQRT_2_PI * (x + TANH_CUBIC * x * x * x)
        s = tl.sigmoid(2.0 * inner)
        d_inner = SQRT_2_PI * (1.0 + 3.0 * TANH_CUBIC * x * x)
        dy_dx = s + 2.0 * x * s * (1.0 - s) * d_inner
    else:
        if dx_ptr.dtype.element_ty.primitive_bitwidth == 16:
            cdf = _normal_cdf_16bit(x)  # the forward's form: fewer instructions, exact tail
        else:
            cdf = 0.5 * (1.0 + tl.math.erf(x * SQRT_1_2))
        # exp(-x^2 / 2) taken 64 octaves up and brought down, as in
        # _normal_cdf_16bit, so that the tail keeps float32's subnormals.
        pdf = INV_SQRT_2PI * tl.exp2(-0.5 * x * x * LOG2E + 64.0) * TWO_TO_MINUS_64
        dy_dx = cdf + x * pdf
    tl.store(dx_ptr + offsets, (grad * dy_dx).to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gelu_backward_kernel(
    grad_ptr, x_ptr, dx_ptr, n_elements, APPROXIMATE_TANH: tl.constexpr, BLOCK_SIZE: tl.constexpr
):
    offsets = block_offsets(BLOCK_SIZE)
    if in_whole_block(n_elements, BLOCK_SIZE):  # see gelu_forward_kernel
        whole = offsets < whole_blocks_end(n_elements, BLOCK_SIZE)
        _backward_block(grad_ptr, x_ptr, dx_ptr, offsets, whole, APPROXIMATE_TANH)
    else:
        _backward_block(grad_ptr, x_ptr, dx_ptr, offsets, offsets < n_elements, APPROXIMATE_TANH)


def _check_approximate(approximate: str) -> bool:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"tk.gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return approximate == "tanh"


def _gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    check_tensor("gelu", "x", x)
    tanh = _check_approximate(approximate)
    (x,) = walk_in_one_order(x)  # a dense tensor of any layout is one flat span; others are copied once
    y = torch.empty_like(x)  # same strides as x, so both are walked in the same flat order
    n = x.numel()
    if n == 0:
        return y
    block, warps = elementwise_config(n, x.device, elements_per_thread(x))
    launcher(gelu_forward_kernel, x)[elementwise_grid(n, block)](
        x, y, n, APPROXIMATE_TANH=tanh, BLOCK_SIZE=block, num_warps=warps
    )
    return y


def _gelu_backward(grad: torch.Tensor, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    check_tensor("gelu_backward", "grad", grad)
    check_tensor("gelu_backward", "x", x)
    check_same("gelu_backward", {"grad": grad, "x": x})
    if grad.shape != x.shape:
        raise ValueError(f"tk.gelu_backward: grad has shape {tuple(grad.shape)} but x has {tuple(x.shape)}")
    tanh = _check_approximate(approximate)
    x, grad = walk_in_one_order(x, grad)
    dx = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return dx
    # The 16-bit erf form does the most math per byte of any kernel here: at 8
    # a thread it measured 1-1.5 points of copy over 4 (perf notes, version 35).
    per_thread = elements_per_thread(x, inputs=2)
    if not tanh and x.element_size() == 2:
        per_thread = max(per_thread, 8)
    block, warps = elementwise_config(n, x.device, per_thread)
    launcher(gelu_backward_kernel, x)[elementwise_grid(n, block)](
        grad, x, dx, n, APPROXIMATE_TANH=tanh, BLOCK_SIZE=block, num_warps=warps
    )
    return dx


gelu = register_op("gelu", _gelu)
gelu_backward = register_op("gelu_backward", _gelu_backward)


register_formula(gelu, backward=gelu_backward, arguments=(GRAD, "x", "approximate"), gradients={"x": 0})


# --------------------------------------------------------------------------
# What the comparison harness reads.
# --------------------------------------------------------------------------


def gelu_erf_unfused(x: torch.Tensor) -> torch.Tensor:
    """The erf GELU as people write it by hand: several kernels in eager mode."""
    return 0.5 * x * (1 + torch.erf(x * 0.7071067811865476))


def gelu_tanh_unfused(x: torch.Tensor) -> torch.Tensor:
    """The tanh GELU as people write it by hand: several kernels in eager mode."""
    return 0.5 * x * (1 + torch.tanh(0.79788456 * (x + 0.044715 * x**3)))


def _cuda_gelu(approximate: str):
    """The same GELU in CUDA C++ (ops/tour/gelu_cuda.py), a rung of the lessons' ladder beside tk's
    Triton: built on first use where nvcc is; elsewhere ImportError says why, and the harness skips it."""
    from .tour import gelu_cuda

    return gelu_cuda.load(approximate)


def _make_inputs(shape, dtype, device):
    (n,) = shape
    return (torch.randn(n, dtype=dtype, device=device),)


def _bytes(shape, dtype):
    (n,) = shape
    return 2 * n * torch.empty((), dtype=dtype).element_size()  # read x, write y


# "gelu" is F.gelu's default, the erf form; "gelu_tanh" the tanh approximation.
# GELU sits in GPT-2's MLP: (tokens x intermediate) elements, and a flat length that is no
# multiple of anything.
GELU_SHAPES = {**ELEMENTWISE_SHAPES, "real": [(tokens * model(name).intermediate,) for tokens, name in
                                             ((1000, "gpt2"), (4095, "gpt2-large"), (8191, "gpt2-xl"))] + [(10**8 + 7,)]}

_FORWARDS = (("none", "gelu", 8, gelu_erf_unfused), ("tanh", "gelu_tanh", 10, gelu_tanh_unfused))
for _approximate, _name, _flops, _unfused in _FORWARDS:
    register_spec(
        OpSpec(
            name=_name,
            tk=lambda x, a=_approximate: torch.ops.tk.gelu(x, a),
            reference=lambda x, a=_approximate: F.gelu(x, approximate=a),
            unfused={"eager-unfused": _unfused},
            peers={"cuda": functools.partial(_cuda_gelu, _approximate)},
            make_inputs=_make_inputs,
            bytes_moved=_bytes,
            flops=lambda shape, dtype, f=_flops: f * shape[0],
            tolerance=ROUNDING_TOLERANCE,
            shapes=GELU_SHAPES,
            describe=describe_numel,
            call=f'tk.gelu(x, "{_approximate}") against F.gelu(x, approximate="{_approximate}")',
        )
    )


def _make_backward_inputs(shape, dtype, device):
    (n,) = shape
    return torch.randn(n, dtype=dtype, device=device), torch.randn(n, dtype=dtype, device=device)  # grad, x


def _backward_bytes(shape, dtype):
    (n,) = shape
    return 3 * n * torch.empty((), dtype=dtype).element_size()  # read grad and x, write dx


# The backward kernels on their own: tk.gelu_backward against aten's, which is
# what eager autograd runs and what Inductor fuses under torch.compile.
for _approximate, _name, _flops in (("none", "gelu_backward", 12), ("tanh", "gelu_tanh_backward", 16)):
    register_spec(
        OpSpec(
            name=_name,
            tk=lambda grad, x, a=_approximate: torch.ops.tk.gelu_backward(grad, x, a),
            reference=lambda grad, x, a=_approximate: torch.ops.aten.gelu_backward(grad, x, approximate=a),
            make_inputs=_make_backward_inputs,
            bytes_moved=_backward_bytes,
            flops=lambda shape, dtype, f=_flops: f * shape[0],
            tolerance=ROUNDING_TOLERANCE,
            shapes=GELU_SHAPES,
            describe=describe_numel,
            call=f'tk.gelu_backward(grad, x, "{_approximate}") against aten.gelu_backward',
        )
    )
