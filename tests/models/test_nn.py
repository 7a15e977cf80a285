"""ops.nn: each module against the PyTorch module or formula it stands in for, values and gradients."""

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
