"""A small GPT-style model, built twice: from PyTorch ops and from tk ops.

    tokens -> token embedding + learned position embedding
           -> n_layers x [ x = x + attention(rms_norm(x))           causal, scaled_dot_product_attention
                           x = x + down(swiglu(gate(h), up(h)))   h = rms_norm(x) ]
           -> rms_norm -> lm_head -> cross_entropy(logits, targets)

The model is written once, as functions of a dict of parameters and an
``Ops`` namespace: the four functions in which the builds differ
(``linear``, ``rms_norm``, ``swiglu``, ``cross_entropy``).  ``TORCH_OPS``
holds PyTorch's own functions, ``TK_OPS`` the ``torch.ops.tk.*`` ops, and
``UNFUSED_OPS`` the compositions people write by hand when their framework
has no fused op.  Everything else (the embedding lookups, the residual adds,
the head split and ``scaled_dot_product_attention``) is PyTorch in every
build, so a difference between two builds is a difference between their ops.

Linear layers keep their weights as (in, out) matrices, so that both builds
compute ``x @ w``: ``torch.matmul`` in one, ``torch.ops.tk.matmul`` in the
other, on the very same tensors.

    config = GPTConfig(vocab=256, d_model=64, n_heads=4, max_seq=32)
    model = GPT(config)                        # PyTorch ops
    tk_model = model.with_ops(TK_OPS)          # same weights, tk ops
    loss = tk_model(tokens, targets)           # tokens, targets: (batch, seq) int64
    loss.backward()

``torch.compile(tk_model, fullgraph=True)`` compiles without graph breaks:
on CUDA Inductor puts tk's Triton kernels into its generated code, on the
CPU it calls tk's opaque CPU ops (the same kernels, interpreted).

``torch.export.export(tk_model, (tokens, targets))`` keeps each tk op as one
node (``tk.matmul``, ``tk.rms_norm``...).  AOTInductor
(``torch._inductor.aoti_compile_and_package``) then builds a package:

* CUDA: the ``triton_op``s are traced into, so the package holds tk's
  kernels themselves, compiled, and runs in any process that loads it;
* CPU: Inductor cannot compile a Triton kernel for the CPU, so the package
  calls ``tk::<op>_cpu`` through the dispatcher (AOTInductor's proxy
  executor for ops without a C++ kernel).  It runs where those ops are
  registered, that is in a Python process that has imported ``ops``; a
  C++-only deployment cannot load it.

``SPEC`` describes one training step (forward and backward) for the
comparison harness: ``python -m compare --op gpt_block``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ops.spec import OpSpec

IGNORE_INDEX = -100  # targets equal to this add nothing to the loss (padding), as in F.cross_entropy

# --------------------------------------------------------------------------
# The ops a build is made of.
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Ops:
    """The functions in which the builds of the model differ."""

    name: str
    linear: Callable  # (x (..., in), w (in, out)) -> x @ w
    rms_norm: Callable  # (x (..., d), weight (d,), eps) -> normalized over the last dim, times weight
    swiglu: Callable  # (gate, up) -> silu(gate) * up
    cross_entropy: Callable  # (logits (n, vocab), targets (n,)) -> mean loss over targets != IGNORE_INDEX


def _torch_rms_norm(x, weight, eps):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _torch_swiglu(gate, up):
    return F.silu(gate) * up


def _torch_cross_entropy(logits, targets):
    return F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX)


TORCH_OPS = Ops("torch", torch.matmul, _torch_rms_norm, _torch_swiglu, _torch_cross_entropy)


def _at_least_float32(t):
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _unfused_rms_norm(x, weight, eps):
    """RMSNorm as written in most model code (LLaMA's): float32 statistics, several kernels in eager mode."""
    x32 = _at_least_float32(x)
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight


def _unfused_cross_entropy(logits, targets):
    """log_softmax, gather and a masked mean: the loss spelled out."""
    log_probs = torch.log_softmax(_at_least_float32(logits), dim=-1)
    keep = targets != IGNORE_INDEX
    picked = log_probs.gather(-1, torch.where(keep, targets, 0).unsqueeze(-1)).squeeze(-1)
    return -(picked * keep).sum() / keep.sum()


UNFUSED_OPS = Ops("unfused", torch.matmul, _unfused_rms_norm, _torch_swiglu, _unfused_cross_entropy)


def _tk_linear(x, w):
    """x @ w with tk's matmul: the leading dims folded into rows, one 2-D matmul."""
    rows = torch.ops.tk.matmul(x.reshape(-1, x.shape[-1]), w)
    return rows.view(*x.shape[:-1], w.shape[1])


def _tk_rms_norm(x, weight, eps):
    return torch.ops.tk.rms_norm(x, weight, eps)


def _tk_swiglu(gate, up):
    return torch.ops.tk.swiglu(gate, up)


def _tk_cross_entropy(logits, targets):
    return torch.ops.tk.cross_entropy(logits, targets, IGNORE_INDEX, "mean", 0.0)


TK_OPS = Ops("tk", _tk_linear, _tk_rms_norm, _tk_swiglu, _tk_cross_entropy)

# --------------------------------------------------------------------------
# Configuration and parameters.
# --------------------------------------------------------------------------


def swiglu_hidden(d_model: int) -> int:
    """The MLP width: 8/3 d_model (the SwiGLU MLP's three matrices then cost
    what a 4 d_model GELU MLP's two do), rounded up to a multiple of 64."""
    return 64 * math.ceil(8 * d_model / 3 / 64)


@dataclass(frozen=True)
class GPTConfig:
    """The model's sizes; heads split d_model evenly (head_dim = d_model / n_heads)."""

    vocab: int
    d_model: int
    n_heads: int
    max_seq: int
    d_ff: int | None = None  # None: swiglu_hidden(d_model)
    n_layers: int = 1
    eps: float = 1e-6

    def __post_init__(self):
        for name in ("vocab", "d_model", "n_heads", "max_seq", "n_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"GPTConfig: {name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"GPTConfig: d_model {self.d_model} is not a multiple of n_heads {self.n_heads}")
        if self.d_ff is None:
            object.__setattr__(self, "d_ff", swiglu_hidden(self.d_model))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def param_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter, by name, in the order the model uses them.  Linear
    weights are (in, out): the layer computes x @ w."""
    d, f = config.d_model, config.d_ff
    shapes = {"tok_emb": (config.vocab, d), "pos_emb": (config.max_seq, d)}
    for i in range(config.n_layers):
        shapes |= {
            f"l{i}_attn_norm": (d,),
            f"l{i}_qkv": (d, 3 * d),
            f"l{i}_attn_out": (d, d),
            f"l{i}_mlp_norm": (d,),
            f"l{i}_gate": (d, f),
            f"l{i}_up": (d, f),
            f"l{i}_down": (f, d),
        }
    return shapes | {"norm": (d,), "lm_head": (d, config.vocab)}


def init_param(name: str, param: torch.Tensor, config: GPTConfig) -> None:
    """In place: embeddings N(0, 0.02^2); norm weights 1; a linear weight
    N(0, 1/fan_in), the projections back into the residual stream
    (attn_out, down) scaled down by sqrt(2 n_layers), as in GPT-2."""
    with torch.no_grad():
        if name.endswith("emb"):
            param.normal_(0.0, 0.02)
        elif name.endswith("norm"):
            param.fill_(1.0)
        else:
            std = param.shape[0] ** -0.5
            if name.endswith(("attn_out", "down")):
                std /= math.sqrt(2 * config.n_layers)
            param.normal_(0.0, std)


# --------------------------------------------------------------------------
# The model, as functions of its parameters.
# --------------------------------------------------------------------------


def attention(p: Mapping[str, torch.Tensor], layer: str, h: torch.Tensor, config: GPTConfig, ops: Ops) -> torch.Tensor:
    """Causal multi-head self-attention of h (batch, seq, d_model)."""
    batch, seq, d = h.shape
    qkv = ops.linear(h, p[f"{layer}_qkv"])  # (batch, seq, 3 d): q, k and v side by side
    qkv = qkv.view(batch, seq, 3, config.n_heads, config.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)  # each (batch, heads, seq, head_dim), strided views of qkv
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = out.transpose(1, 2).reshape(batch, seq, d)  # heads back side by side
    return ops.linear(out, p[f"{layer}_attn_out"])


def mlp(p: Mapping[str, torch.Tensor], layer: str, h: torch.Tensor, ops: Ops) -> torch.Tensor:
    """The SwiGLU MLP: down(silu(gate(h)) * up(h))."""
    hidden = ops.swiglu(ops.linear(h, p[f"{layer}_gate"]), ops.linear(h, p[f"{layer}_up"]))
    return ops.linear(hidden, p[f"{layer}_down"])


def gpt_logits(p: Mapping[str, torch.Tensor], tokens: torch.Tensor, config: GPTConfig, ops: Ops) -> torch.Tensor:
    """(batch, seq, vocab) logits for (batch, seq) int64 tokens."""
    seq = tokens.shape[1]
    x = F.embedding(tokens, p["tok_emb"]) + p["pos_emb"][:seq]
    for i in range(config.n_layers):
        layer = f"l{i}"
        x = x + attention(p, layer, ops.rms_norm(x, p[f"{layer}_attn_norm"], config.eps), config, ops)
        x = x + mlp(p, layer, ops.rms_norm(x, p[f"{layer}_mlp_norm"], config.eps), ops)
    return ops.linear(ops.rms_norm(x, p["norm"], config.eps), p["lm_head"])


def gpt_loss(
    p: Mapping[str, torch.Tensor], tokens: torch.Tensor, targets: torch.Tensor, config: GPTConfig, ops: Ops
) -> torch.Tensor:
    """Mean cross-entropy of predicting ``targets`` (batch, seq) from ``tokens``."""
    logits = gpt_logits(p, tokens, config, ops)
    return ops.cross_entropy(logits.reshape(-1, config.vocab), targets.reshape(-1))


def check_tokens(config: GPTConfig, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> None:
    """Clear errors for inputs the model cannot take (values are not read: no host sync)."""
    if not isinstance(tokens, torch.Tensor) or tokens.dtype not in (torch.int64, torch.int32) or tokens.dim() != 2:
        what = type(tokens).__name__
        if isinstance(tokens, torch.Tensor):
            what = f"a {tokens.dim()}-D {tokens.dtype} tensor"
        raise TypeError(f"GPT: tokens must be a 2-D (batch, seq) int64 or int32 tensor, got {what}")
    if tokens.shape[1] > config.max_seq:
        raise ValueError(f"GPT: sequence of {tokens.shape[1]} tokens is longer than max_seq {config.max_seq}")
    if targets is not None and tuple(targets.shape) != tuple(tokens.shape):
        raise ValueError(f"GPT: targets have shape {tuple(targets.shape)}, tokens {tuple(tokens.shape)}")


class GPT(torch.nn.Module):
    """The model with its parameters; ``ops`` picks the build (TORCH_OPS, TK_OPS, UNFUSED_OPS).

    ``model(tokens)`` gives logits, ``model(tokens, targets)`` the mean loss.
    """

    def __init__(self, config: GPTConfig, ops: Ops = TORCH_OPS, device=None, dtype=None):
        super().__init__()
        self.config = config
        self.ops = ops
        for name, shape in param_shapes(config).items():
            param = torch.nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
            init_param(name, param, config)
            self.register_parameter(name, param)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        check_tokens(self.config, tokens, targets)
        params = dict(self.named_parameters())
        if targets is None:
            return gpt_logits(params, tokens, self.config, self.ops)
        return gpt_loss(params, tokens, targets, self.config, self.ops)

    def with_ops(self, ops: Ops) -> GPT:
        """The same model (a copy of the weights, same device and dtype) built from ``ops``."""
        first = next(self.parameters())
        other = GPT(self.config, ops, device=first.device, dtype=first.dtype)
        other.load_state_dict(self.state_dict())
        return other

    def extra_repr(self) -> str:
        return f"{self.config}, ops={self.ops.name}"


# --------------------------------------------------------------------------
# One training step, for the comparison harness.
# --------------------------------------------------------------------------


def train_step(ops: Ops) -> Callable:
    """``step(config, tokens, targets, *params) -> (loss, *grads)``: forward and backward.

    The gradients come from ``torch.autograd.grad``, so repeated calls
    accumulate nothing.  Under ``torch.compile`` the forward is one graph and
    its backward the compiled backward of that graph.
    """

    def step(config, tokens, targets, *params):
        named = dict(zip(param_shapes(config), params))
        loss = gpt_loss(named, tokens, targets, config, ops)
        grads = torch.autograd.grad(loss, params)
        return (loss.detach(), *grads)

    step.__name__ = step.__qualname__ = f"gpt_block_train_step_{ops.name}"
    return step


def config_for(shape: tuple) -> GPTConfig:
    """The harness's shape (batch, seq, d_model, n_heads, vocab) as a model: one layer."""
    _, seq, d_model, n_heads, vocab = shape
    return GPTConfig(vocab=vocab, d_model=d_model, n_heads=n_heads, max_seq=seq)


def make_inputs(shape: tuple, dtype: torch.dtype, device) -> tuple:
    """(config, tokens, targets, *params): random tokens and targets, freshly initialized weights."""
    batch, seq = shape[:2]
    config = config_for(shape)
    tokens = torch.randint(0, config.vocab, (batch, seq), device=device)
    targets = torch.randint(0, config.vocab, (batch, seq), device=device)
    params = []
    for name, p_shape in param_shapes(config).items():
        param = torch.empty(p_shape, device=device, dtype=dtype)
        init_param(name, param, config)
        params.append(param.requires_grad_())
    return (config, tokens, targets, *params)


def matmul_flops(shape: tuple) -> int:
    """Forward matmul FLOPs (2 per multiply-add): the linear layers, and the
    attention's two products (q k^T and p v) over the causal half."""
    batch, seq = shape[:2]
    config = config_for(shape)
    d, f = config.d_model, config.d_ff
    tokens = batch * seq
    linear = 2 * tokens * config.n_layers * (d * 3 * d + d * d + 3 * d * f) + 2 * tokens * d * config.vocab
    # q k^T and p v: batch * seq * seq * d multiply-adds each, half of them under the causal mask.
    attention = config.n_layers * 2 * (2 * batch * seq * seq * d) // 2
    return linear + attention


def _bytes(shape: tuple, dtype: torch.dtype) -> int:
    """The least a step must move: every weight read and its gradient written,
    the tokens and targets read.  (Activations are extra: a step stores some
    for the backward.)"""
    batch, seq = shape[:2]
    n_params = sum(math.prod(s) for s in param_shapes(config_for(shape)).values())
    return 2 * n_params * torch.empty((), dtype=dtype).element_size() + 2 * batch * seq * 8


def _describe(shape: tuple) -> str:
    batch, seq, d_model, n_heads, vocab = shape
    return f"B{batch} T{seq} D{d_model} H{n_heads} V{vocab}"


# The whole step is compared at once: its outputs (the loss and every
# gradient) against the float64 step, as one relative norm error.  Wider
# than a single op's tolerance: the error of each op passes through the rest.
SPEC = OpSpec(
    name="gpt_block",
    tk=train_step(TK_OPS),
    reference=train_step(TORCH_OPS),
    unfused={"eager-unfused": train_step(UNFUSED_OPS)},
    make_inputs=make_inputs,
    bytes_moved=_bytes,
    flops=lambda shape, dtype: 3 * matmul_flops(shape),  # backward: twice the forward's matmuls
    tolerance={torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2, torch.float64: 1e-10},
    shapes={
        "cuda": [(4, 256, 512, 8, 32000), (8, 512, 1024, 16, 32000), (8, 1024, 2048, 16, 32000)],
        "cpu": [(2, 16, 32, 2, 64)],
    },
    describe=_describe,
    dtypes=(torch.bfloat16, torch.float32),
    bound="compute",
    compile_tk=True,
    kernel_modules=("ops.matmul", "ops.norms", "ops.swiglu", "ops.cross_entropy"),
)
