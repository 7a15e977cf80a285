"""What the comparison harness reads about cross entropy, forward and backward."""

import torch
import torch.nn.functional as F

from ..spec import OpSpec, model, register_spec
from .launch import compute_dtype

# --------------------------------------------------------------------------
# What the comparison harness reads.
# --------------------------------------------------------------------------


def _make_inputs(shape, dtype, device):
    n_rows, n_cols = shape
    logits = torch.randn(n_rows, n_cols, dtype=dtype, device=device)
    target = torch.randint(0, n_cols, (n_rows,), device=device)
    return logits, target


def _bytes(shape, dtype):
    """Read the logits once and the targets, write one scalar (reduction="mean")."""
    n_rows, n_cols = shape
    size = torch.empty((), dtype=dtype).element_size()
    return n_rows * n_cols * size + n_rows * 8 + size


def _liger_cross_entropy():
    # The functional entry point, not LigerCrossEntropyFunction: the Function's
    # positional arguments changed between releases (0.8 made weight required).
    from liger_kernel.transformers.functional import liger_cross_entropy  # optional peer

    return liger_cross_entropy


_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float64: 1e-7}

# (tokens, vocabulary) of real models' losses (ops/spec.py).
REAL_SHAPES = [(tokens, model(name).vocab) for tokens, name in ((4095, "gpt2"), (8191, "llama3-8b"), (1000, "qwen2-7b"),
               (4095, "mistral-7b"), (2047, "gemma-2b"), (8191, "phi-2"), (8191, "llama2-7b"))]  # fmt: skip


register_spec(
    OpSpec(
        name="cross_entropy",
        tk=lambda logits, target: torch.ops.tk.cross_entropy(logits, target),
        reference=lambda logits, target: F.cross_entropy(logits, target),
        make_inputs=_make_inputs,
        bytes_moved=_bytes,
        flops=lambda shape, dtype: 4 * shape[0] * shape[1],  # max, subtract+exp, sum; per element
        tolerance=_TOLERANCE,
        shapes={
            "cuda": [(16384, 4096), (4096, 32000), (4096, 50257), (8192, 128256), (2048, 262144)],
            "cpu": [(64, 1000), (4, 70_001)],
            "real": REAL_SHAPES,
        },
        describe=lambda shape: f"N{shape[0]}xC{shape[1]}",
        peers={"liger": _liger_cross_entropy},
    )
)


def _make_backward_inputs(shape, dtype, device):
    """grad of a mean loss, logits, target, the logsumexp tk's forward saves and the log-softmax
    PyTorch's saves: each backward gets what its own forward kept."""
    logits, target = _make_inputs(shape, dtype, device)
    lse = torch.logsumexp(logits.to(compute_dtype(dtype)), dim=-1)
    grad = torch.ones((), dtype=dtype, device=device)
    return grad, logits, target, lse, torch.log_softmax(logits, dim=-1)


def _backward_bytes(shape, dtype):
    """Read the logits and write their gradient; read the targets, the float32 logsumexp and g."""
    n_rows, n_cols = shape
    size = torch.empty((), dtype=dtype).element_size()
    return 2 * n_rows * n_cols * size + n_rows * (8 + 4) + size


def _eager_backward(grad, logits, target, lse, log_probs):
    """The two kernels eager autograd runs for F.cross_entropy: nll_loss's, then log_softmax's."""
    kept = (target != -100).sum().to(log_probs.dtype)
    dlog_probs = torch.ops.aten.nll_loss_backward(grad, log_probs, target, None, 1, -100, kept)  # 1: mean
    return torch.ops.aten._log_softmax_backward_data(dlog_probs, log_probs, 1, log_probs.dtype)


def _backward_reference64(grad, logits, target, lse, log_probs):
    """From the logits themselves: a float64 copy of a 16-bit log-softmax carries its rounding."""
    x = logits.detach().requires_grad_()
    F.cross_entropy(x, target).backward(grad)
    return x.grad


# The backward on its own, reduction="mean", against the kernels eager autograd runs (with
# the log-softmax its forward saved) and Inductor's fusion of them.  No Liger column: its
# cross entropy writes the gradient during the forward, so it has no backward to time.
register_spec(
    OpSpec(
        name="cross_entropy_backward",
        tk=lambda grad, logits, target, lse, log_probs: torch.ops.tk.cross_entropy_backward(
            grad, logits, target, lse, -100, "mean", 0.0
        ),
        reference=_eager_backward,
        reference64=_backward_reference64,
        make_inputs=_make_backward_inputs,
        bytes_moved=_backward_bytes,
        flops=lambda shape, dtype: 4 * shape[0] * shape[1],  # subtract, exp, subtract, scale; per element
        tolerance=_TOLERANCE,
        shapes={
            "cuda": [(32768, 1000), (16384, 4096), (4096, 32000), (4096, 50257), (8192, 128256), (2048, 262144)],
            "cpu": [(64, 1000), (4, 70_001)],
        },
        describe=lambda shape: f"N{shape[0]}xC{shape[1]}",
    )
)
