"""Property-based tests for the ops that came after gelu, softmax and matmul:
rms_norm, layer_norm, swiglu, geglu, cross_entropy, square, add, copy and
rgb_to_grayscale, forward and backward, against float64.

The building blocks are tests/test_fuzz.py's (read its docstring): the same
profiles (derandomized, no example database, ``TK_FUZZ_SCALE``), the same
shape pools (small sizes, primes, each side of the block sizes), the same
layouts (contiguous, permuted, sliced with a step, at an odd storage offset,
expanded from a size-1 dim), value scales and, one time in six, NaN or
infinities among the values.  On the CPU the ops with several designs also
draw a Tuning, its constants shrunk so that tiny rows take each design: the
norms' long-row kernels, multi-program backward and column sums, and cross
entropy's multi-chunk online logsumexp and looped reductions.

The oracle, for each output (the forward, then the gradient of every input):

* shape and dtype as expected;
* NaN and infinities where PyTorch puts them in the same dtype, or where
  float64 does (examples with NaN or infinities among the inputs check the
  forward only), and otherwise none where float64 has none;
* elsewhere ``||tk - exact|| / ||magnitude||`` is within the dtype's tolerance
  (``tests/reference.py``; twice it for gradients), or within twice PyTorch's
  own error measured the same way in the same dtype, where PyTorch's
  low-precision answer is itself further off.  ``exact`` is PyTorch's float64
  answer for the same (rounded) inputs and ``magnitude`` the size an error in
  the op is measured against: the sum of the absolute values of the terms
  that make up each output (a sum of terms of both signs, or a difference
  such as ``x - mean`` or ``lse - x_t``, can cancel to far less than the
  error of its terms).

Each op has a strategy (its inputs and options), a check (its call, its
float64 reference, its magnitudes) and a line in ``FUZZ``.  A failure found
here becomes a fixed case, marked ``xfail(strict=True)`` until the op is fixed.
"""

import dataclasses
import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
import tuned
from hypothesis import strategies as st
from reference import TOLERANCE
from test_fuzz import DTYPES, POOLS, RANKS, Fuzz, Input, Layout, dims, inputs, pull_back, run_fuzz

import ops  # noqa: F401  (registers torch.ops.tk.*)
from ops.cross_entropy.op import cross_entropy_with_tuning
from ops.cross_entropy.plan import TUNING as CROSS_ENTROPY_TUNING
from ops.norms.plan import TUNING as NORM_TUNING
from ops.tour.rgb_to_grayscale import torchvision_rgb_to_grayscale

tk = torch.ops.tk
# Huge values and infinities make the interpreter's numpy warn: expected, not a problem.
pytestmark = pytest.mark.filterwarnings(
    "ignore:(overflow|invalid value|divide by zero) encountered:RuntimeWarning",
    "ignore:All-NaN slice encountered:RuntimeWarning",
)


# ---------------------------------------------------------------------------
# The oracle.
# ---------------------------------------------------------------------------


def _nonfinite_kind(t: torch.Tensor) -> torch.Tensor:
    """0 where finite, 1 NaN, 2 +inf, 3 -inf."""
    kind = torch.zeros(t.shape, dtype=torch.int8, device=t.device)
    kind[t.isnan()] = 1
    kind[t == float("inf")] = 2
    kind[t == -float("inf")] = 3
    return kind


def scaled_error(out: torch.Tensor, exact: torch.Tensor, magnitude: torch.Tensor) -> float:
    """||out - exact|| / ||magnitude|| over the places where all three are finite."""
    out64 = out.detach().double()
    counted = torch.isfinite(out64) & torch.isfinite(exact) & torch.isfinite(magnitude)
    diff = torch.where(counted, out64 - exact, 0.0).norm().item()
    size = torch.where(counted, magnitude, 0.0).norm().item()
    return 0.0 if diff == 0 else (diff / size if size > 0 else math.inf)


def check_output(name, ours, exact, magnitude, theirs, dtype, tolerance, specials):
    """`ours` (tk) against `exact` (float64); `theirs` (PyTorch in `dtype`) sets
    where NaN and infinities must be and the floor of the tolerance."""
    assert ours.dtype == dtype, f"{name}: dtype {ours.dtype}, expected {dtype}"
    assert ours.shape == exact.shape, f"{name}: shape {tuple(ours.shape)}, expected {tuple(exact.shape)}"
    if specials:
        # Where PyTorch's low-precision answer is itself off (silu(-30) rounds to -0
        # in float16, and -0 * inf is NaN where float64 has -inf), float64's is right too.
        ok = (_nonfinite_kind(ours) == _nonfinite_kind(theirs)) | (_nonfinite_kind(ours) == _nonfinite_kind(exact))
        assert bool(ok.all()), (
            f"{name}: NaN or inf at {int((~ok).sum())} places where neither PyTorch in {dtype} nor float64 has it "
            f"(tk: {ours[~ok][:4].tolist()}, PyTorch: {theirs[~ok][:4].tolist()}, float64: {exact[~ok][:4].tolist()})"
        )
    else:
        finite = torch.equal(ours.isfinite(), exact.isfinite())
        assert finite, f"{name}: NaN or inf where float64 has none, or none where it has"
    error = scaled_error(ours, exact, magnitude)
    pytorch_error = scaled_error(theirs, exact, magnitude)
    allowed = max(tolerance, 2 * pytorch_error)
    assert error <= allowed, f"{name}: error {error:.3e} > {allowed:.1e} ({dtype}; PyTorch's own: {pytorch_error:.1e})"


def run_case(names, op_inputs, dtype, device, tk_fn, ref_fn, fwd_magnitude, grad_magnitude, exact_fn=None):
    """The forward and, without NaN or infinities among the inputs, the backward of one example.

    tk_fn / ref_fn: the op on views of the inputs (ref_fn is PyTorch's, run in
    float64 for the exact answer and in `dtype` for PyTorch's own error;
    exact_fn, if given, replaces it for the float64 answer).
    fwd_magnitude(views64, exact) -> the forward's magnitude; grad_magnitude(views64,
    weight64) -> each input's gradient magnitude at the view's shape (summed
    onto the base tensor the way the gradient is, through the view)."""
    bases = [i.base(dtype, device) for i in op_inputs]
    specials = any(i.specials for i in op_inputs)

    def views_of(leaves):
        return [i.view(b) for i, b in zip(op_inputs, leaves)]

    ours_leaves = [b.detach().clone().requires_grad_(not specials) for b in bases]
    theirs_leaves = [b.detach().clone().requires_grad_(not specials) for b in bases]
    leaves64 = [b.detach().double().requires_grad_(not specials) for b in bases]
    ours = tk_fn(*views_of(ours_leaves))
    theirs = ref_fn(*views_of(theirs_leaves))
    exact = (exact_fn or ref_fn)(*views_of(leaves64))
    views64 = views_of([b.detach() for b in leaves64])
    check_output("forward", ours.detach(), exact.detach(), fwd_magnitude(views64, exact.detach()), theirs.detach(),
                 dtype, TOLERANCE[dtype], specials)  # fmt: skip
    if specials:  # the gradients of NaN and infinities are NaN and infinities
        return
    gen = torch.Generator(device=device).manual_seed(op_inputs[0].seed + 1)
    weight = torch.randn(ours.shape, generator=gen, device=device).to(dtype)
    grads = torch.autograd.grad(ours, ours_leaves, weight)
    their_grads = torch.autograd.grad(theirs, theirs_leaves, weight)
    exact_grads = torch.autograd.grad(exact, leaves64, weight.double())
    abs_leaves = [b.detach().abs().requires_grad_() for b in leaves64]
    at_views = [m.detach() for m in grad_magnitude(views64, weight.double())]
    magnitudes = pull_back(views_of(abs_leaves), abs_leaves, at_views)
    for name, g, t, e, m in zip(names, grads, their_grads, exact_grads, magnitudes):
        check_output(f"gradient of {name}", g, e, m, t, dtype, 2 * TOLERANCE[dtype], False)




def _pick(draw, options):
    return draw(st.sampled_from(options))


# ---------------------------------------------------------------------------
# Elementwise ops: copy, square, add, swiglu, geglu.
# ---------------------------------------------------------------------------

# The CPU takes one program of up to 2**16 elements; on the GPU a thread takes
# one element below 2**18 and more from there, up to its count at 2**20
# (ops/blocks/elementwise.py: elementwise_config).
ELEMENTWISE_LONG = {"cpu": [65535, 65536, 65537], "cuda": [(1 << 18) - 1, (1 << 18) + 1, (1 << 20) + 1, (1 << 22) + 1]}
BUDGET = {"cpu": 4096, "cuda": 1 << 20}  # elements of the largest ordinary example


@st.composite
def elementwise_shapes(draw, device):
    if _pick(draw, ["short"] * 9 + ["long"]) == "long":  # one example in ten
        return (_pick(draw, ELEMENTWISE_LONG[device]),)
    return draw(dims(POOLS[device], _pick(draw, RANKS), BUDGET[device]))


@st.composite
def pair_of_inputs(draw, shape, scales=(1e-3, 1.0, 3.0, 30.0)):
    """Two inputs of one shape: one time in three with the same layout (the
    kernels then walk dense non-contiguous layouts where they lie)."""
    first = draw(inputs(shape, scales))
    second = draw(inputs(shape, scales))
    if _pick(draw, ["own", "own", "shared"]) == "shared":
        second = Input(shape, first.layout, second.seed, second.scale, second.specials)
    return first, second


@st.composite
def one_input_cases(draw, device):
    dtype = _pick(draw, DTYPES)
    return dtype, draw(inputs(draw(elementwise_shapes(device))))


@st.composite
def two_input_cases(draw, device):
    dtype = _pick(draw, DTYPES)
    return dtype, draw(pair_of_inputs(draw(elementwise_shapes(device))))


@st.composite
def geglu_cases(draw, device):
    dtype, pair = draw(two_input_cases(device))
    return dtype, _pick(draw, ["tanh", "none"]), pair


def check_copy(case, device):
    dtype, x = case
    run_case(
        ["x"], [x], dtype, device,
        tk_fn=tk.copy,
        ref_fn=torch.clone,
        fwd_magnitude=lambda v, out: v[0].abs(),
        grad_magnitude=lambda v, w: [w.abs()],
    )  # fmt: skip


def check_square(case, device):
    dtype, x = case
    run_case(
        ["x"], [x], dtype, device,
        tk_fn=tk.square,
        ref_fn=torch.square,
        fwd_magnitude=lambda v, out: v[0] ** 2,
        grad_magnitude=lambda v, w: [2 * v[0].abs() * w.abs()],
    )  # fmt: skip


def check_add(case, device):
    dtype, (a, b) = case
    run_case(
        ["a", "b"], [a, b], dtype, device,
        tk_fn=tk.add,
        ref_fn=torch.add,
        fwd_magnitude=lambda v, out: v[0].abs() + v[1].abs(),  # a + b may cancel
        grad_magnitude=lambda v, w: [w.abs(), w.abs()],
    )  # fmt: skip


def check_swiglu(case, device):
    dtype, (gate, up) = case

    def grad_magnitude(v, w):
        g, u = v
        s = torch.sigmoid(g)
        # silu'(g) = s + g s (1 - s): the sum of its terms' sizes
        return [w.abs() * u.abs() * (s + g.abs() * s * (1 - s)), w.abs() * (g * s).abs()]

    run_case(
        ["gate", "up"], [gate, up], dtype, device,
        tk_fn=tk.swiglu,
        ref_fn=lambda g, u: F.silu(g) * u,
        fwd_magnitude=lambda v, out: out.abs(),  # g * sigmoid(g) * u: nothing cancels
        grad_magnitude=grad_magnitude,
    )  # fmt: skip


def check_geglu(case, device):
    dtype, approximate, (gate, up) = case
    run_case(
        ["gate", "up"], [gate, up], dtype, device,
        tk_fn=lambda g, u: tk.geglu(g, u, approximate),
        ref_fn=lambda g, u: F.gelu(g, approximate=approximate) * u,
        # |gelu(g)| <= |g|; its negative tail cancels (as in tests/test_fuzz.py's gelu)
        fwd_magnitude=lambda v, out: v[0].abs() * v[1].abs(),
        grad_magnitude=lambda v, w: [w.abs() * v[1].abs() * (1 + v[0].abs()), w.abs() * v[0].abs()],
    )  # fmt: skip


# ---------------------------------------------------------------------------
# rgb_to_grayscale (float images).
# ---------------------------------------------------------------------------

# One program per image up to 2**16 pixels on the CPU: 257 x 257 takes two.
GRAY_LONG = {"cpu": [(255, 257), (256, 256), (257, 257)], "cuda": [(2047, 2049), (2048, 2048), (4099, 1021)]}


@st.composite
def rgb_cases(draw, device):
    dtype = _pick(draw, DTYPES)
    if _pick(draw, ["small"] * 9 + ["large"]) == "large":  # one image, or two
        batch = draw(dims([1, 2], _pick(draw, [0, 1]), 2))
        height, width = _pick(draw, GRAY_LONG[device])
    else:
        batch = draw(dims(POOLS[device], _pick(draw, [0, 1, 2]), 16))
        height, width = draw(dims(POOLS[device], 2, BUDGET[device] // (3 * max(1, math.prod(batch)))))
    return dtype, draw(inputs((*batch, 3, height, width)))


def check_rgb_to_grayscale(case, device):
    dtype, img = case
    weights = torch.tensor([0.2989, 0.587, 0.114], dtype=torch.float64, device=device)

    def grad_magnitude(v, w):
        return [w.abs().unsqueeze(-3) * weights.view(3, 1, 1)]

    run_case(
        ["img"], [img], dtype, device,
        tk_fn=tk.rgb_to_grayscale,
        ref_fn=torchvision_rgb_to_grayscale,
        fwd_magnitude=lambda v, out: torchvision_rgb_to_grayscale(v[0].abs()),  # R, G, B of both signs cancel
        grad_magnitude=grad_magnitude,
    )  # fmt: skip


# ---------------------------------------------------------------------------
# rms_norm and layer_norm.
# ---------------------------------------------------------------------------

# Row lengths: each side of the forward's one-block limit (32768 on the GPU,
# 16384 for float64), of the backward's (8192) and of the chunks (4096).
NORM_COLS = {
    "cpu": [*POOLS["cpu"], 255, 256, 257],
    "cuda": [1, 2, 3, 5, 7, 13, 127, 1023, 1024, 1025, 4095, 4096, 4097, 8191, 8192, 8193, 16383, 16384, 16385,
             32767, 32768, 32769, 65537],
}
# eps values that are exact in float32: a Python float reaches a kernel as a
# float32 (see tests/test_norms.py), which would be an error of 1e-8 on a
# float64 row whose mean square is near eps.
NORM_EPS = [2.0**-20, 2.0**-17, 2.0**-10]


@st.composite
def norm_design(draw, device):
    """None (the default Tuning), or on the CPU a Tuning shrunk so that tiny rows take every design."""
    if device != "cpu" or _pick(draw, ["default", "shrunk", "shrunk"]) == "default":
        return None
    shrunk = NORM_TUNING.with_cpu(
        max_block=_pick(draw, [16, 64, 1 << 16]),
        max_block_backward=_pick(draw, [16, 32, 1 << 16]),
        tile=_pick(draw, [16, 32, 1 << 14]),
        chunk=_pick(draw, [16, 32]),
        column_sum_block=_pick(draw, [(2, 8), (4, 16), (64, 1 << 12)]),
    )
    return dataclasses.replace(
        shrunk, cpu_programs=_pick(draw, [1, 3, 8]), min_rows_per_program=_pick(draw, [1, 2, 8])
    )


@st.composite
def norm_shapes(draw, device, trailing: int):
    """A shape whose last `trailing` dims (the normalized ones) hold a row of NORM_COLS."""
    n_cols = _pick(draw, NORM_COLS[device])
    row = (n_cols,)
    if trailing == 2:  # split the row into two dims where it has a divisor
        split = _pick(draw, [d for d in (1, 2, 3, 4, 5, 7, 8, 16) if n_cols % d == 0])
        row = (split, n_cols // split)
    budget = max(1, BUDGET[device] // max(n_cols, 1))
    others = draw(dims(POOLS[device], _pick(draw, [1, 1, 0, 2]), budget))
    return others + row


@st.composite
def optional_param(draw, shape, device):
    """None one time in four, else an input of `shape` (weights near 1 or random)."""
    if _pick(draw, ["param"] * 3 + ["none"]) == "none":
        return None
    return draw(inputs(shape, scales=(0.1, 1.0, 3.0)))


@st.composite
def rms_norm_cases(draw, device):
    dtype = _pick(draw, DTYPES)
    shape = draw(norm_shapes(device, 1))
    x = draw(inputs(shape))
    weight = draw(optional_param(shape[-1:], device))
    eps = _pick(draw, [None, *NORM_EPS])
    return dtype, x, weight, eps, draw(norm_design(device))


@st.composite
def layer_norm_cases(draw, device):
    dtype = _pick(draw, DTYPES)
    trailing = _pick(draw, [1, 1, 2])
    shape = draw(norm_shapes(device, trailing))
    normalized = shape[-trailing:]
    x = draw(inputs(shape))
    weight = draw(optional_param(normalized, device))
    bias = draw(optional_param(normalized, device))
    return dtype, x, list(normalized), weight, bias, _pick(draw, NORM_EPS), draw(norm_design(device))


def _present(named):
    names = [n for n, i in named if i is not None]
    return names, [i for _, i in named if i is not None]


def check_rms_norm(case, device):
    dtype, x, weight, eps, design = case
    names, op_inputs = _present([("x", x), ("weight", weight)])
    n = x.shape[-1]

    def call(op):
        return lambda t, w=None: op(t, w, eps)

    def rstd_of(t):
        eps64 = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps if eps is None else eps
        return torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps64)

    def fwd_magnitude(v, out):
        return out.abs()  # x * rstd * w: nothing cancels

    def grad_magnitude(v, w):
        t = v[0]
        wt = v[1] if len(v) > 1 else torch.ones(n, dtype=torch.float64, device=t.device)
        rstd = rstd_of(t)
        xhat, g = (t * rstd).abs(), (w * wt).abs()
        dx = rstd * (g + xhat * (g * xhat).mean(-1, keepdim=True))  # dx = rstd (g - xhat mean(g xhat))
        dw = (w.abs() * xhat).reshape(-1, n).sum(0)
        return [dx, dw][: len(v)]

    tk_rms_norm = tk.rms_norm if design is None else (lambda t, w, e: tuned.norm("rms_norm", design, e)(t, w, None))
    run_case(
        names, op_inputs, dtype, device,
        tk_fn=call(tk_rms_norm),
        ref_fn=call(lambda t, w, e: F.rms_norm(t, (n,), w, e)),
        fwd_magnitude=fwd_magnitude,
        grad_magnitude=grad_magnitude,
        # The exact answer is the definition, x * rsqrt(mean(x**2) + eps) * w:
        # on a row holding inf, PyTorch's CUDA kernel makes the whole row NaN
        # where the definition (and PyTorch's CPU kernel) gives x * 0 = 0.
        exact_fn=call(lambda t, w, e: t * rstd_of(t) * (1 if w is None else w)),
    )  # fmt: skip


def check_layer_norm(case, device):
    dtype, x, normalized, weight, bias, eps, design = case
    names, op_inputs = _present([("x", x), ("weight", weight), ("bias", bias)])
    dims_ = tuple(range(-len(normalized), 0))

    def split(v):
        """(x, weight or None, bias or None) from the present inputs."""
        rest = iter(v[1:])
        return v[0], next(rest) if weight is not None else None, next(rest) if bias is not None else None

    def tk_fn(*v):
        t, w, b = split(v)
        if design is None:
            return tk.layer_norm(t, normalized, w, b, eps)
        return tuned.norm("layer_norm", design, eps, normalized_shape=normalized)(t, w, b)

    def ref_fn(*v):
        # The normalized dims flattened into one: on CUDA, PyTorch's backward for
        # normalized_shape [1, 1] returned a weight gradient of shape [1] and
        # autograd refused it (found by the GPU fuzz).  Same values, same math.
        t, w, b = split(v)
        n = math.prod(normalized)
        flat = t.reshape(*t.shape[: t.dim() - len(normalized)], n)
        w, b = (None if p is None else p.reshape(n) for p in (w, b))
        return F.layer_norm(flat, (n,), w, b, eps).reshape(t.shape)

    def stats(t):
        mean = t.mean(dims_, keepdim=True)
        rstd = torch.rsqrt((t - mean).pow(2).mean(dims_, keepdim=True) + eps)
        return (t.abs() + mean.abs()) * rstd, rstd  # xhat's magnitude: x - mean cancels

    def fwd_magnitude(v, out):
        t, w, b = split(v)
        xhat, _ = stats(t)
        return xhat * (1 if w is None else w.abs()) + (0 if b is None else b.abs())

    def grad_magnitude(v, dy):
        t, w, b = split(v)
        xhat, rstd = stats(t)
        dy = dy.abs()
        g = dy * (1 if w is None else w.abs())
        # dx = rstd (g - mean(g) - xhat mean(g xhat))
        dx = rstd * (g + g.mean(dims_, keepdim=True) + xhat * (g * xhat).mean(dims_, keepdim=True))
        param_shape = (-1, *normalized)
        out = [dx]
        if w is not None:
            out.append((dy * xhat).reshape(param_shape).sum(0))
        if b is not None:
            out.append(dy.reshape(param_shape).sum(0))
        return out

    run_case(names, op_inputs, dtype, device, tk_fn, ref_fn, fwd_magnitude, grad_magnitude)


# ---------------------------------------------------------------------------
# cross_entropy.
# ---------------------------------------------------------------------------

CE_ROWS = {"cpu": [0, 1, 2, 3, 5, 7, 8, 13, 16, 17, 31, 33, 64], "cuda": [0, 1, 2, 3, 7, 31, 127, 1021, 1024, 4099]}
CE_CLASSES = {
    "cpu": [1, 2, 3, 5, 7, 13, 16, 17, 31, 32, 33, 61, 64, 65, 127, 128, 129, 257],
    # each side of the 4096-column chunk, primes, and vocabulary sizes
    "cuda": [1, 2, 3, 5, 13, 127, 1021, 4095, 4096, 4097, 8191, 32000, 50257, 65537],
}
SMOOTHINGS = [0.0, 0.0, 0.1, 0.25, 1.0]


def as_float32(value: float) -> float:
    """label_smoothing as the kernels see it: every float argument of a Triton kernel is float32."""
    return float(torch.tensor(value, dtype=torch.float32))


@dataclass(frozen=True)
class Targets:
    """Class indices for N rows of C classes; a share of them ignore_index."""

    n_rows: int
    n_cols: int
    seed: int
    ignored: float  # the share of rows set to ignore_index
    ignore_index: int
    strided: bool  # every other element of a tensor twice as long
    unbatched: bool  # (C,) logits and a 0-D target

    def make(self, device: str) -> torch.Tensor:
        gen = torch.Generator(device=device).manual_seed(self.seed)
        target = torch.randint(0, self.n_cols, (self.n_rows,), generator=gen, device=device)
        drop = torch.rand(self.n_rows, generator=gen, device=device) < self.ignored
        target = torch.where(drop, torch.full_like(target, self.ignore_index), target)
        if self.strided:
            spread = torch.full((2 * self.n_rows,), -7, dtype=torch.int64, device=device)
            spread[::2] = target
            target = spread[::2]
        return target[0] if self.unbatched else target


@st.composite
def cross_entropy_cases(draw, device):
    dtype = _pick(draw, DTYPES)
    n_cols = _pick(draw, CE_CLASSES[device])
    unbatched = _pick(draw, ["batched"] * 7 + ["unbatched"]) == "unbatched"
    budget = BUDGET[device] * (4 if device == "cuda" else 1)
    n_rows = 1 if unbatched else _pick(draw, [n for n in CE_ROWS[device] if n * n_cols <= budget] or [1])
    shape = (n_cols,) if unbatched else (n_rows, n_cols)
    # ignore_index: PyTorch's default, another negative one, or a real class (whose rows are then ignored)
    targets = Targets(
        n_rows, n_cols, draw(st.integers(0, 2**32 - 1)),
        ignored=_pick(draw, [0.0, 0.2, 0.2, 0.5, 1.0]),
        ignore_index=_pick(draw, [-100, -100, -1, 0, n_cols - 1]),
        strided=draw(st.booleans()),
        unbatched=unbatched,
    )  # fmt: skip
    options = (_pick(draw, ["mean", "sum", "none"]), _pick(draw, SMOOTHINGS))
    tuning = CROSS_ENTROPY_TUNING  # the registered op
    if device == "cpu" and _pick(draw, ["default", "shrunk", "shrunk"]) == "shrunk":
        tuning = CROSS_ENTROPY_TUNING.with_cpu(
            max_chunk=_pick(draw, [16, 32, 1 << 14]), reduce_chunk=_pick(draw, [2, 16, 1 << 16])
        )
    return dtype, draw(inputs(shape, scales=(1e-3, 1.0, 3.0, 30.0))), targets, options, tuning


def check_cross_entropy(case, device):
    dtype, logits, targets, (reduction, smoothing), tuning = case
    target = targets.make(device)
    ignore_index = targets.ignore_index

    def tk_fn(x):
        if tuning == CROSS_ENTROPY_TUNING:
            return tk.cross_entropy(x, target, ignore_index, reduction, smoothing)
        return cross_entropy_with_tuning(x, target, ignore_index, reduction, smoothing, tuning=tuning)

    def ref_fn(x):
        # Unbatched logits (C,) are a batch of one, as documented.  PyTorch's CUDA
        # kernel disagrees with that (and with its CPU kernel) on the mean over an
        # unbatched, ignored target, which is 0 / 0 = NaN: the GPU fuzz found it.
        x2, t2 = (x.unsqueeze(0), target.unsqueeze(0)) if targets.unbatched else (x, target)
        out = F.cross_entropy(
            x2, t2, ignore_index=ignore_index, reduction=reduction, label_smoothing=as_float32(smoothing)
        )
        return out.squeeze(0) if targets.unbatched and reduction == "none" else out

    def rows(x):
        """(N, C) logits, (N,) targets, (N,) kept-row mask, (N,) lse."""
        x2, t2 = (x.unsqueeze(0), target.unsqueeze(0)) if targets.unbatched else (x, target)
        kept = t2 != ignore_index
        return x2, t2, kept, torch.logsumexp(x2, -1) if x2.shape[-1] else x2.sum(-1)

    def reduce(per_row, kept):
        per_row = torch.where(kept, per_row, 0.0)
        if reduction == "none":
            return per_row.squeeze(0) if targets.unbatched else per_row
        total = per_row.sum()
        return total / kept.sum() if reduction == "mean" else total

    def fwd_magnitude(v, out):
        x2, _, kept, lse = rows(v[0])
        # lse - x_t and lse - mean(x) cancel: sizes of their terms
        per_row = lse.abs() + (x2.abs().amax(-1) if x2.numel() else lse)
        return reduce(per_row, kept).abs()

    def grad_magnitude(v, w):
        x2, t2, kept, lse = rows(v[0])
        w = w.abs().reshape(-1) if reduction == "none" else w.abs().expand(x2.shape[0])
        if reduction == "mean":
            w = w / kept.sum().clamp_min(1)
        w = torch.where(kept, w, 0.0).unsqueeze(-1)
        s, n_cols = as_float32(smoothing), x2.shape[-1]
        onehot = torch.nn.functional.one_hot(t2.clamp(0, n_cols - 1), n_cols).double() * kept.unsqueeze(-1)
        # dx = p - (1 - s) onehot - s / C, where p = exp(x - lse) carries lse's relative error
        probs = torch.exp(x2 - lse.unsqueeze(-1))
        mag = w * (probs * lse.abs().clamp_min(1).unsqueeze(-1) + (1 - s) * onehot + s / n_cols)
        return [mag.squeeze(0) if targets.unbatched else mag]

    run_case(["logits"], [logits], dtype, device, tk_fn, ref_fn, fwd_magnitude, grad_magnitude)


# ---------------------------------------------------------------------------
# The table, and the tests it makes.
# ---------------------------------------------------------------------------


FUZZ = {
    # A few hundred examples per op on the GPU.  Most of that time goes to Triton
    # compiling each new specialization (dtype, block size, flags, alignment).
    "add": Fuzz(two_input_cases, check_add, {"cpu": 200, "cuda": 300}),
    "copy": Fuzz(one_input_cases, check_copy, {"cpu": 200, "cuda": 300}),
    "cross_entropy": Fuzz(cross_entropy_cases, check_cross_entropy, {"cpu": 200, "cuda": 300}),
    "geglu": Fuzz(geglu_cases, check_geglu, {"cpu": 200, "cuda": 300}),
    "layer_norm": Fuzz(layer_norm_cases, check_layer_norm, {"cpu": 200, "cuda": 300}),
    "rgb_to_grayscale": Fuzz(rgb_cases, check_rgb_to_grayscale, {"cpu": 200, "cuda": 300}),
    "rms_norm": Fuzz(rms_norm_cases, check_rms_norm, {"cpu": 200, "cuda": 300}),
    "square": Fuzz(one_input_cases, check_square, {"cpu": 200, "cuda": 300}),
    "swiglu": Fuzz(two_input_cases, check_swiglu, {"cpu": 200, "cuda": 300}),
}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("op", sorted(FUZZ))
def test_random_inputs_match_float64(op, device):
    run_fuzz(FUZZ[op], device)


def test_the_oracle_catches_a_wrong_kernel(monkeypatch):
    """The checks above can fail: an rms_norm whose output is off by one part in
    10**4 in float32 (within float16's rounding, far outside float32's) is
    caught, forward and backward."""
    real = torch.ops.tk.rms_norm

    class Wrong:
        @staticmethod
        def rms_norm(x, weight=None, eps=None):
            return real(x, weight, eps) * (1 + 1e-4)

    monkeypatch.setitem(globals(), "tk", Wrong)
    x = Input((7, 33), Layout("contiguous"), seed=1, scale=3.0)
    w = Input((33,), Layout("contiguous"), seed=2, scale=1.0)
    with pytest.raises(AssertionError, match="forward: error"):
        check_rms_norm((torch.float32, x, w, None, None), "cpu")
    check_rms_norm((torch.float16, x, w, None, None), "cpu")  # within float16's tolerance: passes


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_rms_norm_of_a_row_holding_inf_follows_the_definition(device):
    """Found by the GPU fuzz: for a row (0, inf), mean(x**2) is inf, so rstd is 0
    and the zero maps to 0 * 0 = 0, the inf to inf * 0 = NaN.  PyTorch's CPU
    kernel agrees; its CUDA kernel (torch 2.11) makes the whole row NaN."""
    x = torch.tensor([[0.0, float("inf")], [1.0, 2.0]], device=device)
    out = tk.rms_norm(x, None, None)
    assert out[0, 0].item() == 0 and out[0, 1].isnan()
    assert torch.isfinite(out[1]).all()
