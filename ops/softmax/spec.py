"""What the comparison harness reads about softmax: its specs, peers and sweeps."""


import torch

from ..spec import SPECS, OpSpec, model, register_spec
from .op import _prod

# --------------------------------------------------------------------------
# What the comparison harness reads.
# --------------------------------------------------------------------------


def _liger_softmax():
    from liger_kernel.ops.softmax import LigerSoftmaxFunction  # optional peer

    return lambda x: LigerSoftmaxFunction.apply(x)


def softmax_unfused(x: torch.Tensor) -> torch.Tensor:
    """The softmax a first lesson writes: max, subtract and exp, sum, divide, each its own pass over
    the rows (eager runs four kernels, reading and writing the rows each time; compile fuses them)."""
    e = torch.exp(x - x.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


def _real_shapes() -> list[tuple]:
    """Vocabulary rows (a language model's logits, tokens x vocabulary) and attention rows
    (batch x heads x sequence rows of sequence scores) of real models (ops/spec.py)."""
    vocab = [(4096, model("gpt2").vocab), (4095, model("llama2-7b").vocab), (1000, model("qwen2-7b").vocab),
             (1000, model("gemma-2b").vocab), (8191, model("phi-2").vocab)]  # fmt: skip
    attention = [(model("gpt2").heads * 1000, 1000), (model("llama2-7b").heads * 2047, 2047)]
    return vocab + attention


REAL_SHAPES = _real_shapes()

register_spec(
    OpSpec(
        name="softmax",
        tk=lambda x: torch.ops.tk.softmax(x, -1),
        reference=lambda x: torch.softmax(x, dim=-1),
        make_inputs=lambda shape, dtype, device: (torch.randn(shape, dtype=dtype, device=device),),
        bytes_moved=lambda shape, dtype: 2 * _prod(shape) * torch.empty((), dtype=dtype).element_size(),
        flops=lambda shape, dtype: 4 * _prod(shape),  # max, subtract+exp, sum, divide
        tolerance={torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float64: 1e-7},
        shapes={
            "cuda": [(4096, 128), (262144, 128), (4096, 1024), (4096, 4096), (4096, 16384), (1024, 65536), (256, 262144), (64, 1048576)],
            "cpu": [(64, 1000), (4, 70_001)],
            "real": REAL_SHAPES,
        },
        unfused={"eager-unfused": softmax_unfused},
        peers={"liger": _liger_softmax},
    )
)


# 16-bit rows in, float32 softmax out, as torch.softmax(x, -1, dtype=torch.float32):
# what autocast runs on CUDA and what attention code writes to keep its weights
# accurate.  tk reads x as it is (6 bytes an element); eager PyTorch casts a
# bfloat16 x to float32 first (14), and fuses only float16 (half_to_float).
register_spec(
    OpSpec(
        name="softmax_to_float32",
        tk=lambda x: torch.ops.tk.softmax(x, -1, torch.float32),
        reference=lambda x: torch.softmax(x, -1, dtype=torch.float32),
        reference64=lambda x: torch.softmax(x, -1),  # float64 inputs: the float64 softmax, not a float32 one
        make_inputs=SPECS["softmax"].make_inputs,
        bytes_moved=lambda shape, dtype: _prod(shape) * (torch.empty((), dtype=dtype).element_size() + 4),
        flops=SPECS["softmax"].flops,
        tolerance={torch.float16: 1e-5, torch.bfloat16: 1e-5},  # the float32 result's
        shapes=SPECS["softmax"].shapes,
        dtypes=(torch.bfloat16, torch.float16),
    )
)


def _liger_softmax_backward():
    from liger_kernel.ops.softmax import _softmax_backward  # optional peer
    from liger_kernel.ops.utils import calculate_settings

    def run(grad, y):
        block, warps = calculate_settings(y.shape[-1])  # raises past 65536 columns
        return _softmax_backward(grad, y, block, warps, False)

    return run


def _make_backward_inputs(shape, dtype, device):
    grad = torch.randn(shape, dtype=dtype, device=device)
    return grad, torch.softmax(torch.randn(shape, dtype=torch.float32, device=device), dim=-1).to(dtype)


# The backward kernel on its own: dx = y * (grad - sum(grad * y)) along the row,
# against aten's, which is what eager autograd runs and Inductor fuses.
register_spec(
    OpSpec(
        name="softmax_backward",
        tk=lambda grad, y: torch.ops.tk.softmax_backward(grad, y, -1),
        reference=lambda grad, y: torch.ops.aten._softmax_backward_data(grad, y, -1, y.dtype),
        make_inputs=_make_backward_inputs,
        bytes_moved=lambda shape, dtype: 3 * _prod(shape) * torch.empty((), dtype=dtype).element_size(),
        flops=lambda shape, dtype: 4 * _prod(shape),  # multiply, sum, subtract, multiply
        tolerance={torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float64: 1e-7},
        shapes=SPECS["softmax"].shapes,
        peers={"liger": _liger_softmax_backward},
    )
)
