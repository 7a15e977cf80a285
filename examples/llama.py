"""A HuggingFace Llama trained one step at a time: PyTorch, torch.compile, tk through ``ops.patch``, Liger.

``make compare OP=llama`` builds ``transformers.LlamaForCausalLM`` from a config with random weights
(nothing is downloaded) and times one training step (forward with labels, backward) of each variant,
on the very same weights:

    eager        the model as HuggingFace writes it
    compile      torch.compile of the step
    tk           the model after ``ops.patch(model)``: tk's RMS norm, SwiGLU, rotary embedding and
                 fused linear cross entropy (the logits are never held)
    compile-tk   torch.compile of tk's step
    liger        Liger-Kernel's patch (its fused linear cross entropy too), where it is installed

The step is ``step(shape, ids, labels, *params) -> (loss, *grads)``: a model skeleton per variant is
built once and called with the parameters through ``torch.func.functional_call``, so every variant
(and the float64 reference) computes with the same tensors.  The report gives each variant's step
time, peak memory and a per-kernel breakdown.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from ops.spec import OpSpec

IGNORE_INDEX = -100


def _config(shape: tuple):
    """(batch, seq, hidden, layers, heads, kv_heads, intermediate, vocab) as a LlamaConfig."""
    from transformers import LlamaConfig

    _, seq, hidden, layers, heads, kv_heads, intermediate, vocab = shape
    return LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=seq,
        attention_dropout=0.0, tie_word_embeddings=False, attn_implementation="sdpa",
    )  # fmt: skip


_SKELETONS: dict[tuple, tuple] = {}  # (shape, kind, device) -> (model, parameter names)


def _skeleton(shape: tuple, kind: str, device: torch.device):
    """The model of `kind` ("torch", "tk" or "liger") for `shape`, on `device`, made once; its own
    weights are never used (the step passes the parameters)."""
    key = (shape, kind, str(device))
    found = _SKELETONS.get(key)
    if found is None:
        from transformers import LlamaForCausalLM

        with torch.device("meta"):
            model = LlamaForCausalLM(_config(shape))
        model = model.to_empty(device=device)
        with torch.device(device):  # the rotary embedding's inv_freq buffer, which to_empty left unset
            model.model.rotary_emb = type(model.model.rotary_emb)(model.config)
        model.train()
        if kind == "tk":
            import ops

            ops.patch(model)
        found = _SKELETONS[key] = (model, [name for name, _ in model.named_parameters()])
    return found


def train_step(kind: str) -> Callable:
    """``step(shape, ids, labels, *params) -> (loss, *grads)`` of the `kind` model."""

    def step(shape, ids, labels, *params):
        model, names = _skeleton(shape, kind, ids.device)
        out = torch.func.functional_call(model, dict(zip(names, params)), (ids,), {"labels": labels})
        grads = torch.autograd.grad(out.loss, params)
        return (out.loss.detach(), *grads)

    step.__name__ = step.__qualname__ = f"llama_train_step_{kind}"
    return step


def _liger_step():
    """Liger-Kernel's patch applied to a model of our own, and only while its step runs.

    ``apply_liger_kernel_to_llama`` changes the transformers module itself (its functions and
    classes), which every Llama in the process then runs: the names it changes are set for the
    duration of the Liger step only, and put back after, so the other variants stay PyTorch's."""
    from liger_kernel.transformers import apply_liger_kernel_to_llama  # optional peer
    from transformers.models.llama import modeling_llama

    plain = train_step("liger")

    def step(shape, ids, labels, *params):
        key = (shape, "liger", str(ids.device))
        if key not in _PATCHED:

            def patch():
                model, _ = _skeleton(shape, "liger", ids.device)
                apply_liger_kernel_to_llama(rope=True, swiglu=True, rms_norm=True, cross_entropy=False,
                                            fused_linear_cross_entropy=True, model=model)  # fmt: skip

            _PATCHED[key] = changes_of(patch, modeling_llama)
            put_back(_PATCHED[key], 0)
        changed = _PATCHED[key]
        put_back(changed, 1)  # Liger's names in
        try:
            return plain(shape, ids, labels, *params)
        finally:
            put_back(changed, 0)  # PyTorch's back

    return step


_MISSING = object()
_PATCHED: dict[tuple, dict] = {}


def changes_of(patch: Callable[[], None], module) -> dict:
    """What ``patch()`` changes in `module` and in the classes `module` held before it ran:
    {(owner, name): (value before, value after)}, _MISSING where there was none.  Only those owners:
    a class the patch brings in is its own, and putting back one of its names (absent "before")
    would delete that class's method for every later use (Liger's RMS norm lost its forward so)."""
    owners = [module, *(v for v in vars(module).values() if isinstance(v, type))]

    def state() -> dict:
        return {(owner, name): value for owner in owners for name, value in vars(owner).items()}

    before = state()
    patch()
    after = state()
    changed = {}
    for key in before.keys() | after.keys():
        old, new = before.get(key, _MISSING), after.get(key, _MISSING)
        if old is not new:
            changed[key] = (old, new)
    return changed


def put_back(changed: dict, which: int) -> None:
    """Set every changed name to its value before the patch (0) or after it (1)."""
    for (owner, name), values in changed.items():
        value = values[which]
        with contextlib.suppress(AttributeError, TypeError):
            if value is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


def make_inputs(shape: tuple, dtype: torch.dtype, device) -> tuple:
    """(shape, ids, labels, *params): random tokens, labels with a padded tail ignored, and the
    initial weights HuggingFace gives (std 0.02), in `dtype`."""
    batch, seq, *_ = shape
    config = _config(shape)
    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=gen).to(device)
    labels = ids.clone()
    labels[:, seq - seq // 8 :] = IGNORE_INDEX  # the padding of a batch's shorter sequences
    model, _ = _skeleton(shape, "torch", torch.device(device))
    params = []
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            value = torch.ones(p.shape)
        else:
            value = torch.randn(p.shape, generator=gen) * config.initializer_range
        params.append(value.to(device=device, dtype=dtype).requires_grad_())
    return (shape, ids, labels, *params)


def _params(shape: tuple) -> int:
    _, _, hidden, layers, heads, kv_heads, intermediate, vocab = shape
    head_dim = hidden // heads
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    return 2 * vocab * hidden + layers * (attention + 3 * hidden * intermediate + 2 * hidden) + hidden


def _flops(shape: tuple, dtype) -> int:
    """A step's matmul FLOPs: 6 per parameter per token (forward 2, backward 4), and the attention's
    two products over the causal half, forward and backward."""
    batch, seq, hidden, layers, *_ = shape
    tokens = batch * seq
    attention = layers * 3 * 2 * (2 * batch * seq * seq * hidden) // 2
    return 6 * tokens * (_params(shape) - 2 * shape[-1] * hidden + shape[-1] * hidden) + attention


def _bytes(shape: tuple, dtype: torch.dtype) -> int:
    """The least a step moves: every weight read and its gradient written."""
    return 2 * _params(shape) * torch.empty((), dtype=dtype).element_size()


def _describe(shape: tuple) -> str:
    batch, seq, hidden, layers, heads, kv_heads, intermediate, vocab = shape
    return f"B{batch} T{seq} H{hidden} L{layers} heads{heads}/{kv_heads} I{intermediate} V{vocab}"


SPEC = OpSpec(
    name="llama",
    tk=train_step("tk"),
    reference=train_step("torch"),
    make_inputs=make_inputs,
    bytes_moved=_bytes,
    flops=_flops,
    tolerance={torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float64: 1e-10},
    shapes={
        # The Llama of the issue that asked for this (hidden 2048, 4 layers, 16 heads, 8 KV heads, MLP 5632,
        # Llama 3's vocabulary; 4 x 2048 tokens), a smaller one, and one whose tokens are no multiple of 128.
        "cuda": [(4, 2048, 2048, 4, 16, 8, 5632, 128256), (2, 1024, 1024, 4, 16, 8, 2816, 32000),
                 (4, 2047, 2048, 4, 16, 8, 5632, 128256)],  # fmt: skip
        "cpu": [(2, 16, 32, 2, 4, 2, 64, 97)],
    },
    describe=_describe,
    dtypes=(torch.bfloat16,),
    bound="compute",
    compile_tk=True,
    peers={"liger": _liger_step},
    kernel_modules=("ops.norms", "ops.swiglu", "ops.rope", "ops.linear_cross_entropy"),
    call="one training step (forward with labels, backward) of transformers.LlamaForCausalLM",
)

__all__ = ["SPEC", "make_inputs", "train_step"]
