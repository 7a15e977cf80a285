"""rope: rotary position embedding of q and k against HF's formula in float64, forward and backward.

Each test runs on the CPU (the Triton kernels through the interpreter, a few
positions: each (batch, position) is one interpreted program) and, marked
`gpu`, on CUDA at the sizes of real models.
"""

import pytest
import torch
from reference import DEVICES, DTYPES, TOLERANCE, assert_close, assert_raises_clearly, error_cases, leaf64, rel_error

import ops
from ops import rope as rope_ops
from ops.blocks.sizes import next_power_of_2
from ops.rope import apply_rotary_pos_emb, rotary_gradients, rotary_tables
from ops.runtime import is_dense

tk = torch.ops.tk


def pick(device, cpu, cuda):
    return cuda if device == "cuda" else cpu


def qk(batch, seq, q_heads, k_heads, head_dim, *, dtype=torch.float32, device="cpu", rotary=None, heads_dim=1):
    """q and k as HF hands them over: a (batch, seq, heads, head_dim) projection output, transposed to
    (batch, heads, seq, head_dim) for heads_dim=1 (kept as it is for heads_dim=2), cut to its first
    `rotary` dims for partial rotary."""
    rotary = rotary or head_dim
    out = []
    for heads in (q_heads, k_heads):
        t = torch.randn(batch, seq, heads, head_dim, device=device).to(dtype)
        out.append((t.transpose(1, 2) if heads_dim == 1 else t)[..., :rotary])
    return out


def random_tables(batch, seq, dim, *, dtype=torch.float32, device="cpu"):
    """cos and sin whose two halves differ (HF's are equal): they catch a kernel that reads one half only."""
    return [torch.randn(batch, seq, dim, device=device).to(dtype) for _ in range(2)]


def exact(q, k, cos, sin, unsqueeze_dim=1):
    return apply_rotary_pos_emb(q.double(), k.double(), cos.double(), sin.double(), unsqueeze_dim)


def assert_pair_close(got, want, dtype, scale=1.0, case=""):
    """Both results (q's and k's) within dtype's tolerance of float64; `case` names the call in a failure."""
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        try:
            assert_close(g, w, dtype, scale)
        except AssertionError as error:
            raise AssertionError(f"{case} result {i}: {error}") from None


# (batch, seq, q heads, kv heads, head_dim, rotary dims): every head_dim the families use, halves
# that are not powers of two (40, 48), grouped-query heads, partial rotary (Phi), odd sequences.
CONFIGS = {
    "cpu": [(2, 3, 4, 2, 64, 64), (1, 5, 3, 1, 80, 80), (1, 3, 2, 2, 96, 96), (2, 3, 4, 4, 128, 128),
            (1, 2, 2, 1, 256, 256), (1, 5, 4, 4, 80, 32)],
    "cuda": [(4, 2047, 32, 8, 128, 128), (1, 8191, 16, 8, 128, 128), (2, 2047, 28, 4, 128, 128),
             (2, 1023, 16, 16, 256, 256), (2, 2047, 32, 32, 80, 32), (3, 999, 8, 8, 64, 64), (2, 777, 12, 4, 96, 96),
             (2, 1001, 20, 5, 80, 80)],
}  # fmt: skip


# ----------------------------------------------------------------- the reference


def test_the_reference_is_transformers_formula_and_tables():
    """apply_rotary_pos_emb and rotary_tables here are HF's, bit for bit (Llama's, and Phi's partial rotary)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama
    from transformers.models.phi.modeling_phi import PhiRotaryEmbedding

    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                      intermediate_size=128, num_hidden_layers=1, vocab_size=32)  # fmt: skip
    x = torch.randn(2, 7, 64, dtype=torch.bfloat16)
    cos, sin = modeling_llama.LlamaRotaryEmbedding(config)(x, torch.arange(7)[None])
    assert all(torch.equal(a, b) for a, b in zip((cos, sin), rotary_tables(7, 16, torch.bfloat16, "cpu")))
    phi = transformers.PhiConfig(hidden_size=160, num_attention_heads=2, partial_rotary_factor=0.4,
                                 intermediate_size=64, num_hidden_layers=1, vocab_size=32)  # fmt: skip
    cos, sin = PhiRotaryEmbedding(phi)(x, torch.arange(7)[None])
    assert all(torch.equal(a, b) for a, b in zip((cos, sin), rotary_tables(7, 32, torch.bfloat16, "cpu")))
    q, k = qk(2, 7, 4, 2, 16, dtype=torch.float64)
    cos, sin = random_tables(1, 7, 16, dtype=torch.float64)
    for dim, (a, b) in ((1, (q, k)), (2, (q.transpose(1, 2), k.transpose(1, 2)))):
        ours = apply_rotary_pos_emb(a, b, cos, sin, dim)
        theirs = modeling_llama.apply_rotary_pos_emb(a, b, cos, sin, unsqueeze_dim=dim)
        assert all(torch.equal(x, y) for x, y in zip(ours, theirs))
        # and the gradient formula is autograd's through it
        leaves = [leaf64(a), leaf64(b)]
        grads = [torch.randn_like(t) for t in leaves]
        want = torch.autograd.grad(modeling_llama.apply_rotary_pos_emb(*leaves, cos, sin, dim), leaves, grads)
        for got, w in zip(rotary_gradients(*grads, cos, sin, dim), want):
            torch.testing.assert_close(got, w, rtol=1e-14, atol=1e-14)


# ----------------------------------------------------------------- the forward


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_matches_float64(device, dtype):
    for batch, seq, q_heads, k_heads, head_dim, rotary in CONFIGS[device]:
        q, k = qk(batch, seq, q_heads, k_heads, head_dim, dtype=dtype, device=device, rotary=rotary)
        cos, sin = rotary_tables(seq, rotary, dtype, device)
        out = tk.rope(q, k, cos, sin)
        assert [t.shape for t in out] == [q.shape, k.shape]
        assert_pair_close(out, exact(q, k, cos, sin), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_with_halves_of_cos_and_sin_that_differ(device, dtype):
    """Nothing assumes HF's equal halves: y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2 for any tables."""
    for batch, seq, q_heads, k_heads, head_dim, rotary in CONFIGS[device][:2]:
        q, k = qk(batch, seq, q_heads, k_heads, head_dim, dtype=dtype, device=device, rotary=rotary)
        cos, sin = random_tables(batch, seq, rotary, dtype=dtype, device=device)
        assert_pair_close(tk.rope(q, k, cos, sin), exact(q, k, cos, sin), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_rope_reads_every_layout(device):
    """q and k contiguous as (batch, heads, seq, dim), as HF's transposed views, as (batch, seq, heads,
    dim) with unsqueeze_dim=2, with a strided last dim (copied once), expanded over the batch; the
    outputs keep a dense input's layout."""
    batch, seq, q_heads, k_heads, dim = pick(device, (2, 3, 3, 2, 16), (2, 1023, 32, 8, 128))
    cos, sin = random_tables(batch, seq, dim, device=device)
    hf_q, hf_k = qk(batch, seq, q_heads, k_heads, dim, device=device)
    wide = torch.randn(batch, q_heads, seq, 2 * dim, device=device)
    cases = {
        "contiguous": (hf_q.contiguous(), hf_k.contiguous(), 1),
        "transposed view": (hf_q, hf_k, 1),
        "unsqueeze_dim=2": (hf_q.transpose(1, 2), hf_k.transpose(1, 2), 2),
        "unsqueeze_dim=2, transposed": (hf_q.contiguous().transpose(1, 2), hf_k.contiguous().transpose(1, 2), 2),
        "strided last dim": (wide[..., ::2], hf_k, 1),
        "expanded over the batch": (hf_q[:1].expand(batch, -1, -1, -1), hf_k[:1].expand(batch, -1, -1, -1), 1),
    }
    for name, (q, k, unsqueeze_dim) in cases.items():
        out = tk.rope(q, k, cos, sin, unsqueeze_dim)
        assert_pair_close(out, exact(q, k, cos, sin, unsqueeze_dim), torch.float32, case=name)
        for o, t in zip(out, (q, k)):
            if is_dense(t):
                assert o.stride() == t.stride(), name


@pytest.mark.parametrize("device", DEVICES)
def test_rope_broadcasts_cos_and_sin(device):
    """cos and sin of a batch of one or of every batch, expanded (stride 0), a view into a longer
    table, of one position, or with a strided last dim: PyTorch's broadcasting."""
    batch, seq, dim = pick(device, (3, 4, 16), (4, 2047, 128))
    q, k = qk(batch, seq, 4, 2, dim, device=device)
    table_cos, table_sin = random_tables(batch, seq + 5, dim, device=device)
    per_batch = random_tables(batch, seq, dim, device=device)
    one = random_tables(1, seq, dim, device=device)
    wide = random_tables(batch, seq, 2 * dim, device=device)
    cases = {
        "per batch": per_batch,
        "batch of one": one,
        "expanded": [t.expand(batch, -1, -1) for t in one],
        "a view into a longer table": (table_cos[:, 3 : 3 + seq], table_sin[:, 3 : 3 + seq]),
        "one position": [t[:, :1] for t in per_batch],
        "strided last dim": [t[..., ::2] for t in wide],
    }
    for name, (cos, sin) in cases.items():
        assert_pair_close(tk.rope(q, k, cos, sin), exact(q, k, cos, sin), torch.float32, case=name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("loads_first", [False, True], ids=["q-then-k", "loads-first"])
@pytest.mark.parametrize("heads_a_tile", [1, 2, 4, 8])
def test_rope_takes_several_head_tiles_a_program(device, heads_a_tile, loads_first):
    """A head tile smaller than the heads: the loop over tiles, a last tile partly masked (7 q heads
    and 3 kv heads in tiles of 2 or 4), forward and backward; tiles of 8 hold every head, where
    loads_first loads q and k before storing either (smaller tiles ignore it)."""
    batch, seq, dim = pick(device, (1, 3, 16), (2, 257, 128))
    tile = heads_a_tile * next_power_of_2(dim // 2)
    q, k = qk(batch, seq, 7, 3, dim, device=device)
    cos, sin = random_tables(batch, seq, dim, device=device)
    options = {"head_tile": tile, "loads_first": loads_first}
    assert_pair_close(rope_ops.forward(q, k, cos, sin, **options), exact(q, k, cos, sin), torch.float32)
    grads = [torch.randn_like(t) for t in (q, k)]
    want = rotary_gradients(*[g.double() for g in grads], cos.double(), sin.double())
    assert_pair_close(rope_ops.backward(*grads, cos, sin, **options), want, torch.float32)


@pytest.mark.parametrize("loads_first", [False, True])
def test_loads_first_only_where_q_and_k_each_fit_one_tile(monkeypatch, loads_first):
    """The kernel's LOADS_FIRST: the form asked for, where 7 q heads and 3 kv heads fit their tiles; never
    where they take several."""
    q, k = qk(1, 3, 7, 3, 16)
    cos, sin = random_tables(1, 3, 16)
    for tile, fits in ((8 * 8, True), (2 * 8, False)):
        launches = Launches()
        monkeypatch.setattr(rope_ops, "launcher", launches)
        rope_ops.forward(q, k, cos, sin, head_tile=tile, loads_first=loads_first)
        ((_, _, _, kwargs),) = launches.calls
        assert kwargs["LOADS_FIRST"] is (loads_first and fits)


@pytest.mark.parametrize("device", DEVICES)
def test_rope_of_empty_tensors(device):
    """No batch, no positions, no heads (of q, of k, of both), no head_dim: the right shapes, and
    values where there are any; gradients of the same shapes."""
    for batch, seq, q_heads, k_heads, dim in [(0, 3, 2, 1, 8), (2, 0, 2, 1, 8), (1, 3, 0, 2, 8), (1, 3, 2, 0, 8),
                                              (1, 3, 0, 0, 8), (1, 3, 2, 1, 0)]:  # fmt: skip
        q, k = qk(batch, seq, q_heads, k_heads, dim, device=device)
        q.requires_grad_(), k.requires_grad_()
        cos, sin = random_tables(1, seq, dim, device=device)
        out = tk.rope(q, k, cos, sin)
        assert [t.shape for t in out] == [q.shape, k.shape]
        assert_pair_close([t.detach() for t in out], exact(q.detach(), k.detach(), cos, sin), torch.float32)
        sum(t.sum() for t in out).backward()
        assert q.grad.shape == q.shape and k.grad.shape == k.shape


# ----------------------------------------------------------------- dtypes


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("x_dtype", "table_dtype"), [(torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                                      (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float64)])  # fmt: skip
def test_mixed_dtypes_follow_pytorchs_type_promotion(device, x_dtype, table_dtype):
    """q bfloat16 with cos float32 gives float32 results, as HF's formula does (what an autocast
    model with float32 weights hands over); the gradients come back in q's and k's dtype."""
    batch, seq, dim = pick(device, (2, 3, 16), (4, 2047, 128))
    q, k = qk(batch, seq, 4, 2, dim, dtype=x_dtype, device=device)
    cos, sin = rotary_tables(seq, dim, table_dtype, device)
    result = torch.promote_types(x_dtype, table_dtype)
    out = tk.rope(q, k, cos, sin)
    assert [t.dtype for t in out] == [t.dtype for t in apply_rotary_pos_emb(q, k, cos, sin)] == [result, result]
    assert_pair_close(out, exact(q, k, cos, sin), result)
    leaves = [t.detach().requires_grad_() for t in (q, k)]
    grads = [torch.randn(t.shape, device=device, dtype=result) for t in leaves]
    got = torch.autograd.grad(tk.rope(*leaves, cos, sin), leaves, grads)
    assert [g.dtype for g in got] == [x_dtype, x_dtype]
    assert_pair_close(got, rotary_gradients(*[g.double() for g in grads], cos.double(), sin.double()), x_dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16])
def test_under_autocast_the_inputs_come_as_they_are(device, autocast_dtype):
    """Autocast casts nothing for HF's formula (mul and add are on none of its lists; cat is on the
    promote list, and its two inputs share q's dtype): nor for tk.rope."""
    if device == "cpu" and autocast_dtype == torch.float16:
        pytest.skip("torch 2.13's CPU autocast to float16 fails in HF's own cat (at::autocast::prioritize)")
    q, k = qk(2, 3, 2, 2, 16, dtype=torch.bfloat16, device=device)
    for table_dtype in (torch.float32, torch.bfloat16):
        cos, sin = rotary_tables(3, 16, table_dtype, device)
        with torch.autocast(device, dtype=autocast_dtype):
            got, want = tk.rope(q, k, cos, sin), apply_rotary_pos_emb(q, k, cos, sin)
        assert [t.dtype for t in got] == [t.dtype for t in want]
        assert_pair_close(got, exact(q, k, cos, sin), want[0].dtype)


# ----------------------------------------------------------------- the backward


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_backward_matches_pytorch(device, dtype):
    """Gradients of q and k against autograd through HF's formula in float64, both layouts."""
    configs = pick(device, [(2, 3, 4, 2, 80, 80, 1), (1, 3, 2, 1, 64, 32, 2)],
                   [(4, 2047, 32, 8, 128, 128, 1), (2, 2047, 32, 32, 80, 32, 2)])  # fmt: skip
    for batch, seq, q_heads, k_heads, head_dim, rotary, unsqueeze_dim in configs:
        q, k = qk(batch, seq, q_heads, k_heads, head_dim, dtype=dtype, device=device, rotary=rotary,
                  heads_dim=unsqueeze_dim)  # fmt: skip
        cos, sin = random_tables(1, seq, rotary, dtype=dtype, device=device)
        grads = [torch.randn(t.shape, device=device).to(dtype) for t in (q, k)]
        leaves = [t.detach().requires_grad_() for t in (q, k)]
        got = torch.autograd.grad(tk.rope(*leaves, cos, sin, unsqueeze_dim), leaves, grads)
        leaves64 = [leaf64(t) for t in (q, k)]
        out64 = apply_rotary_pos_emb(*leaves64, cos.double(), sin.double(), unsqueeze_dim)
        want = torch.autograd.grad(out64, leaves64, [g.double() for g in grads])
        assert [g.dtype for g in got] == [dtype, dtype]
        assert_pair_close(got, want, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_rope_backward_op_with_halves_that_differ(device):
    """tk.rope_backward on its own: dx1 = dy1 c1 + dy2 s2, dx2 = dy2 c2 - dy1 s1, in input_dtype."""
    grad_q, grad_k = qk(2, 3, 3, 1, 20, dtype=torch.float64, device=device)
    cos, sin = random_tables(2, 3, 20, dtype=torch.float64, device=device)
    c1, c2, s1, s2 = (*cos.unsqueeze(1).chunk(2, -1), *sin.unsqueeze(1).chunk(2, -1))
    dq, dk = tk.rope_backward(grad_q, grad_k, cos, sin)
    for got, dy in ((dq, grad_q), (dk, grad_k)):
        dy1, dy2 = dy.chunk(2, -1)
        assert_close(got, torch.cat((dy1 * c1 + dy2 * s2, dy2 * c2 - dy1 * s1), -1), torch.float64)
    dq, dk = tk.rope_backward(grad_q.float(), grad_k.float(), cos.float(), sin.float(), 1, torch.bfloat16)
    assert dq.dtype == dk.dtype == torch.bfloat16
    assert_close(dq, rotary_gradients(grad_q, grad_k, cos, sin)[0], torch.bfloat16)


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_rope_gradcheck(unsqueeze_dim):
    q, k = (leaf64(t) for t in qk(1, 2, 2, 1, 6, dtype=torch.float64, heads_dim=unsqueeze_dim))
    cos, sin = random_tables(1, 2, 6, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, b: tk.rope(a, b, cos, sin, unsqueeze_dim), (q, k), fast_mode=True)


@pytest.mark.parametrize("device", DEVICES)
def test_only_the_inputs_that_need_a_gradient_get_one(device):
    q, k = qk(1, 3, 2, 1, 8, device=device)
    cos, sin = random_tables(1, 3, 8, device=device)
    q.requires_grad_()
    q_embed, _ = tk.rope(q, k, cos, sin)
    q_embed.sum().backward()  # the gradient of a sum: expanded, its last dim of stride 0 (copied once)
    assert k.grad is None
    want = rotary_gradients(torch.ones_like(q, dtype=torch.float64), torch.zeros_like(k, dtype=torch.float64),
                            cos.double(), sin.double())[0]  # fmt: skip
    assert_close(q.grad, want, torch.float32)


@pytest.mark.parametrize("name", ["cos", "sin"])
def test_cos_or_sin_that_requires_grad_is_refused(name):
    q, k = qk(1, 3, 2, 1, 8)
    tables = dict(zip(("cos", "sin"), random_tables(1, 3, 8)))
    tables[name].requires_grad_()
    for needs_q in (False, True):
        q.requires_grad_(needs_q)
        with pytest.raises(ValueError, match=rf"tk\.rope: {name} requires grad, but rope gives cos and sin no"):
            tk.rope(q, k, tables["cos"], tables["sin"])
    with torch.no_grad():  # HF computes them under no_grad: fine
        cos, sin = tables["cos"], tables["sin"]
        assert_pair_close(tk.rope(q, k, cos, sin), exact(q, k, cos, sin), torch.float32)


# ----------------------------------------------------------------- PyTorch's view of the op


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    q, k = qk(1, 3, 2, 1, 8, device=device)
    cos, sin = rotary_tables(3, 8, torch.float32, device)
    cases = [
        (tk.rope.default, (q, k, cos, sin)),
        (tk.rope.default, (q.detach().requires_grad_(), k.detach().requires_grad_(), cos, sin, 1)),
        (tk.rope.default, (q.transpose(1, 2).to(torch.bfloat16), k.transpose(1, 2).to(torch.bfloat16), cos, sin, 2)),
        (tk.rope_backward.default, (q, k, cos, sin, 1, torch.bfloat16)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)


def _attention_scores(rope):
    def scores(q, k, cos, sin):
        q, k = rope(q, k, cos, sin)
        return torch.softmax(q @ k.transpose(-1, -2), -1)

    return scores


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_rope_matches_eager(device):
    torch._dynamo.reset()
    q, k = qk(2, 5, 2, 2, 16, device=device)
    cos, sin = rotary_tables(5, 16, torch.float32, device)
    compiled = torch.compile(_attention_scores(tk.rope), fullgraph=True)  # fullgraph: any graph break is an error
    leaves = [t.detach().requires_grad_() for t in (q, k)]
    out = compiled(*leaves, cos, sin)
    torch.testing.assert_close(out, _attention_scores(tk.rope)(q, k, cos, sin), rtol=1e-5, atol=1e-6)
    weight = torch.randn_like(out)
    got = torch.autograd.grad(out, leaves, weight)
    leaves64 = [leaf64(t) for t in (q, k)]
    out64 = _attention_scores(apply_rotary_pos_emb)(*leaves64, cos.double(), sin.double())
    assert_close(out, out64, torch.float32)
    for g, w in zip(got, torch.autograd.grad(out64, leaves64, weight.double())):
        assert_close(g, w, torch.float32, scale=10)


def test_compiled_with_dynamic_shapes():
    """dynamic=True: the sequence length is symbolic while tracing; head_dim becomes a constant."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, c, s: tk.rope(q, k, c, s), fullgraph=True, dynamic=True)
    for seq in (3, 5, 6):
        q, k = qk(1, seq, 2, 1, 8)
        cos, sin = rotary_tables(seq, 8, torch.float32, "cpu")
        assert_pair_close(compiled(q, k, cos, sin), exact(q, k, cos, sin), torch.float32)


def test_compiled_cpu_graph_calls_the_interpreted_op():
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    q, k = qk(1, 3, 2, 1, 8)
    cos, sin = rotary_tables(3, 8, torch.float32, "cpu")
    _, code = run_and_get_code(torch.compile(_attention_scores(tk.rope), fullgraph=True), q, k, cos, sin)
    assert "tk.rope_cpu" in "\n".join(code)


@pytest.mark.gpu
def test_compiled_cuda_graph_contains_the_hand_written_kernel():
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    q, k = qk(2, 129, 8, 1, 64, device="cuda")
    cos, sin = rotary_tables(129, 64, torch.float32, "cuda")
    _, code = run_and_get_code(torch.compile(_attention_scores(tk.rope), fullgraph=True), q, k, cos, sin)
    source = "\n".join(code)
    assert "rope_forward_kernel" in source and "tk.rope_cpu" not in source


# ----------------------------------------------------------------- the launch


class Launches:
    """Stands in for ops.rope's `launcher`: records each launch (kernel, grid, args, kwargs), runs nothing."""

    def __init__(self):
        self.calls = []

    def __call__(self, kernel, like):
        calls = self.calls

        class Grid:
            def __getitem__(self, grid):
                return lambda *args, **kwargs: calls.append((kernel, grid, args, kwargs))

        return Grid()


@pytest.mark.parametrize(
    ("shape", "dtype", "constants"),
    [  # (batch, seq, q heads, kv heads, head_dim, rotary), dtype -> HALF, BLOCK_HALF, BLOCK_Q_HEADS, BLOCK_K_HEADS, warps
        ((1, 2047, 32, 8, 128, 128), torch.bfloat16, (64, 64, 32, 8, 8)),  # Llama-3-8B: every head in one tile
        ((1, 2047, 32, 8, 128, 128), torch.float32, (64, 64, 32, 8, 8)),  # 16 warps by 16 bytes a thread: capped
        ((1, 999, 28, 4, 128, 128), torch.bfloat16, (64, 64, 32, 4, 8)),  # Qwen2: 28 heads in a tile of 32
        ((1, 999, 16, 16, 256, 256), torch.bfloat16, (128, 128, 16, 16, 8)),  # Gemma
        ((1, 999, 32, 32, 80, 32), torch.bfloat16, (16, 16, 32, 32, 2)),  # Phi: 32 of 80 dims
        ((1, 999, 8, 8, 80, 80), torch.bfloat16, (40, 64, 8, 8, 2)),  # a half of 40 in 64 lanes
        ((1, 9, 128, 128, 128, 128), torch.float32, (64, 64, 64, 64, 8)),  # past the tile: two tiles of 64 heads
    ],
)
def test_the_block_rule(monkeypatch, shape, dtype, constants):
    """One program per (batch, position); the constants of ops/rope.py's block rule; HF's transposed
    views (and cos of a batch of one) reach the kernel where they lie, not copied."""
    batch, seq, q_heads, k_heads, head_dim, rotary = shape
    q, k = qk(batch, seq, q_heads, k_heads, head_dim, dtype=dtype, rotary=rotary)
    cos, sin = rotary_tables(seq, rotary, dtype, "cpu")
    launches = Launches()
    monkeypatch.setattr(rope_ops, "launcher", launches)
    q_embed, k_embed = tk.rope(q, k, cos, sin)
    (kernel, grid, args, kwargs), = launches.calls  # fmt: skip
    assert kernel is rope_ops.rope_forward_kernel and grid == (batch * seq,)
    names = ("HALF", "BLOCK_HALF", "BLOCK_Q_HEADS", "BLOCK_K_HEADS", "num_warps")
    assert tuple(kwargs[name] for name in names) == constants
    q_view, k_view, cos_view, _, q_out, k_out = args[:6]
    assert (q_view.data_ptr(), k_view.data_ptr(), cos_view.data_ptr()) == (q.data_ptr(), k.data_ptr(), cos.data_ptr())
    assert q_view.shape == (batch, seq, q_heads, rotary) and cos_view.shape == (batch, seq, rotary)
    assert (q_out.data_ptr(), k_out.data_ptr()) == (q_embed.data_ptr(), k_embed.data_ptr())
    assert kwargs["WIDE"] is False


def test_the_backward_launches_its_own_kernel(monkeypatch):
    q, k = qk(2, 5, 4, 2, 16)
    cos, sin = rotary_tables(5, 16, torch.float32, "cpu")
    launches = Launches()
    monkeypatch.setattr(rope_ops, "launcher", launches)
    tk.rope_backward(q, k, cos, sin, 1, torch.float64)
    (kernel, grid, args, kwargs), = launches.calls  # fmt: skip
    assert kernel is rope_ops.rope_backward_kernel and grid == (10,) and kwargs["WIDE"] is True  # a float64 result
    assert args[2].shape == (2, 5, 16) and args[2].stride(0) == 0  # cos of a batch of one: broadcast, stride 0


# ----------------------------------------------------------------- errors


def _t(*shape, dtype=torch.float32, device="cpu"):
    return torch.randn(shape, device=device).to(dtype)


_Q, _K, _COS = (1, 2, 3, 8), (1, 1, 3, 8), (1, 3, 8)

ERROR_CASES = [
    ("q int", lambda: tk.rope(_t(*_Q, dtype=torch.int32), _t(*_K), _t(*_COS), _t(*_COS)), TypeError,
     r"tk\.rope: q has dtype int32; supported: float32, float16, bfloat16, float64"),
    ("cos bool", lambda: tk.rope(_t(*_Q), _t(*_K), _t(*_COS, dtype=torch.bool), _t(*_COS)), TypeError,
     r"tk\.rope: cos has dtype bool"),
    ("q and k dtypes", lambda: tk.rope(_t(*_Q), _t(*_K, dtype=torch.float16), _t(*_COS), _t(*_COS)), TypeError,
     r"tk\.rope: q has dtype torch\.float32 but k has dtype torch\.float16"),
    ("cos and sin dtypes", lambda: tk.rope(_t(*_Q), _t(*_K), _t(*_COS), _t(*_COS, dtype=torch.bfloat16)), TypeError,
     r"tk\.rope: cos has dtype torch\.float32 but sin has dtype torch\.bfloat16"),
    ("k on meta", lambda: tk.rope(_t(*_Q), _t(*_K, device="meta"), _t(*_COS), _t(*_COS)), ValueError,
     r"tk\.rope: q is on cpu but k is on meta"),
    ("cos on meta", lambda: tk.rope(_t(*_Q), _t(*_K), _t(*_COS, device="meta"), _t(*_COS, device="meta")), ValueError,
     r"tk\.rope: q is on cpu but cos is on meta"),
    ("q 3-D", lambda: tk.rope(_t(2, 3, 8), _t(*_K), _t(*_COS), _t(*_COS)), ValueError,
     r"tk\.rope: q must be 4-D, got a 3-D tensor of shape \(2, 3, 8\)"),
    ("cos 2-D", lambda: tk.rope(_t(*_Q), _t(*_K), _t(3, 8), _t(3, 8)), ValueError,
     r"tk\.rope: cos must be 3-D, got a 2-D tensor of shape \(3, 8\)"),
    ("head_dim odd", lambda: tk.rope(_t(1, 2, 3, 7), _t(1, 1, 3, 7), _t(1, 3, 7), _t(1, 3, 7)), ValueError,
     r"tk\.rope: head_dim must be even \(rotate_half splits it in two\), got 7"),
    ("unsqueeze_dim 0", lambda: tk.rope(_t(*_Q), _t(*_K), _t(*_COS), _t(*_COS), 0), ValueError,
     r"tk\.rope: unsqueeze_dim must be 1 \(q and k as \(batch, heads, seq, head_dim\)\) or 2 .*got 0"),
    ("unsqueeze_dim -1", lambda: tk.rope(_t(*_Q), _t(*_K), _t(*_COS), _t(*_COS), -1), ValueError,
     r"tk\.rope: unsqueeze_dim must be 1 .* got -1"),
    ("q and k seq", lambda: tk.rope(_t(*_Q), _t(1, 1, 4, 8), _t(*_COS), _t(*_COS)), ValueError,
     (r"tk\.rope: q has shape \(1, 2, 3, 8\) and k has shape \(1, 1, 4, 8\): as \(batch, heads, seq, head_dim\) "
      r"\(unsqueeze_dim=1\) they must agree on batch, seq and head_dim \(only their heads may differ\)")),
    ("q and k head_dim", lambda: tk.rope(_t(*_Q), _t(1, 1, 3, 6), _t(*_COS), _t(*_COS)), ValueError,
     r"they must agree on batch, seq and head_dim"),
    ("cos batch", lambda: tk.rope(_t(2, 2, 3, 8), _t(2, 1, 3, 8), _t(3, 3, 8), _t(3, 3, 8)), ValueError,
     (r"tk\.rope: cos and sin have shape \(3, 3, 8\), which does not broadcast against q of shape \(2, 2, 3, 8\) "
      r"as \(batch, heads, seq, head_dim\): expected \(2 or 1, 3 or 1, 8\)")),
    ("cos seq", lambda: tk.rope(_t(*_Q), _t(*_K), _t(1, 4, 8), _t(1, 4, 8)), ValueError,
     r"cos and sin have shape \(1, 4, 8\), which does not broadcast"),
    ("cos head_dim", lambda: tk.rope(_t(*_Q), _t(*_K), _t(1, 3, 4), _t(1, 3, 4)), ValueError,
     r"cos and sin have shape \(1, 3, 4\), .*: expected \(1, 3 or 1, 8\)"),
    ("q and k seq, unsqueeze_dim=2", lambda: tk.rope(_t(*_Q), _t(*_K), _t(1, 3, 8), _t(1, 3, 8), 2), ValueError,
     r"q has shape \(1, 2, 3, 8\) and k has shape \(1, 1, 3, 8\): as \(batch, seq, heads, head_dim\)"),
    ("cos and sin shapes", lambda: tk.rope(_t(*_Q), _t(*_K), _t(1, 3, 8), _t(2, 3, 8)), ValueError,
     r"tk\.rope: cos has shape \(1, 3, 8\) but sin has \(2, 3, 8\)"),
    ("backward input_dtype", lambda: tk.rope_backward(_t(*_Q), _t(*_K), _t(*_COS), _t(*_COS), 1, torch.int64),
     TypeError, r"tk\.rope_backward: input_dtype int64 is not a floating dtype"),
    ("backward grad_k rank", lambda: tk.rope_backward(_t(*_Q), _t(1, 3, 8), _t(*_COS), _t(*_COS)), ValueError,
     r"tk\.rope_backward: grad_k must be 4-D"),
    ("backward shapes", lambda: tk.rope_backward(_t(*_Q), _t(2, 1, 3, 8), _t(*_COS), _t(*_COS)), ValueError,
     r"tk\.rope_backward: grad_q has shape \(1, 2, 3, 8\) and grad_k has shape \(2, 1, 3, 8\)"),
    ("a list for q", lambda: tk.rope([1.0], _t(*_K), _t(*_COS), _t(*_COS)), RuntimeError,
     r"Expected a value of type 'Tensor' for argument 'q'"),
]  # fmt: skip


@error_cases(ERROR_CASES)
def test_bad_input_raises_a_clear_error(case):
    assert_raises_clearly(case)


@pytest.mark.gpu
def test_positions_past_the_cuda_grid():
    """A program a position: 2**31 positions (stride-0 views, no memory) are refused, not launched."""
    q = _t(1, 1, 1, 2, device="cuda").expand(2**16, 1, 2**15, 2)
    cos = _t(1, 1, 2, device="cuda").expand(1, 2**15, 2)
    with pytest.raises(ValueError, match=r"tk\.rope: 65536 x 32768 positions: more than a CUDA grid holds"):
        tk.rope(q, q, cos, cos)


@pytest.mark.gpu
def test_arguments_on_the_cpu_and_the_gpu():
    with pytest.raises(ValueError, match=r"tk\.rope: q is on cuda:0 but cos is on cpu"):
        tk.rope(_t(*_Q, device="cuda"), _t(*_K, device="cuda"), _t(*_COS), _t(*_COS))


# ----------------------------------------------------------------- the harness's specs


@pytest.mark.parametrize("name", ["rope", "rope_backward"])
def test_the_specs_run_and_count_each_byte_once(name):
    spec = ops.get_spec(name)
    assert set(spec.tolerance) >= set(spec.dtypes) and spec.shapes["cpu"] and spec.shapes["cuda"]
    for shape in spec.shapes["cpu"]:
        for dtype in (torch.float32, torch.bfloat16):
            inputs = spec.make_inputs(shape, dtype, torch.device("cpu"))
            out = spec.tk(*inputs)
            want = spec.reference(*[t.double() for t in inputs])
            assert max(rel_error(o, w) for o, w in zip(out, want, strict=True)) <= spec.tolerance[dtype]
            moved = sum(t.numel() * t.element_size() for t in (*inputs, *out))  # each read or written once
            assert spec.bytes_moved(shape, dtype) == moved
    q, k, cos, _ = spec.make_inputs((2, 5, 4, 2, 16, 8), torch.float32, torch.device("cpu"))
    assert q.shape == (2, 4, 5, 8) and q.stride() == (5 * 4 * 16, 16, 4 * 16, 1)  # HF's view of a projection, cut
    assert k.shape == (2, 2, 5, 8) and cos.shape == (1, 5, 8)
    assert spec.describe((4, 2047, 32, 32, 80, 32)) == "4x2047 h32/32 r32/d80"


def test_the_specs_model_shapes_are_real_ones():
    shapes = ops.get_spec("rope").shapes["cuda"]
    for model in [(32, 8, 128, 128), (16, 8, 128, 128), (28, 4, 128, 128), (16, 16, 256, 256), (32, 32, 80, 32)]:
        assert any(s[2:] == model for s in shapes), model
    assert all((s[0] * s[1]) % 128 for s in shapes)  # token counts that are not multiples of 128


# ----------------------------------------------------------------- GPU only


@pytest.mark.gpu
@pytest.mark.big_memory
def test_offsets_past_2_to_the_31_elements():
    """q of 2**31 + 2**15 elements: the rows of the last positions sit past 2**31 (int64 offsets)."""
    batch, seq, heads, dim = 8, 65537, 32, 128
    q = torch.randn(batch, seq, heads, dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(batch, seq, 1, dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    cos, sin = rotary_tables(seq, dim, torch.bfloat16, "cuda")
    q_embed, k_embed = tk.rope(q, k, cos, sin)
    for b, positions in [(0, slice(0, 64)), (batch - 1, slice(seq - 64, seq))]:
        window = [t[b : b + 1, :, positions] for t in (q, k)]
        want = exact(*window, cos[:, positions], sin[:, positions])
        assert_pair_close([q_embed[b : b + 1, :, positions], k_embed[b : b + 1, :, positions]], want, torch.bfloat16)
    del q, k, q_embed, k_embed
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


@pytest.mark.gpu
def test_rope_is_deterministic_and_leaves_its_inputs_alone():
    q, k = qk(4, 2047, 32, 8, 128, dtype=torch.bfloat16, device="cuda")
    cos, sin = rotary_tables(2047, 128, torch.bfloat16, "cuda")
    before = [t.clone() for t in (q, k, cos, sin)]
    first, again = tk.rope(q, k, cos, sin), tk.rope(q, k, cos, sin)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert all(torch.equal(a, b) for a, b in zip((q, k, cos, sin), before))
    assert TOLERANCE[torch.bfloat16] >= rel_error(first[0], exact(q, k, cos, sin)[0])
