"""SwiGLU and GeGLU: the last stop of the tour (see ops/tour/copy.py): a fused gate.

    swiglu(gate, up) = silu(gate) * up          silu(x) = x * sigmoid(x)
    geglu(gate, up)  = gelu(gate) * up          gelu as in ops/gelu.py

The feed-forward blocks of LLaMA-style (SwiGLU) and Gemma-style (GeGLU)
transformers.  In eager PyTorch ``F.silu(gate) * up`` is two kernels and an
intermediate tensor that is written, then read back; here each input is read
once and the output written once.

The backward kernels compute both gradients in one pass over the same
inputs, reading grad, gate and up once and writing d_gate and d_up once:

    d_up   = grad * act(gate)
    d_gate = grad * up * act'(gate)
    silu'(x) = s + x * s * (1 - s),  s = sigmoid(x)
    gelu'(x) = Phi(x) + x * phi(x)                  (exact, approximate="none")

geglu takes ``approximate`` like ``F.gelu``: "tanh" (the default, the
approximation Gemma and most GeGLU models use) or "none" (the exact erf
form).

gate and up must have the same shape, dtype and device.  Dense inputs of
any layout are read as flat arrays; others (for example the two halves of
a fused projection, ``x.chunk(2, dim=-1)``, which are strided views) are
copied once to the standard layout.
"""

import math

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
    to_compute_dtype,
    walk_in_one_order,
    whole_blocks_end,
)
from .runtime import GRAD, check_same, check_tensor, launcher, register_formula, register_op
from .spec import ROUNDING_TOLERANCE, OpSpec, element_size, model, register_spec

SQRT_1_2 = tl.constexpr(0.7071067811865476)  # 1/sqrt(2)
SQRT_2_PI = tl.constexpr(0.7978845608028654)  # sqrt(2/pi)
INV_SQRT_2PI = tl.constexpr(0.3989422804014327)  # 1/sqrt(2*pi)
TANH_CUBIC = tl.constexpr(0.044715)


# --------------------------------------------------------------------------
# The activations and their derivatives, as jit functions the kernels inline.
# --------------------------------------------------------------------------


@triton.jit
def _silu(x):
    return x * tl.sigmoid(x)


@triton.jit
def _silu_and_derivative(x):
    s = tl.sigmoid(x)
    silu = x * s
    return silu, s + silu * (1.0 - s)


@triton.jit
def _gelu_and_derivative(x, APPROXIMATE_TANH: tl.constexpr):
    if APPROXIMATE_TANH:
        # gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
        # 0.5 (1 + tanh(u)) is sigmoid(2u): written so, nothing cancels for very
        # negative x (1 + tanh(u) would round to 0 long before the product does),
        # and its derivative is 2 sigmoid(2u) (1 - sigmoid(2u)) du/dx.
        s = tl.sigmoid(2.0 * _tanh_gelu_inner(x))
        d_inner = (1.0 + 3.0 * TANH_CUBIC * x * x) * SQRT_2_PI
        return x * s, s + 2.0 * x * s * (1.0 - s) * d_inner
    else:
        # gelu(x) = x Phi(x): Phi the normal CDF, phi its density.  For very
        # negative x, 1 + erf cancels (as in PyTorch's own formula): the result
        # keeps its absolute precision there, not its relative one.
        cdf = 0.5 * (1.0 + tl.math.erf(x * SQRT_1_2))
        return x * cdf, cdf + x * tl.exp(-0.5 * x * x) * INV_SQRT_2PI


@triton.jit
def _tanh_gelu_inner(x):
    return (x + TANH_CUBIC * x * x * x) * SQRT_2_PI


@triton.jit
def _gelu(x, APPROXIMATE_TANH: tl.constexpr):
    if APPROXIMATE_TANH:
        gelu = x * tl.sigmoid(2.0 * _tanh_gelu_inner(x))  # see _gelu_and_derivative
    else:
        gelu = 0.5 * x * (1.0 + tl.math.erf(x * SQRT_1_2))
    return gelu


# --------------------------------------------------------------------------
# The kernels: the elementwise pattern of copy_kernel, three and five pointers.
# --------------------------------------------------------------------------


# Each kernel runs its body on whole blocks apart from the tail, so that a
# length of no 16-element multiple still gets 16-byte accesses (ops/blocks/elementwise.py).


@triton.jit
def _swiglu_block(gate_ptr, up_ptr, out_ptr, offsets, mask):
    gate = to_compute_dtype(tl.load(gate_ptr + offsets, mask=mask))
    up = to_compute_dtype(tl.load(up_ptr + offsets, mask=mask))
    tl.store(out_ptr + offsets, (_silu(gate) * up).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_forward_kernel(gate_ptr, up_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = block_offsets(BLOCK_SIZE)
    if in_whole_block(n_elements, BLOCK_SIZE):
        _swiglu_block(gate_ptr, up_ptr, out_ptr, offsets, offsets < whole_blocks_end(n_elements, BLOCK_SIZE))
    else:
        _swiglu_block(gate_ptr, up_ptr, out_ptr, offsets, offsets < n_elements)


@triton.jit
def _swiglu_backward_block(grad_ptr, gate_ptr, up_ptr, d_gate_ptr, d_up_ptr, offsets, mask):
    grad = to_compute_dtype(tl.load(grad_ptr + offsets, mask=mask))
    gate = to_compute_dtype(tl.load(gate_ptr + offsets, mask=mask))
    up = to_compute_dtype(tl.load(up_ptr + offsets, mask=mask))
    act, d_act = _silu_and_derivative(gate)
    tl.store(d_gate_ptr + offsets, (grad * up * d_act).to(d_gate_ptr.dtype.element_ty), mask=mask)
    tl.store(d_up_ptr + offsets, (grad * act).to(d_up_ptr.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_backward_kernel(
    grad_ptr, gate_ptr, up_ptr, d_gate_ptr, d_up_ptr, n_elements, BLOCK_SIZE: tl.constexpr
):
    offsets = block_offsets(BLOCK_SIZE)
    if in_whole_block(n_elements, BLOCK_SIZE):
        whole = offsets < whole_blocks_end(n_elements, BLOCK_SIZE)
        _swiglu_backward_block(grad_ptr, gate_ptr, up_ptr, d_gate_ptr, d_up_ptr, offsets, whole)
    else:
        _swiglu_backward_block(grad_ptr, gate_ptr, up_ptr, d_gate_ptr, d_up_ptr, offsets, offsets < n_elements)


@triton.jit
def _geglu_block(gate_ptr, up_ptr, out_ptr, offsets, mask, APPROXIMATE_TANH: tl.constexpr):
    gate = to_compute_dtype(tl.load(gate_ptr + offsets, mask=mask))
    up = to_compute_dtype(tl.load(up_ptr + offsets, mask=mask))
    tl.store(out_ptr + offsets, (_gelu(gate, APPROXIMATE_TANH) * up).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def geglu_forward_kernel(gate_ptr, up_ptr, out_ptr, n_elements, APPROXIMATE_TANH: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    offsets = block_offsets(BLOCK_SIZE)
    if in_whole_block(n_elements, BLOCK_SIZE):
        whole = offsets < whole_blocks_end(n_elements, BLOCK_SIZE)
        _geglu_block(gate_ptr, up_ptr, out_ptr, offsets, whole, APPROXIMATE_TANH)
    else:
        _geglu_block(gate_ptr, up_ptr, out_ptr, offsets, offsets < n_elements, APPROXIMATE_TANH)


@triton.jit
def _geglu_backward_block(
    grad_ptr, gate_ptr, up_ptr, d_gate_ptr, d_up_ptr, offsets, mask, APPROXIMATE_TANH: tl.constexpr
):
    grad = to_compute_dtype(tl.load(grad_ptr + offsets, mask=mask))
    gate = to_compute_dtype(tl.load(gate_ptr + offsets, mask=mask))
    up = to_compute_dtype(tl.load(up_ptr + offsets, mask=mask))
    act, d_act = _gelu_and_derivative(gate, APPROXIMATE_TANH)
    tl.store(d_gate_ptr + offsets, (grad * up * d_act).to(d_gate_ptr.dtype.element_ty), mask=mask)
    tl.store(d_up_ptr + offsets, (grad * act).to(d_up_ptr.dtype.element_ty), mask=mask)


@triton.jit
def geglu_backward_kernel(
    grad_ptr, gate_ptr, up_ptr, d_gate_ptr, d_up_ptr, n_elements, APPROXIMATE_TANH: tl.constexpr, BLOCK_SIZE: tl.constexpr
):
    offsets = block_offsets(BLOCK_SIZE)
    if in_whole_block(n_elements, BLOCK_SIZE):
        whole = offsets < whole_blocks_end(n_elements, BLOCK_SIZE)
        _geglu_backward_block(grad_ptr, gate_ptr, up_ptr, d_gate_ptr, d_up_ptr, offsets, whole, APPROXIMATE_TANH)
    else:
        tail = offsets < n_elements
        _geglu_backward_block(grad_ptr, gate_ptr, up_ptr, d_gate_ptr, d_up_ptr, offsets, tail, APPROXIMATE_TANH)


# --------------------------------------------------------------------------
# The bodies.
# --------------------------------------------------------------------------


def _check_inputs(op: str, tensors: dict[str, torch.Tensor]) -> None:
    for name, t in tensors.items():
        check_tensor(op, name, t)
    check_same(op, tensors)
    (first_name, first), *rest = tensors.items()
    for name, t in rest:
        if t.shape != first.shape:
            raise ValueError(f"tk.{op}: {first_name} has shape {tuple(first.shape)} but {name} has {tuple(t.shape)}")


def _check_approximate(op: str, approximate: str) -> bool:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"tk.{op}: approximate must be 'none' or 'tanh', got {approximate!r}")
    return approximate == "tanh"


def _forward(kernel, gate, up, **constexprs):
    gate, up = walk_in_one_order(gate, up)
    out = torch.empty_like(gate)
    n = gate.numel()
    if n == 0:
        return out
    block, warps = elementwise_config(n, gate.device, elements_per_thread(gate, inputs=2))
    launcher(kernel, gate)[elementwise_grid(n, block)](gate, up, out, n, BLOCK_SIZE=block, num_warps=warps, **constexprs)
    return out


def _backward_pass(kernel, grad, gate, up, **constexprs):
    gate, up, grad = walk_in_one_order(gate, up, grad)
    d_gate, d_up = torch.empty_like(gate), torch.empty_like(gate)
    n = gate.numel()
    if n == 0:
        return d_gate, d_up
    block, warps = elementwise_config(n, gate.device, elements_per_thread(gate, inputs=3))
    launcher(kernel, gate)[elementwise_grid(n, block)](
        grad, gate, up, d_gate, d_up, n, BLOCK_SIZE=block, num_warps=warps, **constexprs
    )
    return d_gate, d_up


def _swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    _check_inputs("swiglu", {"gate": gate, "up": up})
    return _forward(swiglu_forward_kernel, gate, up)


def _swiglu_backward(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _check_inputs("swiglu_backward", {"grad": grad, "gate": gate, "up": up})
    return _backward_pass(swiglu_backward_kernel, grad, gate, up)


def _geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    _check_inputs("geglu", {"gate": gate, "up": up})
    tanh = _check_approximate("geglu", approximate)
    return _forward(geglu_forward_kernel, gate, up, APPROXIMATE_TANH=tanh)


def _geglu_backward(
    grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, approximate: str = "tanh"
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_inputs("geglu_backward", {"grad": grad, "gate": gate, "up": up})
    tanh = _check_approximate("geglu_backward", approximate)
    return _backward_pass(geglu_backward_kernel, grad, gate, up, APPROXIMATE_TANH=tanh)


swiglu = register_op("swiglu", _swiglu)
swiglu_backward = register_op("swiglu_backward", _swiglu_backward)
geglu = register_op("geglu", _geglu)
geglu_backward = register_op("geglu_backward", _geglu_backward)


register_formula(swiglu, backward=swiglu_backward, arguments=(GRAD, "gate", "up"), gradients={"gate": 0, "up": 1})
register_formula(
    geglu, backward=geglu_backward, arguments=(GRAD, "gate", "up", "approximate"), gradients={"gate": 0, "up": 1}
)


# --------------------------------------------------------------------------
# What the comparison harness reads.
# --------------------------------------------------------------------------


def _liger_swiglu():
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction  # optional peer

    return lambda gate, up: LigerSiLUMulFunction.apply(gate, up)


def _liger_geglu():
    from liger_kernel.ops.geglu import LigerGELUMulFunction  # optional peer; the tanh approximation

    return lambda gate, up: LigerGELUMulFunction.apply(gate, up)


def _make_inputs(shape, dtype, device):
    return torch.randn(shape, dtype=dtype, device=device), torch.randn(shape, dtype=dtype, device=device)


def _bytes(shape, dtype):
    return 3 * math.prod(shape) * element_size(dtype)  # read gate and up, write out


# (tokens, hidden) of a feed-forward block: 2**12 to 2**28 elements per tensor.
# 14336 is LLaMA-3 8B's intermediate size.
_SHAPES = {
    "cuda": [(1, 4096), (16, 4096), (256, 4096), (1024, 4096), (4096, 4096), (4096, 14336), (16384, 14336)],
    "cpu": [(4, 250), (64, 1000)],
    # (tokens, intermediate) of real gated MLPs (ops/spec.py)
    "real": [(tokens, model(name).intermediate) for tokens, name in ((4095, "llama2-7b"), (8191, "llama3-8b"),
             (1000, "qwen2-7b"), (4095, "gemma-2b"), (8191, "phi-3-mini"), (1000, "llama2-13b"))],
}

register_spec(
    OpSpec(
        name="swiglu",
        tk=lambda gate, up: torch.ops.tk.swiglu(gate, up),
        reference=lambda gate, up: F.silu(gate) * up,
        make_inputs=_make_inputs,
        bytes_moved=_bytes,
        flops=lambda shape, dtype: 5 * math.prod(shape),  # exp, add, divide, two multiplies
        tolerance=ROUNDING_TOLERANCE,
        shapes=_SHAPES,
        peers={"liger": _liger_swiglu},
    )
)

register_spec(
    OpSpec(
        name="geglu",
        tk=lambda gate, up: torch.ops.tk.geglu(gate, up, "tanh"),
        reference=lambda gate, up: F.gelu(gate, approximate="tanh") * up,
        make_inputs=_make_inputs,
        bytes_moved=_bytes,
        flops=lambda shape, dtype: 11 * math.prod(shape),  # the tanh GELU's 10, and the product
        tolerance=ROUNDING_TOLERANCE,
        shapes=_SHAPES,
        peers={"liger": _liger_geglu},
    )
)
