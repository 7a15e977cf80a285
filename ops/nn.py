"""tk ops as ``torch.nn`` modules, for people who build their models themselves.

    import ops
    norm = ops.nn.RMSNorm(4096)                                  # y = tk.rms_norm(x, weight, eps)
    mlp = ops.nn.GatedMLP(4096, 14336)                           # down(swiglu(gate(x), up(x)))
    loss = ops.nn.LinearCrossEntropyLoss()(h, lm_head.weight, targets)   # never holds the logits

Each module keeps its parameters under the names PyTorch's and HuggingFace's
modules use (``weight``, ``bias``, ``gate_proj``...), so a state dict loads
into either.  The math runs in tk's ops, so it works on CUDA (compiled Triton
kernels) and on the CPU (the same kernels, interpreted), eager and under
``torch.compile(fullgraph=True)``.  ``ops.patch`` puts the same ops into a
loaded HuggingFace model without rebuilding it.
"""

import torch
from torch import nn

__all__ = [
    "CrossEntropyLoss",
    "GELU",
    "GatedMLP",
    "LayerNorm",
    "LinearCrossEntropyLoss",
    "RMSNorm",
    "apply_rotary_pos_emb",
]

_GATES = {"silu": "swiglu", "gelu": "none", "gelu_tanh": "tanh"}  # activation -> swiglu, or geglu's approximate


class RMSNorm(nn.Module):
    """``y = x / sqrt(mean(x^2) + eps) * (offset + weight)`` over the last dim (tk.rms_norm).

    ``offset=1.0`` is Gemma's form (weights stored as their difference from 1,
    initialised at 0); the scale is then taken in float32, as Gemma does."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, offset: float = 0.0, device=None, dtype=None):
        super().__init__()
        initial = torch.zeros if offset else torch.ones
        self.weight = nn.Parameter(initial(hidden_size, device=device, dtype=dtype))
        self.eps, self.offset = eps, offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.offset:
            return torch.ops.tk.rms_norm(x, self.offset + self.weight.float(), self.eps)
        return torch.ops.tk.rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}" + (f", offset={self.offset}" if self.offset else "")


class LayerNorm(nn.LayerNorm):
    """``torch.nn.LayerNorm`` computed by tk.layer_norm (same parameters, same state dict)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.tk.layer_norm(x, list(self.normalized_shape), self.weight, self.bias, self.eps)


class GELU(nn.GELU):
    """``torch.nn.GELU`` computed by tk.gelu (``approximate`` is "none" or "tanh")."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.tk.gelu(x, self.approximate)


class GatedMLP(nn.Module):
    """The gated MLP of Llama, Mistral, Qwen2 and Gemma: ``down(act(gate(x)) * up(x))`` with the gate fused
    (tk.swiglu for ``activation="silu"``, tk.geglu for "gelu" and "gelu_tanh")."""

    def __init__(
        self, hidden_size: int, intermediate_size: int, activation: str = "silu", bias: bool = False,
        device=None, dtype=None,
    ):  # fmt: skip
        super().__init__()
        if activation not in _GATES:
            raise ValueError(f"ops.nn.GatedMLP: activation must be one of {sorted(_GATES)}, got {activation!r}")
        self.activation = activation
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias, device=device, dtype=dtype)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias, device=device, dtype=dtype)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gated_down(self.gate_proj(x), self.up_proj(x), self.down_proj, self.activation)


def gated(gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
    """``act(gate) * up`` in one tk kernel (see GatedMLP)."""
    if activation == "silu":
        return torch.ops.tk.swiglu(gate, up)
    return torch.ops.tk.geglu(gate, up, _GATES[activation])


def _gated_backward(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str):
    """The gradients (of gate, of up) of ``gated(gate, up, activation)`` for the incoming `grad`."""
    if activation == "silu":
        return torch.ops.tk.swiglu_backward(grad, gate, up)
    return torch.ops.tk.geglu_backward(grad, gate, up, _GATES[activation])


def gated_down(gate: torch.Tensor, up: torch.Tensor, down: nn.Module, activation: str) -> torch.Tensor:
    """``down(act(gate) * up)``, the gated MLP's last step.

    For a plain ``nn.Linear`` ``down`` (no hooks), autograd holds gate and up for the backward, as
    the gate's own backward needs them, but not their product: the backward computes it again, one
    elementwise pass, for the down projection's weight gradient.  That product is the largest
    tensor of a layer (tokens x intermediate: 235 MB a layer for Llama 3 8B's MLP at 8192 tokens in
    bf16); perf-notes version 49 measures the trade.  Any other ``down`` (a LoRA wrapper, a
    quantized linear, a module with hooks or with its forward replaced, as accelerate's offloading
    does) is called as it is, and so is a call autocast would cast differently from the product."""
    operands = _fused_operands(gate, up, down)
    if operands is None:
        return down(gated(gate, up, activation))
    return _GatedDown.apply(gate, up, *operands, activation)


def _fused_operands(gate: torch.Tensor, up: torch.Tensor, down: nn.Module):
    """(weight, bias) as F.linear would multiply the product by them, or None where `down` must be
    called as it is.  Under autocast, F.linear casts them (a float64 weight excepted): the cast is
    made here, outside the Function, where autograd sees it."""
    if not _plain_linear(down) or gate.dtype != up.dtype:
        return None
    weight, bias = down.weight, down.bias
    device = gate.device.type
    if torch.is_autocast_enabled(device) and weight.dtype != torch.float64:
        dtype = torch.get_autocast_dtype(device)
        weight, bias = weight.to(dtype), None if bias is None else bias.to(dtype)
    return (weight, bias) if gate.dtype == weight.dtype else None  # else F.linear's own cast (or error)


_MODULE_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def _plain_linear(down: nn.Module) -> bool:
    """An nn.Linear whose call is F.linear and nothing else: no hook of its own or global, its forward not
    replaced, its weight a plain tensor (a quantized or sharded one, a tensor subclass, keeps its own F.linear)."""
    if type(down) is not nn.Linear or "forward" in down.__dict__ or any(getattr(down, h) for h in _MODULE_HOOKS):
        return False
    if type(down.weight) not in (torch.Tensor, nn.Parameter):
        return False
    module = nn.modules.module
    return not any(getattr(module, f"_global{h}") for h in _MODULE_HOOKS)


class _GatedDown(torch.autograd.Function):
    """F.linear(gated(gate, up), weight, bias), holding gate, up and weight for the backward (see gated_down)."""

    @staticmethod
    def forward(ctx, gate, up, weight, bias, activation):
        ctx.activation = activation
        ctx.save_for_backward(gate, up, weight)
        return torch.nn.functional.linear(gated(gate, up, activation), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        gate, up, weight = ctx.saved_tensors
        need_gate, need_up, need_weight, need_bias, _ = ctx.needs_input_grad
        rows = grad.reshape(-1, grad.shape[-1])
        grad_weight = grad_bias = grad_gate = grad_up = None
        if need_weight:  # the product, computed again
            product = gated(gate, up, ctx.activation)
            grad_weight = rows.t() @ product.reshape(-1, product.shape[-1])
            product = None  # back to the allocator before the gate's gradients are made
        if need_bias:
            grad_bias = rows.sum(0)
        if need_gate or need_up:
            grad_gate, grad_up = _gated_backward(grad @ weight, gate, up, ctx.activation)
        return grad_gate if need_gate else None, grad_up if need_up else None, grad_weight, grad_bias, None


def apply_rotary_pos_emb(q, k, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1):
    """HuggingFace's ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)`` computed by tk.rope: (q_embed, k_embed)."""
    return torch.ops.tk.rope(q, k, cos, sin, unsqueeze_dim)


class CrossEntropyLoss(nn.Module):
    """``torch.nn.CrossEntropyLoss`` over logits (..., C) and targets (...), computed by tk.cross_entropy
    (no softmax held; 16-bit logits read as they are)."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0):
        super().__init__()
        self.ignore_index, self.reduction, self.label_smoothing = ignore_index, reduction, label_smoothing

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if logits.dim() > 2:  # (..., C): the rows of every leading position
            logits, target = logits.reshape(-1, logits.shape[-1]), target.reshape(-1)
        return torch.ops.tk.cross_entropy(logits, target, self.ignore_index, self.reduction, self.label_smoothing)


class LinearCrossEntropyLoss(nn.Module):
    """``F.cross_entropy(F.linear(x, weight, bias).float(), target)`` without ever holding the logits
    (tk.linear_cross_entropy): for a language model's head, whose logits are tokens x vocabulary."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0):
        super().__init__()
        self.ignore_index, self.reduction, self.label_smoothing = ignore_index, reduction, label_smoothing

    def forward(
        self, x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return torch.ops.tk.linear_cross_entropy(
            x, weight, target, bias, self.ignore_index, self.reduction, self.label_smoothing
        )
