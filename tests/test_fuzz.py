"""Property-based tests: random shapes, layouts, dtypes and values for every op,
forward and backward, against float64.

Hypothesis draws each example: a shape (small primes, sizes just below, at
and above the kernels' block sizes, sometimes a zero), a dtype, a layout per
input (contiguous, permuted, sliced with a step, at an odd storage offset,
expanded from a size-1 dim), a scale for the values and sometimes NaN or
infinities among them.  For softmax on the CPU it also draws a Tuning, its
constants shrunk, so that tiny rows take every design (one block, the looped
kernel, split rows).

The oracle, for each output:

* shape and dtype are the input's;
* NaN and infinities sit where PyTorch puts them for the same inputs in the
  same dtype (only checked when the inputs hold some);
* elsewhere, ``||tk - exact|| / ||magnitude||`` is within the dtype's tolerance
  (``tests/reference.py``; twice that for gradients), where ``exact`` is the
  float64 answer and ``magnitude`` the size an error in that dtype is measured
  against: the output itself for softmax, ``|x|`` for gelu (whose negative
  tail cancels), ``|A| @ |B|`` for matmul (a sum of products can cancel to
  nearly nothing), and the same for gradients.  A plain relative error would
  fail PyTorch's own kernels on such inputs.

The profiles: ``tk-cpu`` (CI: a few hundred examples per op, tiny tensors,
Triton's interpreter) and ``tk-gpu`` (more examples, realistic block
boundaries); ``TK_FUZZ_SCALE=10`` runs ten times as many.  Both are
derandomized and keep no example database, so a run is reproducible.  A
failure found here becomes a fixed case in tests/test_bad_inputs.py.

A new op joins with a strategy (its inputs), a check (its call, its float64
reference and the magnitude of its outputs) and a line in ``FUZZ``.
"""

import contextlib
import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from unittest import mock

import pytest
import torch
import tuned
from hypothesis import HealthCheck, given, settings, strategies as st
from reference import TOLERANCE, pytorch_gelu

import ops  # noqa: F401  (registers torch.ops.tk.*)
from ops.matmul import kernels as matmul_module
from ops.rope import apply_rotary_pos_emb, rotate_half, rotate_half_transposed
from ops.softmax.plan import TUNING as SOFTMAX_TUNING

tk = torch.ops.tk
# Huge values and infinities make the interpreter's numpy warn of overflow: expected, not a problem.
pytestmark = pytest.mark.filterwarnings("ignore:(overflow|invalid value) encountered:RuntimeWarning")

_COMMON = dict(
    deadline=None,
    derandomize=True,  # the same examples on every run: CI is reproducible
    database=None,  # and nothing is stored between runs
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("tk-cpu", max_examples=200, **_COMMON)
settings.register_profile("tk-gpu", max_examples=500, **_COMMON)


def profile(device: str, examples: int):
    """The device's profile with `examples` examples (times TK_FUZZ_SCALE, for a longer hunt)."""
    scaled = max(1, round(examples * float(os.environ.get("TK_FUZZ_SCALE", "1"))))
    return settings(settings.get_profile("tk-gpu" if device == "cuda" else "tk-cpu"), max_examples=scaled)


# ---------------------------------------------------------------------------
# Inputs: values, layouts.
# ---------------------------------------------------------------------------

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]  # float64: matmul on the CPU only
SPECIALS = [float("nan"), float("inf"), -float("inf")]


@dataclass(frozen=True)
class Layout:
    """How an input of a given shape is laid out in memory: a base tensor (the
    autograd leaf) and a differentiable view of it with the wanted shape."""

    kind: str  # contiguous, permuted, sliced, offset, expanded
    perm: tuple = ()
    dim: int = 0
    step: int = 1
    offset: int = 0

    def base_shape(self, shape: tuple) -> tuple:
        if self.kind == "permuted":
            return tuple(shape[p] for p in self.perm)
        if self.kind == "sliced":
            return tuple(s * self.step + self.offset if i == self.dim else s for i, s in enumerate(shape))
        if self.kind == "offset":
            return (math.prod(shape) + self.offset,)
        if self.kind == "expanded":
            return tuple(1 if i == self.dim else s for i, s in enumerate(shape))
        return tuple(shape)

    def view(self, base: torch.Tensor, shape: tuple) -> torch.Tensor:
        if self.kind == "permuted":
            inverse = sorted(range(len(self.perm)), key=lambda i: self.perm[i])
            return base.permute(inverse)
        if self.kind == "sliced":
            index = [slice(None)] * len(shape)
            index[self.dim] = slice(self.offset, self.offset + shape[self.dim] * self.step, self.step)
            return base[tuple(index)]
        if self.kind == "offset":
            return base[self.offset :].view(shape)
        if self.kind == "expanded":
            return base.expand(shape)
        return base


@st.composite
def layouts(draw, shape: tuple):
    rank = len(shape)
    kinds = ["contiguous", "offset"] + (["permuted", "sliced", "expanded"] if rank else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "permuted":
        return Layout(kind, perm=tuple(draw(st.permutations(range(rank)))))
    if kind == "sliced":
        return Layout(kind, dim=draw(st.integers(0, rank - 1)), step=draw(st.integers(2, 3)), offset=draw(st.integers(0, 1)))
    if kind == "offset":
        return Layout(kind, offset=draw(st.integers(1, 3)))  # misaligned: not a multiple of 16 bytes
    if kind == "expanded":
        return Layout(kind, dim=draw(st.integers(0, rank - 1)))
    return Layout(kind)


@dataclass(frozen=True)
class Input:
    shape: tuple
    layout: Layout
    seed: int
    scale: float
    specials: tuple = ()  # (flat index in the base, value)

    def base(self, dtype: torch.dtype, device: str) -> torch.Tensor:
        shape = self.layout.base_shape(self.shape)
        gen = torch.Generator(device=device).manual_seed(self.seed)
        base = (self.scale * torch.randn(shape, generator=gen, device=device)).to(dtype)
        flat = base.view(-1)
        for index, value in self.specials:
            if flat.numel():
                flat[index % flat.numel()] = value
        return base

    def view(self, base: torch.Tensor) -> torch.Tensor:
        return self.layout.view(base, self.shape)


@st.composite
def inputs(draw, shape: tuple, scales=(1e-3, 1.0, 3.0, 30.0), specials=True):
    chosen = ()
    if specials and draw(st.sampled_from(["finite"] * 5 + ["special"])) == "special":  # one in six
        chosen = tuple(draw(st.lists(st.tuples(st.integers(0, 1 << 30), st.sampled_from(SPECIALS)), min_size=1, max_size=3)))
    return Input(shape, draw(layouts(shape)), draw(st.integers(0, 2**32 - 1)), draw(st.sampled_from(scales)), chosen)


@st.composite
def dims(draw, pool: list[int], rank: int, budget: int) -> tuple:
    """`rank` sizes from `pool` whose product stays within `budget`; one time in
    twelve, one of them zero."""
    out = []
    for _ in range(rank):
        d = draw(st.sampled_from([d for d in pool if d <= max(budget, 1)]))
        out.append(d)
        budget //= d
    if rank and draw(st.sampled_from(["sized"] * 11 + ["empty"])) == "empty":
        out[draw(st.integers(0, rank - 1))] = 0
    return tuple(out)


def _small(n: int) -> list[int]:
    return list(range(1, n + 1))


# Sizes: small ones, primes, and each side of the block sizes the kernels use
# (zeros come from `dims`).
POOLS = {
    "cpu": [*_small(9), 11, 13, 15, 16, 17, 31, 32, 33, 37, 61, 63, 64, 65, 97, 127, 128, 129],
    "cuda": [*_small(9), 13, 31, 127, 1021, 1023, 1024, 1025, 4093, 4095, 4096, 4097, 16383, 16384, 16385],
}
RANKS = [2, 1, 3, 4, 0]


# ---------------------------------------------------------------------------
# The oracle.
# ---------------------------------------------------------------------------


def _nonfinite_pattern(t: torch.Tensor):
    return t.isnan(), t == float("inf"), t == -float("inf")


def check_output(name: str, out, exact, magnitude, dtype, tolerance, same_dtype=None):
    """`out` (tk) against `exact` (float64); `same_dtype` (PyTorch in `dtype`) sets
    where NaN and infinities must be.  See the module docstring."""
    assert isinstance(out, torch.Tensor), name
    assert out.dtype == dtype, f"{name}: dtype {out.dtype}, expected {dtype}"
    assert out.shape == exact.shape, f"{name}: shape {tuple(out.shape)}, expected {tuple(exact.shape)}"
    if same_dtype is not None:
        got, want, exact_at = (torch.stack(_nonfinite_pattern(t)) for t in (out, same_dtype, exact))
        # Where PyTorch's own kernel departs from a non-finite float64 answer, tk may follow float64 instead (NaN,
        # +inf and -inf all as float64 has them): torch 2.13's CPU bfloat16 matmul gives NaN across a row whose
        # last column of K holds inf, where the products are +-inf.  Where float64 is finite and PyTorch's
        # result overflowed to inf, tk must overflow too.
        follows_float64 = (got == exact_at).all(0) & exact_at.any(0) & (want != exact_at).any(0)
        for g, w, what in zip(got, want, ("NaN", "+inf", "-inf")):
            assert not bool(((g != w) & ~follows_float64).any()), (
                f"{name}: {what} at {int(g.sum())} places, PyTorch has {int(w.sum())}"
            )
    out64 = out.double()
    counted = torch.isfinite(out64) & torch.isfinite(exact) & torch.isfinite(magnitude)
    if same_dtype is None:
        mismatch = torch.isfinite(out64) != torch.isfinite(exact)
        # Within the error bound of dtype's largest value, rounding may go either
        # way: a float16 gradient whose exact value is 65500 can come out inf (the
        # GPU fuzz found one), as long as it is an infinity of the right sign.
        near_overflow = torch.isfinite(exact) & (exact.abs() + tolerance * magnitude >= torch.finfo(dtype).max)
        right_sign = ~out64.isnan() & ((out64.sign() == exact.sign()) | torch.isfinite(out64))
        allowed = near_overflow & right_sign
        assert not bool((mismatch & ~allowed).any()), f"{name}: NaN or inf where float64 has none"
    diff = torch.where(counted, out64 - exact, 0.0).norm().item()
    size = torch.where(counted, magnitude, 0.0).norm().item()
    error = 0.0 if diff == 0 else (diff / size if size > 0 else math.inf)
    assert error <= tolerance, f"{name}: error {error:.3e} > {tolerance:.1e} ({dtype})"


def test_nonfinite_values_follow_float64_where_pytorchs_kernel_does_not():
    """A case this fuzz found (hypothesis 6.170, torch 2.13, CPU): b (5, 31) and a (31, 5) bfloat16, a a view one
    element into its storage with inf at a[8, 4].  PyTorch's matmul gave NaN across row 8; the float64 products are
    +-inf there, and so are tk's.  The oracle takes float64's side; a value that is neither still fails it."""
    base = (0.01 * torch.randn(156, generator=torch.Generator().manual_seed(0))).to(torch.bfloat16)
    base[357 % 156] = float("inf")
    a = base[1:].view(31, 5)
    b = (0.01 * torch.randn(5, 31, generator=torch.Generator().manual_seed(0))).to(torch.bfloat16)
    out, exact = torch.ops.tk.matmul(a, b), a.double() @ b.double()
    assert not exact[8].isfinite().any() and not exact[8].isnan().any()  # +-inf across the row
    magnitude, tolerance = a.double().abs() @ b.double().abs(), TOLERANCE[torch.bfloat16]
    check_output("forward", out, exact, magnitude, torch.bfloat16, tolerance, same_dtype=a @ b)
    for bad in (out.clone().index_put_((torch.tensor(8), torch.tensor(0)), torch.tensor(0.0, dtype=out.dtype)),
                out.clone().index_put_((torch.tensor(3), torch.tensor(3)), torch.tensor(float("inf"), dtype=out.dtype))):
        with pytest.raises(AssertionError):
            check_output("forward", bad, exact, magnitude, torch.bfloat16, tolerance, same_dtype=a @ b)
    # Overflow: float64 finite (76500), PyTorch's float16 inf; tk saturated to a finite 65504 fails.
    a16, b16 = torch.full((1, 2), 300.0, dtype=torch.float16), torch.full((2, 1), 127.5, dtype=torch.float16)
    exact16 = a16.double() @ b16.double()
    assert torch.isinf(a16 @ b16).all() and exact16.item() == 76500
    with pytest.raises(AssertionError):
        check_output("forward", torch.full((1, 1), 65504.0, dtype=torch.float16), exact16, exact16,
                     torch.float16, TOLERANCE[torch.float16], same_dtype=a16 @ b16)  # fmt: skip


def pull_back(views64, leaves64, magnitudes):
    """Magnitudes at the views' shapes, summed onto the leaves the way gradients are
    (an expanded input's gradient adds over the copies)."""
    return torch.autograd.grad(views64, leaves64, magnitudes)


def _float64_leaves(bases):
    return [b.detach().double().requires_grad_() for b in bases]


def run_case(op_inputs, dtype, device, tk_fn, ref_fn, fwd_magnitude, grad_magnitude, grad=True):
    """The forward and, without NaN or infinities in the inputs, the backward of one example.

    tk_fn / ref_fn: the op on the views; fwd_magnitude(views64, exact) -> the
    output's magnitude; grad_magnitude(views64, weight64, abs_views) -> each
    input's gradient magnitude at the view's shape (abs_views: |inputs| as
    views that autograd can differentiate through, for bilinear ops)."""
    bases = [i.base(dtype, device) for i in op_inputs]
    views = [i.view(b) for i, b in zip(op_inputs, bases)]
    leaves64 = _float64_leaves(bases)
    views64 = [i.view(b) for i, b in zip(op_inputs, leaves64)]
    exact = ref_fn(*views64)
    specials = any(i.specials for i in op_inputs)
    out = tk_fn(*views)
    same = ref_fn(*views) if specials else None
    check_output("forward", out, exact.detach(), fwd_magnitude([v.detach() for v in views64], exact.detach()),
                 dtype, TOLERANCE[dtype], same)  # fmt: skip
    if not grad or specials:  # the gradients of NaN and infinities are NaN and infinities
        return
    leaves = [b.detach().requires_grad_() for b in bases]
    out = tk_fn(*[i.view(b) for i, b in zip(op_inputs, leaves)])
    gen = torch.Generator(device=device).manual_seed(op_inputs[0].seed + 1)
    weight = torch.randn(out.shape, generator=gen, device=device).to(dtype)
    grads = torch.autograd.grad(out, leaves, weight)
    exact_grads = torch.autograd.grad(exact, leaves64, weight.double())
    abs_leaves = [b.detach().abs().requires_grad_() for b in leaves64]
    abs_views = [i.view(b) for i, b in zip(op_inputs, abs_leaves)]
    magnitudes = grad_magnitude([v.detach() for v in views64], weight.double(), abs_views)
    pulled = pull_back(abs_views, abs_leaves, [m.detach() for m in magnitudes])
    for k, (g, e, m) in enumerate(zip(grads, exact_grads, pulled)):
        check_output(f"gradient of input {k}", g, e, m, dtype, 2 * TOLERANCE[dtype])


# ---------------------------------------------------------------------------
# The ops: a strategy and a check each.
# ---------------------------------------------------------------------------

# gelu -----------------------------------------------------------------------

GELU_LONG = {"cpu": [65535, 65536, 65537], "cuda": [(1 << 18) - 1, (1 << 18) + 1, (1 << 20) + 1, (1 << 22) + 1]}  # block-size switches


@st.composite
def gelu_cases(draw, device):
    dtype = draw(st.sampled_from(DTYPES))
    if draw(st.sampled_from(["short"] * 9 + ["long"])) == "long":  # one example in ten
        shape = (draw(st.sampled_from(GELU_LONG[device])),)
    else:
        shape = draw(dims(POOLS[device], draw(st.sampled_from(RANKS)), 4096 if device == "cpu" else 1 << 20))
    return dtype, draw(st.sampled_from(["none", "tanh"])), draw(inputs(shape))


def check_gelu(case, device):
    dtype, approximate, x = case
    run_case(
        [x], dtype, device,
        tk_fn=lambda t: tk.gelu(t, approximate),
        ref_fn=lambda t: pytorch_gelu(t, approximate),
        fwd_magnitude=lambda v, out: v[0].abs(),  # |gelu(x)| <= |x|; the negative tail cancels
        grad_magnitude=lambda v, w, _: [w.abs() * (1 + v[0].abs())],
    )  # fmt: skip


# softmax ----------------------------------------------------------------------


SOFTMAX_COLS = {"cpu": [255, 256, 257, *POOLS["cpu"]], "cuda": [65537, 70001, *POOLS["cuda"]]}


@st.composite
def softmax_cases(draw, device):
    dtype = draw(st.sampled_from(DTYPES))
    rank = draw(st.sampled_from(RANKS))
    if rank == 0:
        shape, dim = (), draw(st.sampled_from([0, -1]))
    else:
        n_cols = draw(st.sampled_from(SOFTMAX_COLS[device]))
        # The interpreter pays per program and per chunk: few rows when they are long.
        budget = max(1, (256 if device == "cpu" else 1 << 22) // max(n_cols, 16))
        others = draw(dims(POOLS[device], rank - 1, min(budget, 64 if device == "cpu" else budget)))
        position = draw(st.integers(0, rank - 1))
        shape = others[:position] + (n_cols,) + others[position:]
        dim = position - rank if draw(st.booleans()) else position
    tuning = None  # the op as registered; on the CPU a Tuning shrunk so that tiny rows take every design
    if device == "cpu":
        tuning = dataclasses.replace(
            SOFTMAX_TUNING,
            cpu_max_block=draw(st.sampled_from([16, 16, 64, 1 << 16])),
            cpu_chunk=draw(st.sampled_from([16, 32])),
            min_segment_chunks=draw(st.sampled_from([1, 2])),
            cpu_programs=draw(st.sampled_from([1, 8, 21])),
            # rows past a block held across programs (on the CPU each program computes its row's partials)
            cpu_held_rows=draw(st.booleans()),
            cpu_segment=draw(st.sampled_from([16, 32])),
            cpu_row_tile=draw(st.sampled_from([1, 64, 1 << 14])),
        )
    return dtype, dim, tuning, draw(inputs(shape))


def check_softmax(case, device):
    dtype, dim, tuning, x = case
    softmax = tk.softmax if tuning is None else tuned.softmax(tuning)

    def grad_magnitude(v, w, _):
        y = torch.softmax(v[0], dim)
        dot = (w * y).sum(dim, keepdim=True) if y.dim() else w * y
        return [y * (w.abs() + dot.abs())]

    run_case(
        [x], dtype, device,
        tk_fn=lambda t: softmax(t, dim),
        ref_fn=lambda t: torch.softmax(t, dim),
        fwd_magnitude=lambda v, out: out.abs(),
        grad_magnitude=grad_magnitude,
    )  # fmt: skip


# matmul -----------------------------------------------------------------------

MATMUL_SIZES = [1, 2, 3, 5, 7, 13, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129]  # CPU: the interpreter's tile is 64
# On the GPU every new (M, N, K) costs an autotuning sweep: a few of them, each side of the tiles.
MATMUL_CUDA_MNK = [(1, 1, 1), (17, 129, 64), (128, 128, 128), (129, 127, 255), (1000, 1031, 64), (64, 1000, 1031),
                   (255, 17, 1000), (1031, 1, 129), (256, 256, 17), (1, 1031, 1000)]  # fmt: skip


@st.composite
def matmul_cases(draw, device):
    dtype = draw(st.sampled_from([d for d in DTYPES if device == "cpu" or d != torch.float64]))
    if device == "cuda":
        M, N, K = draw(st.sampled_from(MATMUL_CUDA_MNK))
    else:
        M, N, K = (draw(st.sampled_from(MATMUL_SIZES)) for _ in range(3))
    mode = draw(st.sampled_from(["2d", "3d@3d", "3d@2d", "2d@3d"]))
    batch = draw(st.sampled_from([1, 2] if device == "cpu" else [1, 2, 5]))
    if device == "cpu":  # the interpreter runs one Python loop step per 64x64x64 tile: a few tens of ms
        while math.ceil(M / 64) * math.ceil(N / 64) * math.ceil(K / 64) * (batch if mode != "2d" else 1) > 4:
            M, N, K = sorted((M, N, K))[:2] + [1]
    # The backward is two more matmuls of the same kernel: on the CPU, one example in three.
    grad = device == "cuda" or draw(st.sampled_from([True, False, False]))
    shape_a = (batch, M, K) if mode in ("3d@3d", "3d@2d") else (M, K)
    shape_b = (batch, K, N) if mode in ("3d@3d", "2d@3d") else (K, N)
    scales = (1e-2, 1.0, 3.0)  # float16: |A| @ |B| stays far from 65504
    return dtype, draw(inputs(shape_a, scales)), draw(inputs(shape_b, scales)), grad


def few_tile_configs():
    """On the GPU: the autotuner tries its largest and its smallest tile only.  Each
    new (M, N, K) and dtype compiles and times every configuration; all of them
    are checked against each other in tests/test_determinism.py."""
    autotuned = matmul_module.matmul_kernel_autotuned
    return mock.patch.object(autotuned, "configs", [matmul_module.CONFIGS[0], matmul_module.CONFIGS[-1]])


def check_matmul(case, device):
    dtype, a, b, grad = case

    def grad_magnitude(v, w, abs_views):
        out = torch.matmul(*abs_views)
        return list(torch.autograd.grad(out, abs_views, w.abs(), retain_graph=True))

    with few_tile_configs() if device == "cuda" else contextlib.nullcontext():
        run_case(
            [a, b], dtype, device,
            tk_fn=tk.matmul,
            ref_fn=torch.matmul,
            fwd_magnitude=lambda v, out: v[0].abs() @ v[1].abs(),  # a sum of products may cancel
            grad_magnitude=grad_magnitude,
            grad=grad,
        )  # fmt: skip


# rope -------------------------------------------------------------------------

ROPE_HEAD_DIMS = {"cpu": [2, 6, 16, 80], "cuda": [64, 80, 96, 128, 256]}  # 80: a half of 40 lanes of 64


@st.composite
def rope_cases(draw, device):
    """q and k of (batch, heads, seq, head_dim) in any layout, grouped-query head counts; cos and
    sin of (1 or batch, seq, head_dim), their halves unequal (a seed: they take no gradient)."""
    dtype = draw(st.sampled_from(DTYPES))
    head_dim = draw(st.sampled_from(ROPE_HEAD_DIMS[device]))
    batch, seq = draw(dims(POOLS[device], 2, 24 if device == "cpu" else 1 << 14))  # CPU: a program a position
    q_heads, k_heads = draw(st.sampled_from([1, 2, 3, 8])), draw(st.sampled_from([1, 2, 3]))
    q = draw(inputs((batch, q_heads, seq, head_dim)))
    k = draw(inputs((batch, k_heads, seq, head_dim)))
    return dtype, draw(st.sampled_from([1, batch])), q, k, draw(st.integers(0, 2**32 - 1))


def check_rope(case, device):
    dtype, cos_batch, q, k, seed = case
    _, _, seq, head_dim = q.shape
    gen = torch.Generator(device=device).manual_seed(seed)
    cos, sin = (torch.randn(cos_batch, seq, head_dim, generator=gen, device=device).to(dtype) for _ in range(2))
    cos_abs, sin_abs = cos.double().abs().unsqueeze(1), sin.double().abs().unsqueeze(1)

    def flat(pair):
        return torch.cat([t.reshape(-1) for t in pair])

    def grad_magnitude(v, w, _):  # |dy| |cos| + |rotate_half's transpose of dy sin|, at q's and k's shapes
        w_q, w_k = w.abs().split([v[0].numel(), v[1].numel()])
        return [g.view(x.shape) * cos_abs + rotate_half_transposed(g.view(x.shape) * sin_abs).abs()
                for g, x in ((w_q, v[0]), (w_k, v[1]))]  # fmt: skip

    run_case(
        [q, k], dtype, device,
        tk_fn=lambda a, b: flat(tk.rope(a, b, cos, sin)),
        ref_fn=lambda a, b: flat(apply_rotary_pos_emb(a, b, cos.to(a.dtype), sin.to(a.dtype))),
        fwd_magnitude=lambda v, out: flat([x.abs() * cos_abs + rotate_half(x).abs() * sin_abs for x in v]),
        grad_magnitude=grad_magnitude,
    )  # fmt: skip


# ---------------------------------------------------------------------------
# The table, and the tests it makes.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Fuzz:
    strategy: Callable  # device -> a strategy of cases
    check: Callable  # (case, device) -> None, raising AssertionError
    examples: dict  # per device


FUZZ = {
    # On the GPU most of the time goes to Triton compiling each new specialization.
    "gelu": Fuzz(gelu_cases, check_gelu, {"cpu": 300, "cuda": 500}),
    "softmax": Fuzz(softmax_cases, check_softmax, {"cpu": 200, "cuda": 300}),
    "matmul": Fuzz(matmul_cases, check_matmul, {"cpu": 200, "cuda": 100}),
    "rope": Fuzz(rope_cases, check_rope, {"cpu": 100, "cuda": 200}),
}


@pytest.mark.timeout(900)  # pytest-timeout's limit, where installed: compiles or autotunes for minutes on a GPU
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("op", sorted(FUZZ))
def test_random_inputs_match_float64(op, device):
    run_fuzz(FUZZ[op], device)


def run_fuzz(fuzz: Fuzz, device: str) -> None:
    """Draw the fuzz's cases for `device` under its profile and check each one."""

    @profile(device, fuzz.examples[device])
    @given(case=fuzz.strategy(device))
    def run(case):
        fuzz.check(case, device)

    run()


def test_the_oracle_catches_a_wrong_kernel(monkeypatch):
    """The checks above can fail: a gelu that is off by one part in 10**4 in float32
    (within float16's rounding, far outside float32's) is caught."""
    real = torch.ops.tk.gelu

    class Wrong:
        @staticmethod
        def gelu(x, approximate="none"):
            return real(x, approximate) * (1 + 1e-4)

    monkeypatch.setitem(globals(), "tk", Wrong)
    x = Input((1000,), Layout("contiguous"), seed=1, scale=3.0)
    with pytest.raises(AssertionError, match="forward: error"):
        check_gelu((torch.float32, "tanh", x), "cpu")
    check_gelu((torch.float16, "tanh", x), "cpu")  # within float16's tolerance: passes


def test_an_infinity_passes_only_at_the_edge_of_the_range():
    """A float16 gradient may round to inf where its exact value is within the
    error bound of 65504, with the exact value's sign; nowhere else."""
    f16 = torch.float16

    def check(out, exact):
        out, exact = torch.tensor([out], dtype=f16), torch.tensor([exact], dtype=torch.float64)
        check_output("g", out, exact, exact.abs().clamp_min(1.0), f16, 4e-3)

    check(math.inf, 65500.0)
    check(-math.inf, -65500.0)
    for out, exact in [(math.inf, 1.0), (math.inf, -65500.0), (math.nan, 65500.0), (math.inf, 60000.0)]:
        with pytest.raises(AssertionError, match="NaN or inf where float64 has none"):
            check(out, exact)
