"""Rotary position embedding (RoPE) of the queries and keys, forward and backward, as HuggingFace applies it.

    rotate_half(x) = cat(-x2, x1)                 x1, x2: the two halves of x's last dim
    q_embed = q * cos + rotate_half(q) * sin      (and k_embed from k, with the same cos and sin)

which is transformers' ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)``
(models/llama/modeling_llama.py).  Written per half, with c1, c2 and s1, s2
the two halves of cos and sin at a position:

    y1 = x1 * c1 - x2 * s1
    y2 = x2 * c2 + x1 * s2

and its gradient (the transpose of that linear map of x):

    dx1 = dy1 * c1 + dy2 * s2
    dx2 = dy2 * c2 - dy1 * s1

HF's rotary embedding makes the two halves of cos (and of sin) equal; the
kernels do not assume it, so any cos and sin give PyTorch's answer.

Shapes.  cos and sin are (batch, seq, head_dim), as HF's rotary embedding
returns them; a batch or a sequence of one broadcasts, as in PyTorch (HF's
position_ids are usually (1, seq), so cos comes with a batch of one), and so
do expanded (stride 0) views.  ``unsqueeze_dim`` says where q and k keep their
heads: 1 for (batch, heads, seq, head_dim), 2 for (batch, seq, heads,
head_dim).  q and k may have different head counts (grouped-query attention)
and must agree on everything else.  head_dim must be even; any even one
works, a half that is not a power of two (40, 48) included, and so does
partial rotary (Phi rotates a leading slice of each head: q[..., :rotary_dim]
is a view whose last dim is rotary_dim).

The kernel.  One program per (batch, position): it loads that position's
cos and sin once, then rotates every q head and every k head there, a tile
of heads at a time, both halves of each head side by side.  Any strides of
q and k work as long as their last dim is contiguous: HF hands over
``q_proj(x).view(b, s, h, d).transpose(1, 2)``, a view that is read where it
lies, and there a position's heads are one contiguous span.  The outputs
take q's and k's layout (``torch.empty_like``: a dense input's strides, else
the standard ones).  Math in float32 (float64 when a float64 tensor is
involved), offsets in int64.  docs/ops/rope.md has the block rule and the
bytes a call moves.

dtypes: PyTorch's formula is plain arithmetic, so its result has the
promoted dtype of q (or k) and cos: a bfloat16 q with a float32 cos gives a
float32 q_embed (under torch.autocast, HF's rotary embedding returns cos and
sin in the dtype of the hidden states, float32 for a float32 model, while
the projections come in bfloat16).  tk gives the same dtype, reading q as it
is (no float32 copy); the gradients come back in q's and k's own dtype.
q and k must share a dtype, and so must cos and sin.  Autocast casts nothing
in HF's formula (mul and add are on none of its lists; cat is on the
"promote" list, and its two inputs are halves of one tensor), so tk.rope
registers no autocast policy: under autocast it runs on its inputs as they
come, as HF's formula does.

cos and sin get no gradient (HF computes them under no_grad): a cos or sin
that requires one is refused with an error naming it.
"""

import torch
import triton
import triton.language as tl

from .blocks.sizes import next_power_of_2, rows_in_tile, warps_for
from .runtime import check_same, check_tensor, launcher, promoted_float, register_op, result_dtype, run_direct
from .spec import ROUNDING_TOLERANCE, OpSpec, element_size, register_spec

# The block rule (not yet measured on a GPU).  A program's tile is BLOCK_HEADS heads
# by BLOCK_HALF columns of each half: BLOCK_HALF the half-dim rounded up to a power
# of two, and as many heads as fill about HEAD_TILE elements a half, a power of two
# too, no more than there are.  4096 holds every head of the models in the spec in one
# tile (Llama-3-8B 32 x 64, Gemma 16 x 128).  The warps give each thread 16 bytes of
# each half (one vector load), at most MAX_WARPS: a program has thousands of siblings
# (one per position) to fill the GPU.
HEAD_TILE = 4096
MAX_WARPS = 8
# Where q and k each fit one tile, the loads-first form issues k's loads before q's stores.
# The compiler cannot move a load above a store that may alias it: in the SASS for sm_90 of
# the q-then-k form at Llama-3-8B's heads (32 q, 8 kv, bf16), k's loads and stores come as
# 8 load-load-store-store groups after q's stores, each waiting on memory; the loads-first
# form has all 12 loads before its 4 stores, at 48 registers against 64 (perf-notes version
# 46).  Measured on an H100 (version 47, bf16, 4x2047): 32/8 heads d128 forward 87% -> 94% of
# copy (1.09x compile), backward 86% -> 94%; 16/16 d256 and 32/32 d80 equal or better.  The
# harness times the q-then-k form beside it as tk-q-then-k.
LOADS_FIRST = True


# --------------------------------------------------------------------------
# The kernels.
# --------------------------------------------------------------------------


@triton.jit
def _widen(x, WIDE: tl.constexpr):
    """x in the compute dtype: float64 if the call involves a float64 tensor, else float32."""
    if WIDE:
        x = x.to(tl.float64)
    else:
        x = x.to(tl.float32)
    return x


@triton.jit
def _position(seq_len):
    """This program's (batch, position), in int64: offsets past 2**31 stay exact."""
    pid = tl.program_id(0).to(tl.int64)
    return pid // seq_len, pid % seq_len


@triton.jit
def _halves(row_ptr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, WIDE: tl.constexpr):
    """The two halves of one row of cos or sin, widened."""
    cols = tl.arange(0, BLOCK_HALF)
    mask = cols < HALF
    first = _widen(tl.load(row_ptr + cols, mask=mask, other=0.0), WIDE)
    second = _widen(tl.load(row_ptr + HALF + cols, mask=mask, other=0.0), WIDE)
    return first, second


@triton.jit
def _head_tile(stride_h, first_head, n_heads, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_HEADS: tl.constexpr):
    """(offsets, mask) of the first halves of BLOCK_HEADS heads from first_head, heads stride_h apart.
    Offsets only, no pointer: a store's address built from a helper that took an input's pointer counts
    as a write of that input in PyTorch's analysis for torch.compile (tests/runtime/test_compiled_writes.py)."""
    cols = tl.arange(0, BLOCK_HALF)
    h = (first_head + tl.arange(0, BLOCK_HEADS)).to(tl.int64)
    return h[:, None] * stride_h + cols[None, :], (h < n_heads)[:, None] & (cols < HALF)[None, :]


@triton.jit
def _load_halves(x_ptr, offsets, mask, HALF: tl.constexpr, WIDE: tl.constexpr):
    """The two halves of a tile of heads, widened."""
    x1 = _widen(tl.load(x_ptr + offsets, mask=mask, other=0.0), WIDE)
    x2 = _widen(tl.load(x_ptr + offsets + HALF, mask=mask, other=0.0), WIDE)
    return x1, x2


@triton.jit
def _store_rotated(out_ptr, offsets, mask, x1, x2, c1, c2, u, v, HALF: tl.constexpr):
    """out1 = x1 * c1 + x2 * u, out2 = x2 * c2 + x1 * v.  The forward passes (u, v) = (-s1, s2),
    the backward (s2, -s1)."""
    out_ty = out_ptr.dtype.element_ty
    tl.store(out_ptr + offsets, (x1 * c1[None, :] + x2 * u[None, :]).to(out_ty), mask=mask)
    tl.store(out_ptr + offsets + HALF, (x2 * c2[None, :] + x1 * v[None, :]).to(out_ty), mask=mask)


@triton.jit
def _rotate_heads(
    x_ptr, x_stride_h, out_ptr, out_stride_h, n_heads, c1, c2, u, v,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_HEADS: tl.constexpr, WIDE: tl.constexpr,
):  # fmt: skip
    """Every head at one position, a tile at a time.  x_ptr, out_ptr: the position's first head;
    heads x_stride_h (out_stride_h) apart, each head's elements contiguous."""
    for first_head in range(0, n_heads, BLOCK_HEADS):
        x_offsets, mask = _head_tile(x_stride_h, first_head, n_heads, HALF, BLOCK_HALF, BLOCK_HEADS)
        out_offsets, _ = _head_tile(out_stride_h, first_head, n_heads, HALF, BLOCK_HALF, BLOCK_HEADS)
        x1, x2 = _load_halves(x_ptr, x_offsets, mask, HALF, WIDE)
        _store_rotated(out_ptr, out_offsets, mask, x1, x2, c1, c2, u, v, HALF)


@triton.jit
def _rotate_q_and_k(
    q_ptr, q_stride_h, q_out_ptr, q_out_stride_h, n_q_heads,
    k_ptr, k_stride_h, k_out_ptr, k_out_stride_h, n_k_heads, c1, c2, u, v,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_Q_HEADS: tl.constexpr, BLOCK_K_HEADS: tl.constexpr,
    WIDE: tl.constexpr, LOADS_FIRST: tl.constexpr,
):  # fmt: skip
    """q's heads and k's at one position.  LOADS_FIRST (q and k each one tile): both loaded, then both
    stored; otherwise q's tiles, then k's (see LOADS_FIRST in the module)."""
    if LOADS_FIRST:
        q_offsets, q_mask = _head_tile(q_stride_h, 0, n_q_heads, HALF, BLOCK_HALF, BLOCK_Q_HEADS)
        k_offsets, k_mask = _head_tile(k_stride_h, 0, n_k_heads, HALF, BLOCK_HALF, BLOCK_K_HEADS)
        q1, q2 = _load_halves(q_ptr, q_offsets, q_mask, HALF, WIDE)
        k1, k2 = _load_halves(k_ptr, k_offsets, k_mask, HALF, WIDE)
        q_out_offsets, _ = _head_tile(q_out_stride_h, 0, n_q_heads, HALF, BLOCK_HALF, BLOCK_Q_HEADS)
        k_out_offsets, _ = _head_tile(k_out_stride_h, 0, n_k_heads, HALF, BLOCK_HALF, BLOCK_K_HEADS)
        _store_rotated(q_out_ptr, q_out_offsets, q_mask, q1, q2, c1, c2, u, v, HALF)
        _store_rotated(k_out_ptr, k_out_offsets, k_mask, k1, k2, c1, c2, u, v, HALF)
    else:
        _rotate_heads(q_ptr, q_stride_h, q_out_ptr, q_out_stride_h, n_q_heads, c1, c2, u, v,
                      HALF, BLOCK_HALF, BLOCK_Q_HEADS, WIDE)  # fmt: skip
        _rotate_heads(k_ptr, k_stride_h, k_out_ptr, k_out_stride_h, n_k_heads, c1, c2, u, v,
                      HALF, BLOCK_HALF, BLOCK_K_HEADS, WIDE)  # fmt: skip


@triton.jit
def rope_forward_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr,
    seq_len, n_q_heads, n_k_heads,
    q_stride_b, q_stride_s, q_stride_h, k_stride_b, k_stride_s, k_stride_h,
    q_out_stride_b, q_out_stride_s, q_out_stride_h, k_out_stride_b, k_out_stride_s, k_out_stride_h,
    cos_stride_b, cos_stride_s, sin_stride_b, sin_stride_s,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_Q_HEADS: tl.constexpr, BLOCK_K_HEADS: tl.constexpr,
    WIDE: tl.constexpr, LOADS_FIRST: tl.constexpr,
):  # fmt: skip
    """q_embed and k_embed at one (batch, position): every tensor seen as (batch, seq, heads, head_dim),
    cos and sin as (batch, seq, head_dim), broadcast dims with stride 0."""
    b, s = _position(seq_len)
    c1, c2 = _halves(cos_ptr + b * cos_stride_b + s * cos_stride_s, HALF, BLOCK_HALF, WIDE)
    s1, s2 = _halves(sin_ptr + b * sin_stride_b + s * sin_stride_s, HALF, BLOCK_HALF, WIDE)
    _rotate_q_and_k(
        q_ptr + b * q_stride_b + s * q_stride_s, q_stride_h,
        q_out_ptr + b * q_out_stride_b + s * q_out_stride_s, q_out_stride_h, n_q_heads,
        k_ptr + b * k_stride_b + s * k_stride_s, k_stride_h,
        k_out_ptr + b * k_out_stride_b + s * k_out_stride_s, k_out_stride_h, n_k_heads,
        c1, c2, -s1, s2, HALF, BLOCK_HALF, BLOCK_Q_HEADS, BLOCK_K_HEADS, WIDE, LOADS_FIRST,
    )  # fmt: skip


@triton.jit
def rope_backward_kernel(
    dq_ptr, dk_ptr, cos_ptr, sin_ptr, dq_out_ptr, dk_out_ptr,
    seq_len, n_q_heads, n_k_heads,
    dq_stride_b, dq_stride_s, dq_stride_h, dk_stride_b, dk_stride_s, dk_stride_h,
    dq_out_stride_b, dq_out_stride_s, dq_out_stride_h, dk_out_stride_b, dk_out_stride_s, dk_out_stride_h,
    cos_stride_b, cos_stride_s, sin_stride_b, sin_stride_s,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_Q_HEADS: tl.constexpr, BLOCK_K_HEADS: tl.constexpr,
    WIDE: tl.constexpr, LOADS_FIRST: tl.constexpr,
):  # fmt: skip
    """The gradients of q and k at one (batch, position) from those of q_embed and k_embed
    (dq_ptr, dk_ptr): the forward's layout, with the transposed rotation, (u, v) = (s2, -s1)."""
    b, s = _position(seq_len)
    c1, c2 = _halves(cos_ptr + b * cos_stride_b + s * cos_stride_s, HALF, BLOCK_HALF, WIDE)
    s1, s2 = _halves(sin_ptr + b * sin_stride_b + s * sin_stride_s, HALF, BLOCK_HALF, WIDE)
    _rotate_q_and_k(
        dq_ptr + b * dq_stride_b + s * dq_stride_s, dq_stride_h,
        dq_out_ptr + b * dq_out_stride_b + s * dq_out_stride_s, dq_out_stride_h, n_q_heads,
        dk_ptr + b * dk_stride_b + s * dk_stride_s, dk_stride_h,
        dk_out_ptr + b * dk_out_stride_b + s * dk_out_stride_s, dk_out_stride_h, n_k_heads,
        c1, c2, s2, -s1, HALF, BLOCK_HALF, BLOCK_Q_HEADS, BLOCK_K_HEADS, WIDE, LOADS_FIRST,
    )  # fmt: skip


# --------------------------------------------------------------------------
# Argument checks.
# --------------------------------------------------------------------------


def _positions_first(t: torch.Tensor, unsqueeze_dim: int) -> torch.Tensor:
    """A q- or k-shaped tensor as a (batch, seq, heads, head_dim) view."""
    return t.transpose(1, 2) if unsqueeze_dim == 1 else t


def _check_inputs(op: str, names: tuple[str, str], q, k, cos, sin, unsqueeze_dim: int) -> None:
    """q and k (names: theirs in `op`'s signature) 4-D, of one dtype; cos and sin 3-D, of one dtype,
    broadcasting to q's (batch, seq) with q's head_dim; all on one device."""
    q_name, k_name = names
    for name, t in ((q_name, q), (k_name, k)):
        check_tensor(op, name, t, ndims=(4,))
    for name, t in (("cos", cos), ("sin", sin)):
        check_tensor(op, name, t, ndims=(3,))
    check_same(op, {q_name: q, k_name: k})
    check_same(op, {"cos": cos, "sin": sin})
    if cos.device != q.device:
        raise ValueError(f"tk.{op}: {q_name} is on {q.device} but cos is on {cos.device}")
    if unsqueeze_dim not in (1, 2):
        raise ValueError(
            f"tk.{op}: unsqueeze_dim must be 1 (q and k as (batch, heads, seq, head_dim)) or 2 "
            f"((batch, seq, heads, head_dim)), got {unsqueeze_dim}"
        )
    layout = "(batch, heads, seq, head_dim)" if unsqueeze_dim == 1 else "(batch, seq, heads, head_dim)"
    q_view, k_view = _positions_first(q, unsqueeze_dim), _positions_first(k, unsqueeze_dim)
    batch, seq, _, head_dim = q_view.shape
    if (k_view.shape[0], k_view.shape[1], k_view.shape[3]) != (batch, seq, head_dim):
        raise ValueError(
            f"tk.{op}: {q_name} has shape {tuple(q.shape)} and {k_name} has shape {tuple(k.shape)}: as {layout} "
            f"(unsqueeze_dim={unsqueeze_dim}) they must agree on batch, seq and head_dim (only their heads may differ)"
        )
    if head_dim % 2:
        raise ValueError(f"tk.{op}: head_dim must be even (rotate_half splits it in two), got {head_dim}")
    if cos.shape != sin.shape:
        raise ValueError(f"tk.{op}: cos has shape {tuple(cos.shape)} but sin has {tuple(sin.shape)}")
    if cos.shape[0] not in (1, batch) or cos.shape[1] not in (1, seq) or cos.shape[2] != head_dim:
        raise ValueError(
            f"tk.{op}: cos and sin have shape {tuple(cos.shape)}, which does not broadcast against {q_name} of "
            f"shape {tuple(q.shape)} as {layout}: expected ({_or_one(batch)}, {_or_one(seq)}, {head_dim})"
        )
    if q.device.type == "cuda" and batch * seq > 2**31 - 1:  # a program a position, on the grid's first axis
        raise ValueError(
            f"tk.{op}: {batch} x {seq} positions: more than a CUDA grid holds (2**31 - 1 programs); split the batch"
        )


def _or_one(size) -> str:
    """A size a broadcast dim may take: "n or 1"."""
    return f"{size} or 1" if size != 1 else "1"


# --------------------------------------------------------------------------
# The bodies.
# --------------------------------------------------------------------------


def _rotate(kernel, q, k, cos, sin, unsqueeze_dim: int, out_dtype: torch.dtype, head_tile: int, loads_first: bool):
    """Launch `kernel` over (q, k) into two new tensors of `out_dtype` with q's and k's layout."""
    # The kernel reads each head's elements as one contiguous run (vector loads); a tensor whose
    # last dim is strided (a rare view, or the expanded gradient of a sum) is copied once.
    q, k, cos, sin = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, cos, sin))
    q_out = torch.empty_like(q, dtype=out_dtype)  # a dense q's strides; the standard ones otherwise
    k_out = torch.empty_like(k, dtype=out_dtype)
    if q.numel() == 0 and k.numel() == 0:
        return q_out, k_out
    q_view, k_view, q_out_view, k_out_view = (_positions_first(t, unsqueeze_dim) for t in (q, k, q_out, k_out))
    batch, seq, n_q_heads, head_dim = q_view.shape
    n_k_heads = k_view.shape[2]
    half = int(head_dim) // 2  # a compile-time constant: the compiler sees the halves' alignment
    block_half = next_power_of_2(half)
    q_heads = rows_in_tile(n_q_heads, block_half, head_tile)
    k_heads = rows_in_tile(n_k_heads, block_half, head_tile)
    warps = min(warps_for(q_heads * block_half, per_thread=max(16 // q.element_size(), 1)), MAX_WARPS)
    cos, sin = cos.expand(batch, seq, head_dim), sin.expand(batch, seq, head_dim)  # broadcast dims: stride 0
    wide = torch.float64 in (q.dtype, cos.dtype, out_dtype)
    launcher(kernel, q)[(batch * seq,)](
        q_view, k_view, cos, sin, q_out_view, k_out_view,
        seq, n_q_heads, n_k_heads,
        *q_view.stride()[:3], *k_view.stride()[:3], *q_out_view.stride()[:3], *k_out_view.stride()[:3],
        *cos.stride()[:2], *sin.stride()[:2],
        HALF=half, BLOCK_HALF=block_half, BLOCK_Q_HEADS=q_heads, BLOCK_K_HEADS=k_heads, WIDE=wide,
        LOADS_FIRST=loads_first and q_heads >= n_q_heads and k_heads >= n_k_heads, num_warps=warps,
    )  # fmt: skip
    return q_out, k_out


def forward(q, k, cos, sin, unsqueeze_dim: int = 1, *, head_tile: int = HEAD_TILE, loads_first: bool = LOADS_FIRST):
    """(q_embed, k_embed); tk.rope's body with the block rule's tile and the loads-first form as parameters
    (tests pass a small tile to take several head tiles a program; the harness's tk-q-then-k, the form)."""
    _check_inputs("rope", ("q", "k"), q, k, cos, sin, unsqueeze_dim)
    out_dtype = promoted_float(q.dtype, cos.dtype)  # PyTorch's type promotion: see the module docstring
    return _rotate(rope_forward_kernel, q, k, cos, sin, unsqueeze_dim, out_dtype, head_tile, loads_first)


def backward(
    grad_q, grad_k, cos, sin, unsqueeze_dim: int = 1, input_dtype=None, *, head_tile: int = HEAD_TILE,
    loads_first: bool = LOADS_FIRST,
):  # fmt: skip
    """(dq, dk) in `input_dtype` (q's and k's dtype; the gradients' if None); tk.rope_backward's body."""
    _check_inputs("rope_backward", ("grad_q", "grad_k"), grad_q, grad_k, cos, sin, unsqueeze_dim)
    dtype = result_dtype("rope_backward", "input_dtype", input_dtype, grad_q.dtype)
    return _rotate(rope_backward_kernel, grad_q, grad_k, cos, sin, unsqueeze_dim, dtype, head_tile, loads_first)


def _rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    return forward(q, k, cos, sin, unsqueeze_dim)


def _rope_backward(
    grad_q: torch.Tensor,
    grad_k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    unsqueeze_dim: int = 1,
    input_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return backward(grad_q, grad_k, cos, sin, unsqueeze_dim, input_dtype)


rope = register_op("rope", _rope)
rope_backward = register_op("rope_backward", _rope_backward)


# Autograd: two results, so register_autograd itself (register_formula is for ops of one).
def _setup_context(ctx, inputs, output):
    q, _, cos, sin, unsqueeze_dim = inputs
    for position, name in ((2, "cos"), (3, "sin")):
        if ctx.needs_input_grad[position]:
            raise ValueError(
                f"tk.rope: {name} requires grad, but rope gives cos and sin no gradient; compute them "
                f"under torch.no_grad() (as HF's rotary embedding does) or pass {name}.detach()"
            )
    ctx.save_for_backward(cos, sin)
    ctx.unsqueeze_dim, ctx.input_dtype = unsqueeze_dim, q.dtype


def _autograd_backward(ctx, grad_q_embed, grad_k_embed):
    cos, sin = ctx.saved_tensors
    needs_q, needs_k = ctx.needs_input_grad[:2]
    dq = dk = None
    if needs_q or needs_k:
        dq, dk = torch.ops.tk.rope_backward(grad_q_embed, grad_k_embed, cos, sin, ctx.unsqueeze_dim, ctx.input_dtype)
    return (dq if needs_q else None), (dk if needs_k else None), None, None, None


rope.register_autograd(_autograd_backward, setup_context=_setup_context)


# --------------------------------------------------------------------------
# What the comparison harness reads.
# --------------------------------------------------------------------------


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """HF's rotate_half: cat(-x2, x1) over the two halves of the last dim."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim: int = 1):
    """HF's apply_rotary_pos_emb (transformers 5.17, models/llama), written out: the reference."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rotate_half_transposed(x: torch.Tensor) -> torch.Tensor:
    """The adjoint of rotate_half: (u1, u2) -> cat(u2, -u1)."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((x2, -x1), dim=-1)


def rotary_gradients(grad_q, grad_k, cos, sin, unsqueeze_dim: int = 1):
    """The gradients of q and k that autograd takes through apply_rotary_pos_emb, composed of PyTorch ops."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return tuple(g * cos + rotate_half_transposed(g * sin) for g in (grad_q, grad_k))


def rotary_tables(positions: int, dim: int, dtype, device, base: float = 10000.0):
    """cos and sin of shape (1, positions, dim) as HF's LlamaRotaryEmbedding makes them for position_ids
    (1, positions): computed in float32, both halves equal, cast to the activations' dtype."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
    freqs = torch.arange(positions, dtype=torch.float32, device=device)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)[None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _describe(shape) -> str:
    batch, seq, q_heads, k_heads, head_dim, rotary = shape
    dims = f"d{head_dim}" if rotary == head_dim else f"r{rotary}/d{head_dim}"
    return f"{batch}x{seq} h{q_heads}/{k_heads} {dims}"


def _make_inputs(shape, dtype, device):
    """q and k as HF hands them over: the projections' (batch, seq, heads, head_dim) output
    transposed to (batch, heads, seq, head_dim), cut to its first `rotary` dims for partial rotary
    (Phi); cos and sin of (1, seq, rotary)."""
    batch, seq, q_heads, k_heads, head_dim, rotary = shape
    q = torch.randn(batch, seq, q_heads, head_dim, dtype=dtype, device=device).transpose(1, 2)[..., :rotary]
    k = torch.randn(batch, seq, k_heads, head_dim, dtype=dtype, device=device).transpose(1, 2)[..., :rotary]
    return (q, k, *rotary_tables(seq, rotary, dtype, device))


def _bytes(shape, dtype):
    """Read q, k, cos and sin, write q_embed and k_embed (the gradients: the same counts)."""
    batch, seq, q_heads, k_heads, _, rotary = shape
    return (2 * batch * (q_heads + k_heads) + 2) * seq * rotary * element_size(dtype)


def _flops(shape, dtype):
    batch, seq, q_heads, k_heads, _, rotary = shape
    return 3 * batch * seq * (q_heads + k_heads) * rotary  # two products and a sum an output


def _liger_rope():
    from liger_kernel.transformers.rope import liger_rotary_pos_emb  # optional peer

    # Liger rotates q and k in place when their (batch, seq, heads, head_dim) view is
    # contiguous, as these are; the harness refuses a variant that writes into its inputs,
    # so Liger gets copies, and its time includes them (one more read and write of q and k).
    return lambda q, k, cos, sin: liger_rotary_pos_emb(q.clone(), k.clone(), cos, sin)


# (batch, seq, q heads, kv heads, head_dim, rotary_dim) of real models, with token counts
# that are not multiples of 128: Llama-3-8B, a Llama of 16/8 heads, Qwen2-7B, Gemma-7B, Phi-2.
_SHAPES = {
    "cuda": [
        (4, 2047, 32, 8, 128, 128), (1, 8191, 32, 8, 128, 128), (4, 2047, 16, 8, 128, 128),
        (4, 2047, 28, 4, 128, 128), (4, 2047, 16, 16, 256, 256), (4, 2047, 32, 32, 80, 32),
        (1, 8191, 32, 32, 80, 32),
    ],
    "cpu": [(2, 5, 4, 2, 16, 16), (1, 7, 2, 2, 20, 8)],
}  # fmt: skip

register_spec(
    OpSpec(
        name="rope",
        tk=lambda q, k, cos, sin: torch.ops.tk.rope(q, k, cos, sin),
        reference=apply_rotary_pos_emb,
        make_inputs=_make_inputs,
        bytes_moved=_bytes,
        flops=_flops,
        tolerance=ROUNDING_TOLERANCE,
        shapes=_SHAPES,
        describe=_describe,
        peers={"liger": _liger_rope},
        tk_plans={"tk-q-then-k": lambda q, k, cos, sin: run_direct(forward, (q, k, cos, sin), {"loads_first": False})},
    )
)


# The backward on its own: against the kernels eager autograd runs for HF's formula, and their
# fusion by Inductor.  (Liger's backward runs only behind its forward: no column here.)
register_spec(
    OpSpec(
        name="rope_backward",
        tk=lambda grad_q, grad_k, cos, sin: torch.ops.tk.rope_backward(grad_q, grad_k, cos, sin),
        reference=rotary_gradients,
        make_inputs=_make_inputs,  # grad_q and grad_k: random, in the layout of the forward's q and k
        bytes_moved=_bytes,
        flops=_flops,
        tolerance=ROUNDING_TOLERANCE,
        shapes=_SHAPES,
        describe=_describe,
        tk_plans={
            "tk-q-then-k": lambda grad_q, grad_k, cos, sin: run_direct(
                backward, (grad_q, grad_k, cos, sin), {"loads_first": False}
            )
        },
    )
)
