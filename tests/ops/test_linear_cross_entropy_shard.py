"""One vocabulary shard's part of linear cross entropy (ops/linear_cross_entropy/shard.py), in one process.

The weight is split into shards as DTensor splits it over ranks (torch.chunk: uneven, possibly
empty ones); each shard's stats and gradients come from the shard ops, combined as the ranks combine
them (combine, and grad_x's shares summed), and must give F.cross_entropy(F.linear(...)) in float64.
The exchange between ranks is tested in tests/distributed/test_vocab_parallel.py.
"""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from reference import DEVICES, TOLERANCE, rel_error
from test_linear_cross_entropy import as_float32, make_case

from ops.linear_cross_entropy.plan import TUNING
from ops.linear_cross_entropy.shard import shard_backward, shard_stats
from ops.linear_cross_entropy.vocab_parallel import combine

tk = torch.ops.tk
TINY_CHUNKS = replace(TUNING, chunk_rows=8).with_cpu(max_block=16)  # ragged chunks, rows swept 16 columns a time


def _shards(weight, bias, parts: int):
    """(vocab_start, weight rows, bias rows) of each of `parts` shards, as torch.chunk cuts them."""
    size = -(-weight.shape[0] // parts)
    starts = [min(r * size, weight.shape[0]) for r in range(parts)]
    ends = [min(s + size, weight.shape[0]) for s in starts]
    return [(s, weight[s:e], None if bias is None else bias[s:e]) for s, e in zip(starts, ends)]


def sharded_loss(x, weight, target, bias, parts, smoothing=0.0, tuning=TUNING):
    """(row losses, lse, per-shard pieces) of the loss over `parts` shards of the weight."""
    shards = _shards(weight, bias, parts)
    stats = torch.stack([shard_stats(x, w, target, b, s, -100, smoothing, tuning=tuning) for s, w, b in shards])
    loss, lse = combine(stats, [w.shape[0] for _, w, _ in shards], target, -100, smoothing)
    return loss, lse, shards


def sharded_gradients(grad, lse, x, weight, target, bias, shards, smoothing=0.0, tuning=TUNING):
    """(grad_x, grad_weight, grad_bias): grad_x's shares summed, the shards' rows concatenated."""
    vocab = weight.shape[0]
    pieces = [
        shard_backward(grad, lse, x, w, target, b, s, vocab, -100, smoothing, True, True, b is not None, tuning=tuning)
        for s, w, b in shards
    ]
    grad_x = sum(p[0].double() for p in pieces)
    grad_weight = torch.cat([p[1] for p in pieces])
    grad_bias = torch.cat([p[2] for p in pieces]) if bias is not None else None
    return grad_x, grad_weight, grad_bias


def reference(x, weight, target, bias, smoothing, grad):
    """Row losses and gradients in float64 (logits rounded to x's dtype, as the kernel's GEMM gives them)."""
    x64, w64 = x.double().clone().requires_grad_(), weight.double().clone().requires_grad_()
    b64 = bias.double().clone().requires_grad_() if bias is not None else None
    logits = F.linear(x64, w64, b64)
    logits = logits + (F.linear(x, weight, bias).double() - logits).detach()  # the values rounded, the gradient exact
    loss = F.cross_entropy(logits, target, reduction="none", label_smoothing=as_float32(smoothing))
    loss.backward(grad.double())
    return loss.detach(), x64.grad, w64.grad, None if b64 is None else b64.grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("parts", [1, 2, 3, 40])  # 40 shards of 37 classes: the last ones hold none
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_shards_combine_to_the_whole_loss_and_its_gradients(device, dtype, parts, smoothing):
    torch.manual_seed(parts)
    x, weight, target, bias = make_case(21, 12, 37, device, dtype)
    loss, lse, shards = sharded_loss(x, weight, target, bias, parts, smoothing, tuning=TINY_CHUNKS)
    grad = torch.rand(21, device=device)
    expected = reference(x, weight, target, bias, smoothing, grad)
    assert rel_error(loss, expected[0]) <= TOLERANCE[torch.float32]
    got = sharded_gradients(grad, lse, x, weight, target, bias, shards, smoothing, tuning=TINY_CHUNKS)
    for name, g, e in zip(("x", "weight", "bias"), got, expected[1:]):
        assert g.dtype == torch.float64 if name == "x" else g.dtype == dtype, name
        assert g.shape == e.shape, name
        assert rel_error(g, e) <= 2 * TOLERANCE[dtype], name


@pytest.mark.parametrize("device", DEVICES)
def test_an_out_of_range_target_is_nan_and_ignored_rows_are_zero(device):
    torch.manual_seed(0)
    x, weight, target, bias = make_case(6, 8, 10, device, torch.float32, ignore_every=0)
    target[2], target[4] = 10, -100  # past the last class (which no shard holds), and ignored
    loss, lse, shards = sharded_loss(x, weight, target, None, 2)
    assert torch.isnan(loss[2]) and loss[4] == 0 and torch.isfinite(loss[[0, 1, 3, 5]]).all()
    grad_x, grad_weight, _ = sharded_gradients(torch.ones(6, device=device), lse, x, weight, target, None, shards)
    assert torch.isnan(grad_x[2]).all() and (grad_x[4] == 0).all() and torch.isfinite(grad_x[[0, 1, 3, 5]]).all()
    assert torch.isnan(grad_weight).all()  # a NaN row of the logits' gradient reaches every weight row


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_huge_logits_keep_their_small_differences(smoothing):
    """Logits around 1e6: the loss of a row is O(1) and must not be rounded away (float32 lse or mean would)."""
    x = torch.tensor([[1.0], [1.0]])
    weight = torch.tensor([[1e6], [1e6 - 1], [1e6 - 2], [1e6 - 3], [1e6 - 5]])
    target = torch.tensor([0, 3])
    loss, _, _ = sharded_loss(x, weight, target, None, 2, smoothing)
    logits = F.linear(x.double(), weight.double())
    expected = F.cross_entropy(logits, target, reduction="none", label_smoothing=as_float32(smoothing))
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-5)


def test_a_shard_of_minus_infinity_logits_makes_the_smoothed_loss_infinite_as_the_whole_one():
    x = torch.tensor([[1.0]])
    weight = torch.tensor([[1.0], [2.0], [float("-inf")], [float("-inf")]])  # the second shard's logits: -inf
    target = torch.tensor([1])
    loss, _, _ = sharded_loss(x, weight, target, None, 2, 0.1)
    whole = tk.linear_cross_entropy(x, weight, target, reduction="none", label_smoothing=0.1)
    assert loss.item() == whole.item() == float("inf")


def test_empty_rows_and_bad_arguments():
    x, weight, target, _ = make_case(0, 4, 5, "cpu", torch.float32)
    assert tk.linear_cross_entropy_shard_stats(x, weight, target, None, 0, -100, 0.0).shape == (4, 0)
    x, weight, target, _ = make_case(3, 4, 5, "cpu", torch.float32)
    with pytest.raises(ValueError, match="vocab_start must be at least 0"):
        tk.linear_cross_entropy_shard_stats(x, weight, target, None, -1, -100, 0.0)
    with pytest.raises(ValueError, match="a shard of 5 classes from 2 does not fit a vocabulary of 6"):
        tk.linear_cross_entropy_shard_backward(
            torch.ones(3), torch.ones(3), x, weight, target, None, 2, 6, -100, 0.0, True, True, False
        )
    with pytest.raises(ValueError, match="lse has shape \\(2,\\)"):
        tk.linear_cross_entropy_shard_backward(
            torch.ones(3), torch.ones(2), x, weight, target, None, 0, 5, -100, 0.0, True, True, False
        )


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    torch.manual_seed(0)
    x, weight, target, bias = make_case(9, 8, 11, device, torch.float32)
    torch.library.opcheck(tk.linear_cross_entropy_shard_stats, (x, weight[3:9], target, bias[3:9], 3, -100, 0.1))
    lse = torch.logsumexp(F.linear(x, weight, bias), -1)
    args = (torch.rand(9, device=device), lse, x, weight[3:9], target, bias[3:9], 3, 11, -100, 0.1, True, True, True)
    torch.library.opcheck(tk.linear_cross_entropy_shard_backward, args)
