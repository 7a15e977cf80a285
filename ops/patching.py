"""``ops.patch(model)``: tk ops in a loaded HuggingFace ``transformers`` model, by module type.

    model = AutoModelForCausalLM.from_config(config)      # or from_pretrained
    report = ops.patch(model)                             # swaps in place; returns what it did
    print(report)                                         # what was swapped, what was left, and why

What it swaps, each kind on by default and off by its keyword:

* ``norm``: RMS norms (Llama's form, ``weight * x_hat``, and Gemma's, ``(1 + weight) * x_hat``) and
  ``torch.nn.LayerNorm`` -> tk.rms_norm, tk.layer_norm;
* ``mlp``: gated MLPs (``down(act(gate(x)) * up(x))``) -> tk.swiglu or tk.geglu for the gate, whose
  product the backward computes again instead of holding it (ops.nn.gated_down);
* ``gelu``: GELU activations on their own (GPT-2's) -> tk.gelu;
* ``rope``: attention modules that call ``apply_rotary_pos_emb`` -> tk.rope;
* ``loss``: causal language models' loss from labels -> tk.linear_cross_entropy, which never holds the
  (tokens x vocabulary) logits.  A training forward with labels then returns the loss and no logits;
  with no labels, or in eval mode, the model's own forward runs.

A module is recognised by its code, not its name: a class is swapped only if its ``forward`` is, bytecode
for bytecode, one of the forms above as the installed transformers writes it (Llama's RMSNorm, Gemma's,
Llama's MLP, Llama's ``apply_rotary_pos_emb``), so a model family whose module reads alike but computes
something else is left as it is, and said so.  The swap changes the module's class to a subclass whose
``forward`` calls tk (the parameters, buffers, hooks and state dict stay as they are: a patched model
saves and loads as the original); ``ops.unpatch(model)`` changes them back.  Nothing is global: another
model of the same family is untouched.  The patched forwards are plain tensor code, so
``torch.compile(model, fullgraph=True)`` compiles them without a graph break.

transformers is an optional dependency (``pip install -e ".[models]"``): it is imported by ``patch``,
never by ``import ops``.
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .nn import gated_down

KINDS = ("norm", "mlp", "gelu", "rope", "loss")


@dataclass(frozen=True)
class Swap:
    """A module that now computes with tk: where it is, which kind, its class before and after."""

    path: str
    kind: str
    was: str
    now: str


@dataclass(frozen=True)
class Left:
    """A module of a kind patch knows, left as it is, and why."""

    path: str
    kind: str
    type: str
    reason: str


@dataclass
class PatchReport:
    """What ``patch`` did to one model."""

    swapped: list[Swap] = field(default_factory=list)
    left: list[Left] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Modules swapped, by kind."""
        return {kind: sum(s.kind == kind for s in self.swapped) for kind in KINDS}

    def __str__(self) -> str:
        lines = ["ops.patch: tk ops swapped in"]
        by_type: dict[tuple, int] = {}
        for s in self.swapped:
            by_type[(s.kind, s.was, s.now)] = by_type.get((s.kind, s.was, s.now), 0) + 1
        for (kind, was, now), n in sorted(by_type.items()):
            lines.append(f"  {kind:5} {n:4} x {was} -> {now}")
        if not self.swapped:
            lines.append("  nothing")
        reasons: dict[tuple, int] = {}
        for left in self.left:
            reasons[(left.kind, left.type, left.reason)] = reasons.get((left.kind, left.type, left.reason), 0) + 1
        if reasons:
            lines.append("left as they are:")
            for (kind, name, reason), n in sorted(reasons.items()):
                lines.append(f"  {kind:5} {n:4} x {name}: {reason}")
        return "\n".join(lines)


def patch(
    model: nn.Module,
    *,
    norm: bool = True,
    mlp: bool = True,
    gelu: bool = True,
    rope: bool = True,
    loss: bool = True,
    verbose: bool = False,
) -> PatchReport:
    """Swap tk ops into `model` (in place) and say what was swapped and what was left (see the module docstring)."""
    wanted = {"norm": norm, "mlp": mlp, "gelu": gelu, "rope": rope, "loss": loss}
    forms = _Forms.of_installed_transformers()
    report = PatchReport()
    gated_mlps: list[str] = []  # their act_fn is no longer called: not reported on its own
    for path, module in model.named_modules():
        if hasattr(type(module), "_tk_original") or any(path.startswith(p + ".") for p in gated_mlps):
            continue  # patched already, or inside a patched gated MLP
        found = forms.recognise(module)
        if found is None:
            continue
        kind, forward, reason = found
        name = type(module).__name__
        if not wanted[kind]:
            report.left.append(Left(path or "(the model)", kind, name, f"{kind}=False"))
        elif forward is None:
            report.left.append(Left(path or "(the model)", kind, name, reason))
        else:
            _swap(module, kind, forward)
            report.swapped.append(Swap(path or "(the model)", kind, name, type(module).__name__))
            if kind == "mlp":
                gated_mlps.append(path)
    if verbose:
        print(report)
    return report


def unpatch(model: nn.Module) -> int:
    """Give every module ``patch`` swapped its own class back; how many there were."""
    restored = 0
    for module in model.modules():
        original = getattr(type(module), "_tk_original", None)
        if original is not None:
            module.__class__ = original
            restored += 1
    return restored


# --------------------------------------------------------------------------
# The swap: a subclass per (class, kind), whose forward is tk's.
# --------------------------------------------------------------------------

_SUBCLASSES: dict[tuple[type, str], type] = {}


def _swap(module: nn.Module, kind: str, forward) -> None:
    cls = type(module)
    sub = _SUBCLASSES.get((cls, kind))
    if sub is None:
        sub = type(f"Tk{cls.__name__}", (cls,), {"forward": forward, "_tk_original": cls, "_tk_kind": kind})
        sub.__module__ = __name__
        _SUBCLASSES[(cls, kind)] = sub
    module.__class__ = sub


def _same_code(a, b) -> bool:
    """Whether two functions compute alike: the same bytecode, names and non-string constants
    (docstrings and comments may differ)."""
    ca, cb = getattr(a, "__code__", None), getattr(b, "__code__", None)
    if ca is None or cb is None:
        return False
    constants = (lambda c: tuple(k for k in c.co_consts if not isinstance(k, str)))  # noqa: E731
    return (ca.co_code, ca.co_names, constants(ca)) == (cb.co_code, cb.co_names, constants(cb))


# --------------------------------------------------------------------------
# The forwards tk puts in.
# --------------------------------------------------------------------------


def _rms_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """Llama's RMSNorm: ``weight * x_hat``, in the dtype PyTorch's promotion gives (a float32 weight
    on 16-bit activations gives float32, as Llama's module does)."""
    dtype = torch.promote_types(self.weight.dtype, hidden_states.dtype)
    return torch.ops.tk.rms_norm(hidden_states, self.weight, self.variance_epsilon, dtype)


def _offset_rms_norm_forward(self, x: torch.Tensor) -> torch.Tensor:
    """Gemma's RMSNorm: ``(1 + weight) * x_hat`` with the scale in float32, the result in x's dtype."""
    return torch.ops.tk.rms_norm(x, 1.0 + self.weight.float(), self.eps)


def _layer_norm_forward(self, x: torch.Tensor) -> torch.Tensor:
    return torch.ops.tk.layer_norm(x, list(self.normalized_shape), self.weight, self.bias, self.eps)


def _gated_mlp_forward(activation: str):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gated_down(self.gate_proj(x), self.up_proj(x), self.down_proj, activation)

    return forward


def _gelu_forward(approximate: str):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.tk.gelu(x, approximate)

    return forward


def _tk_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    return torch.ops.tk.rope(q, k, cos, sin, unsqueeze_dim)


def _with_tk_rope(forward):
    """`forward` with the name ``apply_rotary_pos_emb`` bound to tk.rope: a copy of the function whose
    globals are its module's, but for that one name (the module itself is not changed)."""
    scope = {**forward.__globals__, "apply_rotary_pos_emb": _tk_apply_rotary_pos_emb}
    copy = types.FunctionType(forward.__code__, scope, forward.__name__, forward.__defaults__, forward.__closure__)
    copy.__kwdefaults__ = forward.__kwdefaults__
    copy.__qualname__, copy.__doc__ = forward.__qualname__, forward.__doc__
    return copy


_LOSS_KEYS = ("num_items_in_batch", "ignore_index", "shift_labels")


def _causal_lm_forward(original, parameters: tuple[str, ...]):
    """A causal LM's forward whose loss from labels is tk.linear_cross_entropy on the last hidden states.

    HuggingFace's ForCausalLMLoss, without the logits: labels shifted by one (or `shift_labels`), rows
    with ``ignore_index`` left out, the mean over the kept rows, or the sum over ``num_items_in_batch``."""

    def forward(self, *args, **kwargs):
        arguments = {**dict(zip(parameters, args)), **kwargs}
        labels = arguments.get("labels")
        if labels is None or not self.training or arguments.get("logits_to_keep", 0) not in (0, None):
            return original(self, *args, **kwargs)
        backbone = {k: v for k, v in arguments.items() if k not in ("labels", "logits_to_keep", "return_dict")}
        for key in _LOSS_KEYS:
            backbone.pop(key, None)
        outputs = self.base_model(**backbone)
        loss_arguments = {k: arguments[k] for k in _LOSS_KEYS if k in arguments}
        loss = causal_lm_loss(outputs[0], self.lm_head, labels, **loss_arguments)
        from transformers.modeling_outputs import CausalLMOutputWithPast

        result = CausalLMOutputWithPast(
            loss=loss,
            logits=None,
            past_key_values=getattr(outputs, "past_key_values", None),
            hidden_states=getattr(outputs, "hidden_states", None),
            attentions=getattr(outputs, "attentions", None),
        )
        return result.to_tuple() if arguments.get("return_dict") is False else result

    return forward


def causal_lm_loss(
    hidden: torch.Tensor,
    lm_head: nn.Linear,
    labels: torch.Tensor,
    num_items_in_batch=None,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
) -> torch.Tensor:
    """HuggingFace's causal-LM loss of ``lm_head(hidden)`` against `labels`, by tk.linear_cross_entropy."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:].contiguous()
    shift_labels = _placed_as(shift_labels, hidden)
    x = hidden.reshape(-1, hidden.shape[-1])
    target = shift_labels.reshape(-1).to(x.device)
    reduction = "mean" if num_items_in_batch is None else "sum"
    loss = torch.ops.tk.linear_cross_entropy(x, lm_head.weight, target, lm_head.bias, ignore_index, reduction)
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


def _placed_as(labels: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """Under tensor parallelism (`hidden` a DTensor), the labels, whole on every rank, as a DTensor
    placed as the hidden states' (batch, seq) dims are: a DTensor op takes no plain tensor beside
    DTensors, and rows flattened alike stay sharded alike (docs/distributed.md).  Taking each rank's
    share communicates nothing."""
    if not torch.distributed.is_available():
        return labels
    from torch.distributed.tensor import DTensor, Replicate

    if not isinstance(hidden, DTensor) or isinstance(labels, DTensor):
        return labels
    mesh = hidden.device_mesh
    placements = [p if p.is_shard() and p.dim < labels.dim() else Replicate() for p in hidden.placements]
    labels = DTensor.from_local(labels.to(hidden.device), mesh, [Replicate()] * mesh.ndim, run_check=False)
    return labels.redistribute(mesh, placements)


# --------------------------------------------------------------------------
# Recognising a module by its code.
# --------------------------------------------------------------------------


class _Forms:
    """The reference forms, read from the installed transformers: what each kind looks like there."""

    def __init__(self, transformers):
        from transformers import activations
        from transformers.models.gemma import modeling_gemma
        from transformers.models.llama import modeling_llama

        self.rms_norm = modeling_llama.LlamaRMSNorm.forward
        self.offset_rms_norm = modeling_gemma.GemmaRMSNorm.forward
        self.gated_mlp = modeling_llama.LlamaMLP.forward
        self.rope = modeling_llama.apply_rotary_pos_emb
        self.pretrained = transformers.PreTrainedModel
        # activation module -> (kind of gate, its tk form): the ones whose math tk has
        tanh_forms = ("GELUTanh", "PytorchGELUTanh", "NewGELUActivation")
        gelu_tanh = [getattr(activations, n) for n in tanh_forms if hasattr(activations, n)]
        self.activations = {activations.SiLUActivation: "silu", nn.SiLU: "silu", activations.GELUActivation: "gelu"}
        self.activations.update({cls: "gelu_tanh" for cls in gelu_tanh})

    @classmethod
    def of_installed_transformers(cls) -> _Forms:
        try:
            import transformers
        except ImportError as error:
            raise ImportError("ops.patch needs transformers: pip install -e '.[models]'") from error
        return cls(transformers)

    def recognise(self, module: nn.Module):
        """(kind, tk's forward or None, why not) for a module of a kind patch knows; None otherwise."""
        cls = type(module)
        forward = cls.forward
        name = cls.__name__
        if isinstance(module, nn.LayerNorm):
            if cls is not nn.LayerNorm:
                return "norm", None, "a subclass of nn.LayerNorm: its forward may differ"
            return "norm", _layer_norm_forward, ""
        if name.endswith("RMSNorm"):
            if _same_code(forward, self.rms_norm):
                return "norm", _rms_norm_forward, ""
            if _same_code(forward, self.offset_rms_norm):
                return "norm", _offset_rms_norm_forward, ""
            return "norm", None, "its forward is neither Llama's nor Gemma's RMSNorm"
        if all(hasattr(module, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            if not _same_code(forward, self.gated_mlp):
                return "mlp", None, "its forward is not Llama's gated MLP"
            activation = self.activations.get(type(module.act_fn))
            if activation is None:
                return "mlp", None, f"tk has no fused gate for {type(module.act_fn).__name__}"
            return "mlp", _gated_mlp_forward(activation), ""
        if type(module) in self.activations and self.activations[type(module)] != "silu":
            return "gelu", _gelu_forward("tanh" if self.activations[type(module)] == "gelu_tanh" else "none"), ""
        if cls is nn.GELU:
            return "gelu", _gelu_forward(module.approximate), ""
        code = getattr(forward, "__code__", None)
        if code is not None and "apply_rotary_pos_emb" in code.co_names:
            rope = forward.__globals__.get("apply_rotary_pos_emb")
            if not _same_code(getattr(rope, "__wrapped__", rope), self.rope):
                return "rope", None, "its apply_rotary_pos_emb is not Llama's"
            return "rope", _with_tk_rope(forward), ""
        if isinstance(module, self.pretrained) and isinstance(getattr(module, "lm_head", None), nn.Linear):
            return self._causal_lm(module)
        return None

    def _causal_lm(self, model):
        forward = type(model).forward
        inner = inspect.unwrap(forward)  # under transformers' decorators (can_return_tuple, auto_docstring)
        names = getattr(getattr(inner, "__code__", None), "co_names", ())
        if "loss_function" not in names:
            return "loss", None, "its forward does not compute HuggingFace's loss_function"
        config = model.config
        if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
            return "loss", None, "its logits are soft-capped or scaled before the loss"
        if getattr(config, "loss_type", None) not in (None, "ForCausalLM") or getattr(model, "_loss_function", None):
            return "loss", None, "it has a loss of its own"
        code = inner.__code__
        parameters = code.co_varnames[1 : code.co_argcount]  # after self, in order
        return "loss", _causal_lm_forward(forward, parameters), ""
