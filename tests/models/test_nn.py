"""ops.nn: each module against the PyTorch module or formula it stands in for, values and gradients."""

import copy

import pytest
import torch
import torch.nn.functional as F
from reference import assert_close

import ops


def _grads(module_or_fn, *inputs):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = module_or_fn(*leaves)
    out.backward(torch.ones_like(out) if out.dim() else None)
    return out.detach(), [t.grad for t in leaves]


def test_rms_norm_is_llamas_and_with_an_offset_gemmas():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 24)
    norm = ops.nn.RMSNorm(24, eps=1e-5)
    torch.nn.init.normal_(norm.weight)
    expected = F.rms_norm(x, (24,), norm.weight.detach(), 1e-5)
    assert_close(norm(x), expected, torch.float32)
    gemma = ops.nn.RMSNorm(24, eps=1e-6, offset=1.0)
    assert torch.equal(gemma.weight, torch.zeros(24))  # stored as the difference from 1
    torch.nn.init.normal_(gemma.weight)
    expected = F.rms_norm(x, (24,), 1 + gemma.weight.detach(), 1e-6)
    assert_close(gemma(x), expected, torch.float32)
    (y, [dx]), (y_ref, [dx_ref]) = _grads(norm, x), _grads(lambda t: F.rms_norm(t, (24,), norm.weight, 1e-5), x)
    assert_close(y, y_ref, torch.float32)
    assert_close(dx, dx_ref, torch.float32)


def test_layer_norm_and_gelu_are_pytorchs_modules_with_their_state():
    torch.manual_seed(0)
    x = torch.randn(4, 7, 10)
    reference = torch.nn.LayerNorm(10)
    torch.nn.init.normal_(reference.weight), torch.nn.init.normal_(reference.bias)
    ours = ops.nn.LayerNorm(10)
    ours.load_state_dict(reference.state_dict())
    assert_close(ours(x), reference(x), torch.float32)
    for approximate in ("none", "tanh"):
        assert_close(ops.nn.GELU(approximate)(x), F.gelu(x, approximate=approximate), torch.float32)


@pytest.mark.parametrize(
    "activation, reference",
    [("silu", F.silu), ("gelu", F.gelu), ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh"))],
)
def test_gated_mlp_is_down_of_act_gate_times_up(activation, reference):
    torch.manual_seed(0)
    mlp = ops.nn.GatedMLP(12, 20, activation)
    x = torch.randn(2, 3, 12)
    expected = mlp.down_proj(reference(mlp.gate_proj(x)) * mlp.up_proj(x))
    assert_close(mlp(x), expected, torch.float32)
    assert set(mlp.state_dict()) == {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}
    with pytest.raises(ValueError, match="activation must be one of"):
        ops.nn.GatedMLP(4, 8, "relu")


def _reference_mlp(mlp: ops.nn.GatedMLP, reference) -> torch.nn.Module:
    """A copy of mlp in float64 whose forward is PyTorch's ops: down(act(gate(x)) * up(x))."""
    ref = copy.deepcopy(mlp).double()
    ref.forward = lambda x: ref.down_proj(reference(ref.gate_proj(x)) * ref.up_proj(x))
    return ref


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(
    "activation, reference",
    [("silu", F.silu), ("gelu", F.gelu), ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh"))],
)
def test_gated_mlp_gradients_match_float64(activation, reference, bias):
    """Every parameter's gradient and x's, against the same MLP in float64 (the down projection's
    weight gradient comes from the product computed again in the backward)."""
    torch.manual_seed(0)
    mlp = ops.nn.GatedMLP(12, 20, activation, bias=bias)
    ref = _reference_mlp(mlp, reference)
    x = torch.randn(2, 3, 12).requires_grad_()
    x64 = x.detach().double().requires_grad_()
    grad = torch.randn(2, 3, 12)
    mlp(x).backward(grad)
    ref(x64).backward(grad.double())
    assert_close(x.grad, x64.grad, torch.float32)
    for (name, p), (_, p64) in zip(mlp.named_parameters(), ref.named_parameters()):
        assert p.grad is not None, name
        assert_close(p.grad, p64.grad.float(), torch.float32)


def _saved_storages(fn, *inputs) -> dict[tuple, int]:
    """shape -> how many distinct storages autograd holds for the backward of fn(*inputs)."""
    saved: dict[tuple, set] = {}

    def pack(t):
        saved.setdefault(tuple(t.shape), set()).add(t.untyped_storage().data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return {shape: len(ptrs) for shape, ptrs in saved.items()}


def test_gated_mlp_holds_gate_and_up_but_not_their_product():
    """The product act(gate) * up is the layer's largest activation: the backward computes it again."""
    mlp = ops.nn.GatedMLP(12, 20)
    x = torch.randn(5, 12, requires_grad=True)
    assert _saved_storages(mlp, x)[(5, 20)] == 2  # gate and up (the product would be a third)


def test_gated_mlp_under_autocast_matches_the_same_mlp_in_pytorchs_ops():
    """bf16 autocast over float32 parameters, the backward outside it (as a training loop runs it): the
    same values and parameter gradients as PyTorch's ops under the same autocast."""
    torch.manual_seed(0)
    mlp = ops.nn.GatedMLP(16, 24, bias=True)
    ref = _reference_mlp(mlp, F.silu).float()
    x = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, y_ref = mlp(x), ref(x)
    assert y.dtype == torch.bfloat16
    assert_close(y, y_ref, torch.bfloat16)
    y.float().sum().backward(), y_ref.float().sum().backward()
    for (name, p), (_, p_ref) in zip(mlp.named_parameters(), ref.named_parameters()):
        assert_close(p.grad.bfloat16(), p_ref.grad.bfloat16(), torch.bfloat16)  # both computed in bf16


@pytest.mark.parametrize("case", ["float32 product", "float64 model"])
def test_gated_down_under_autocast_where_the_product_is_not_in_its_dtype(case):
    """A product autocast would cast (float32 under bf16 autocast) or a float64 model, which autocast
    leaves alone: the down projection is called as PyTorch would, with the same gradients."""
    torch.manual_seed(0)
    dtype = torch.float64 if case == "float64 model" else torch.float32
    down = torch.nn.Linear(24, 16, dtype=dtype)
    gate, up = (torch.randn(4, 24, dtype=dtype, requires_grad=True) for _ in range(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = ops.nn.gated_down(gate, up, down, "silu")
        y_ref = down(F.silu(gate) * up)
    assert y.dtype == y_ref.dtype
    got = torch.autograd.grad(y.float().sum(), (gate, up, down.weight))
    want = torch.autograd.grad(y_ref.float().sum(), (gate, up, down.weight))
    for g, w in zip(got, want):
        assert_close(g, w, g.dtype, scale=1 if dtype == torch.float64 else 4)


def test_gated_mlp_calls_a_down_projection_that_is_not_a_plain_linear():
    """A LoRA wrapper or a hooked linear is called as it is: what it adds is not skipped."""
    torch.manual_seed(0)
    mlp = ops.nn.GatedMLP(8, 16)
    x = torch.randn(3, 8)
    plain = mlp(x)
    handle = mlp.down_proj.register_forward_hook(lambda module, args, out: out + 1)
    assert_close(mlp(x), plain + 1, torch.float32)
    handle.remove()

    mlp.down_proj.forward = lambda h, original=mlp.down_proj.forward: original(h) * 3  # as accelerate's hooks do
    assert_close(mlp(x), 3 * plain, torch.float32)
    del mlp.down_proj.forward
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, out: out + 1 if module is mlp.down_proj else out
    )
    assert_close(mlp(x), plain + 1, torch.float32)
    handle.remove()
    called = []
    handle = mlp.down_proj.register_full_backward_pre_hook(lambda module, grad: called.append(True))
    mlp(x.requires_grad_()).sum().backward()
    assert called
    handle.remove()

    class Quantized(torch.Tensor):  # a weight of a tensor subclass (torchao's, a DTensor) keeps its own F.linear
        pass

    from ops.nn import _plain_linear

    assert _plain_linear(mlp.down_proj)
    weight = mlp.down_proj.weight
    mlp.down_proj.weight = torch.nn.Parameter(weight.detach().clone().as_subclass(Quantized))
    assert not _plain_linear(mlp.down_proj)
    mlp.down_proj.weight = weight

    class Adapted(torch.nn.Linear):
        def forward(self, h):
            return super().forward(h) * 2

    adapted = Adapted(16, 8, bias=False)
    adapted.load_state_dict(mlp.down_proj.state_dict())
    mlp.down_proj = adapted
    assert_close(mlp(x), 2 * plain, torch.float32)


def test_cross_entropy_loss_over_leading_dims_with_ignored_targets():
    torch.manual_seed(0)
    logits, target = torch.randn(2, 5, 17), torch.randint(0, 17, (2, 5))
    target[0, :2] = -100
    for reduction in ("mean", "sum", "none"):
        loss = ops.nn.CrossEntropyLoss(reduction=reduction, label_smoothing=0.1)(logits, target)
        expected = F.cross_entropy(logits.reshape(-1, 17), target.reshape(-1), reduction=reduction, label_smoothing=0.1)
        assert_close(loss, expected, torch.float32)


def test_linear_cross_entropy_loss_is_the_loss_of_the_linear_layers_logits():
    torch.manual_seed(0)
    x, weight, bias = torch.randn(9, 16), torch.randn(33, 16), torch.randn(33)
    target = torch.randint(0, 33, (9,))
    target[4] = -100
    loss = ops.nn.LinearCrossEntropyLoss()(x, weight, target, bias)
    assert_close(loss, F.cross_entropy(F.linear(x, weight, bias), target), torch.float32)


def test_apply_rotary_pos_emb_is_huggingfaces():
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 7, 16).transpose(1, 2).transpose(1, 2), torch.randn(2, 2, 7, 16)
    angles = torch.randn(2, 7, 8)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    for got, expected in zip(ops.nn.apply_rotary_pos_emb(q, k, cos, sin), apply_rotary_pos_emb(q, k, cos, sin)):
        assert_close(got, expected, torch.float32)
