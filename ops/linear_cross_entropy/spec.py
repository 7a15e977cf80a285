"""What the comparison harness reads about linear cross entropy: a training step of the loss.

Every variant is timed on the same call: the loss of x (N, H) through a weight (V, H) against N
targets, and its gradients with respect to x and the weight (the harness compares (loss, grad_x,
grad_weight) with the float64 answer).  A shape is (N, H, V).
"""

from dataclasses import replace

import torch
import torch.nn.functional as F

from ..runtime import ByKind
from ..spec import OpSpec, register_spec
from .op import linear_cross_entropy_with_tuning
from .plan import TUNING


def training_step(loss_fn):
    """(loss, grad_x, grad_weight) of `loss_fn(x, weight, target)`, for leaves made of x and weight."""

    def step(x, weight, target):
        x, weight = x.detach().requires_grad_(), weight.detach().requires_grad_()
        loss = loss_fn(x, weight, target)
        grad_x, grad_weight = torch.autograd.grad(loss, (x, weight))
        return loss.detach(), grad_x, grad_weight

    return step


def _as_for_the_loss(logits: torch.Tensor) -> torch.Tensor:
    """Logits as the reference takes its loss of them: 16-bit ones in float32 (``.float()``),
    float32 and float64 ones as they are (the float64 answer stays float64)."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def _pytorch_loss(x, weight, target):
    return F.cross_entropy(_as_for_the_loss(F.linear(x, weight)), target)


def _tk_unfused_loss(x, weight, target):
    """tk's own matmul, then tk's cross entropy of the (N, V) logits, in float32 as the reference's."""
    return torch.ops.tk.cross_entropy(torch.ops.tk.matmul(x, weight.t()), target, dtype=torch.float32)


def _tk_loss(x, weight, target):
    return torch.ops.tk.linear_cross_entropy(x, weight, target)


def _tk_tuned(**changes):
    """tk's op under its tuning with `changes` (chunk_rows=256: chunks of 256 rows whatever its rule would take).
    Another tuning runs through a plain autograd.Function over the Python bodies, which torch.compile does not
    trace (on the CPU they launch Triton's interpreter): the harness's compile-tk-chunk-* variants run the loss
    eagerly."""
    tuning = replace(TUNING, **changes)

    @torch.compiler.disable
    def loss(x, weight, target):
        return linear_cross_entropy_with_tuning(x, weight, target, tuning=tuning)

    return training_step(loss)


def _liger():
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction  # optional peer

    def loss(x, weight, target):
        # Its first four arguments (x, weight, target, bias) have kept their places across releases;
        # what it returns has not (the loss alone, or the loss first in a tuple).
        out = LigerFusedLinearCrossEntropyFunction.apply(x, weight, target, None)
        return out[0] if isinstance(out, tuple) else out

    return training_step(loss)


def _make_inputs(shape, dtype, device):
    """x of unit variance, a weight scaled so that the logits have unit variance, random targets."""
    n_rows, hidden, vocab = shape
    x = torch.randn(n_rows, hidden, device=device).to(dtype)
    weight = (torch.randn(vocab, hidden, device=device) / hidden**0.5).to(dtype)
    target = torch.randint(0, vocab, (n_rows,), device=device)
    return x, weight, target


def _bytes(shape, dtype):
    """The fewest bytes a training step moves: read x, the weight and the targets, write grad_x,
    grad_weight and the loss.  The logits need never leave the chip."""
    n_rows, hidden, vocab = shape
    size = torch.empty((), dtype=dtype).element_size()
    return 2 * (n_rows + vocab) * hidden * size + 8 * n_rows + 4


# Language-model heads, token counts off a multiple of 128: GPT-2 (H 768, V 50257), Llama 3.2 1B
# (2048, 128256), Mistral 7B (4096, 32768), Llama 3 8B (4096, 128256), Qwen2 7B (3584, 152064).
LM_HEADS = [
    (4095, 768, 50257), (8191, 768, 50257), (8191, 2048, 128256), (16383, 2048, 128256),
    (8191, 4096, 32768), (8191, 4096, 128256), (8191, 3584, 152064),
]  # fmt: skip

# Chunk sizes of the curve (rows a chunk), and one chunk of all the rows.
CURVE_ROWS = (256, 512, 1024, 2048, 4096, 8192)

register_spec(
    OpSpec(
        name="linear_cross_entropy",
        tk=training_step(_tk_loss),
        reference=training_step(_pytorch_loss),
        unfused={
            "tk-unfused": training_step(_tk_unfused_loss),
            **{f"tk-chunk-{rows}": _tk_tuned(chunk_rows=rows) for rows in CURVE_ROWS},
            "tk-chunk-all": _tk_tuned(chunk_rows=1 << 62),
            # The weight gradient summed in float32 and rounded once (tk sums it in the weight's dtype, a
            # rounding a chunk): 4 V H bytes more, and what it buys.
            "tk-float32-sum": _tk_tuned(float32_weight_sum=True),
            # An odd vocabulary's GEMMs on the weight as given, not padded to 16 bytes (Tuning.pad_weight).
            "tk-unpadded-weight": _tk_tuned(pad_weight=False),
            # The weight gradient's sum by tk's matmul adding in its epilogue, not cuBLAS's addmm (Tuning.tk_weight_gemm).
            "tk-tk-weight-gemm": _tk_tuned(tk_weight_gemm=ByKind(cuda=True, cpu=False)),
        },
        make_inputs=_make_inputs,
        bytes_moved=_bytes,
        flops=lambda shape, dtype: 6 * shape[0] * shape[1] * shape[2],  # the three GEMMs: logits, grad_x, grad_weight
        tolerance={torch.float32: 2e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2, torch.float64: 1e-7},
        shapes={"cuda": LM_HEADS, "cpu": [(37, 16, 100), (9, 8, 1001)]},
        describe=lambda shape: f"N{shape[0]}xH{shape[1]}xV{shape[2]}",
        bound="compute",
        peers={"liger": _liger},
        call="a training step: the loss of x @ weight^T against the targets (reduction mean) and its gradients "
        "w.r.t. x and weight, against F.cross_entropy(F.linear(x, weight).float(), target) with autograd",
    )
)
