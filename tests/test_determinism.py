"""Run-to-run drift: the same input, several runs, the same bits.

A race (two programs writing one element, a read before a write lands) or an
element that no program writes shows up as an answer that changes between
runs on the same input.  Each kernel runs several times on one input; between
runs the memory of the previous output is filled with 0xFF bytes (NaN in every
float dtype) before it is freed, so that an output element a kernel forgets
to write reads as NaN in the next run, which the caching allocator hands the
same memory.

Every tk kernel is meant to be deterministic: no atomics, every reduction in
a fixed order (the split softmax combines its partials in segment order).
They must be bit-identical.  A kernel that is not (atomics: a float sum whose
order follows the scheduling) goes in the table with ``deterministic=False``
and a drift bound.

One source of variation between *processes* remains: matmul's autotuner
picks a tile configuration by timing, so two processes may run different
configurations, whose sums run in different orders.  The last test bounds the
difference between every configuration.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import triton
import tuned
from reference import TOLERANCE, rel_error

import ops  # noqa: F401  (registers torch.ops.tk.*)
from ops.cross_entropy.op import cross_entropy_with_tuning
from ops.cross_entropy.plan import TUNING as CROSS_ENTROPY_TUNING
from ops.matmul import kernels as matmul_module
from ops.matmul.plan import TUNING as MATMUL_TUNING, describe, pointer_plan
from ops.runtime import launcher
from ops.runtime.device import set_scratch_allocator, sm_count, tma_available
from ops.softmax.plan import TUNING as SOFTMAX_TUNING

tk = torch.ops.tk
RUNS = {"cpu": 3, "cuda": 5}  # the interpreter is slow, and numpy has no scheduling to vary
BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float64: torch.int64}


# Softmax planned with smaller CPU constants: rows of a few hundred columns take every design.
SMALL_SOFTMAX_BLOCKS = dataclasses.replace(
    SOFTMAX_TUNING, cpu_max_block=64, cpu_chunk=16, min_segment_chunks=2, cpu_programs=8
)
HELD_ROWS_ON_CPU = dataclasses.replace(SMALL_SOFTMAX_BLOCKS, cpu_held_rows=True)  # each program computes the partials
WITHOUT_HELD_ROWS = dataclasses.replace(SOFTMAX_TUNING, held_rows=False)  # CUDA rows past a block read x twice


def softmax_with(cpu_tuning, cuda_tuning):
    """tk.softmax planned with one Tuning on the CPU and another on CUDA, run as an eager call of the op runs it."""
    return lambda x, dim: tuned.softmax(cuda_tuning if x.is_cuda else cpu_tuning, eager=True)(x, dim)


# Cross entropy's reductions over the rows in chunks of 4 rows on CPU: many parts, as on a GPU.
SMALL_REDUCE_CHUNKS = CROSS_ENTROPY_TUNING.with_cpu(reduce_chunk=4)


def logits_and_targets(device, n_rows, n_cols):
    """Logits and targets with every 7th row ignored."""
    target = torch.randint(0, n_cols, (n_rows,), device=device)
    target[::7] = -100
    return randn(device, n_rows, n_cols), target


@dataclass(frozen=True)
class Repeat:
    name: str
    make: Callable[[str], tuple]  # device -> arguments, at a size that suits the device
    call: Callable  # the tk call: a tensor or a tuple of tensors
    deterministic: bool = True
    drift: float | None = None  # for the others: max relative norm difference to the first run


def sized(device, cpu, cuda):
    return cuda if device == "cuda" else cpu


def randn(device, *shape, dtype=torch.float32):
    return torch.randn(shape, device=device).to(dtype)


def with_grads(fn, *inputs, seed=1):
    """The output and the input gradients: the forward and backward kernels together."""
    leaves = [x.detach().requires_grad_() for x in inputs]
    out = fn(*leaves)
    gen = torch.Generator(device=out.device).manual_seed(seed)
    weight = torch.randn(out.shape, generator=gen, device=out.device).to(out.dtype)
    return (out.detach(), *torch.autograd.grad(out, leaves, weight))


SOFTMAX_DESIGNS = {  # (rows, columns) on CPU and on CUDA reaching each design, and the tunings that do it
    "one block": ((7, 50), (4096, 1024), SMALL_SOFTMAX_BLOCKS, SOFTMAX_TUNING),
    "looped": ((9, 70), (1024, 65536), SMALL_SOFTMAX_BLOCKS, WITHOUT_HELD_ROWS),
    "split rows": ((3, 200), (64, 1 << 20), SMALL_SOFTMAX_BLOCKS, WITHOUT_HELD_ROWS),
    "rows across programs": ((5, 100), (1024, 65536), HELD_ROWS_ON_CPU, SOFTMAX_TUNING),
}

REPEATS = [
    *[
        Repeat(f"gelu {approximate} {str(dtype)[6:]}",
               lambda d, dtype=dtype: (randn(d, sized(d, 4099, 1 << 26), dtype=dtype),),
               lambda x, a=approximate: with_grads(lambda t: tk.gelu(t, a), x))
        for approximate in ("none", "tanh")
        for dtype in (torch.float32, torch.bfloat16)
    ],
    *[
        Repeat(f"softmax {design} {str(dtype)[6:]}",
               lambda d, cpu=cpu, cuda=cuda, dtype=dtype: (randn(d, *sized(d, cpu, cuda), dtype=dtype),),
               lambda x, s=softmax_with(cpu_tuning, cuda_tuning): with_grads(lambda t: s(t, -1), x))
        for design, (cpu, cuda, cpu_tuning, cuda_tuning) in SOFTMAX_DESIGNS.items()
        for dtype in (torch.float32, torch.bfloat16)
    ],
    Repeat("softmax along dim 0", lambda d: (randn(d, *sized(d, (100, 3), (3001, 4099))),),
           lambda x, s=softmax_with(SMALL_SOFTMAX_BLOCKS, SOFTMAX_TUNING): with_grads(lambda t: s(t, 0), x)),
    *[
        Repeat(f"matmul {str(dtype)[6:]}",
               lambda d, dtype=dtype: (randn(d, *sized(d, (70, 130), (4096, 4096)), dtype=dtype),
                                       randn(d, *sized(d, (130, 65), (4096, 4096)), dtype=dtype)),
               lambda a, b: with_grads(tk.matmul, a, b))
        for dtype in (torch.float16, torch.bfloat16, torch.float32)
    ],
    *[
        # "mean" and "sum": each part of the rows a partial; on a GPU the last program to finish adds them up
        Repeat(f"cross_entropy {reduction}",
               lambda d: logits_and_targets(d, *sized(d, (301, 20), (131072, 100))),
               lambda x, t, r=reduction: with_grads(
                   lambda v: cross_entropy_with_tuning(v, t, reduction=r, tuning=SMALL_REDUCE_CHUNKS), x))
        for reduction in ("mean", "sum")
    ],
    Repeat("matmul batched, b broadcast", lambda d: (randn(d, *sized(d, (2, 65, 33), (8, 1000, 768)), dtype=torch.bfloat16),
                                                      randn(d, *sized(d, (33, 17), (768, 513)), dtype=torch.bfloat16)),
           lambda a, b: with_grads(tk.matmul, a, b)),
]  # fmt: skip


def _outputs(result) -> tuple:
    return result if isinstance(result, tuple) else (result,)


def _poison(tensors) -> None:
    """Fill the memory of `tensors` with 0xFF bytes (NaN in every float dtype)."""
    for t in tensors:
        t.untyped_storage().fill_(0xFF)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(BITS[a.dtype]), b.view(BITS[b.dtype]))


def repeat(call, args, runs=3) -> list[tuple]:
    """`runs` results of call(*args), each kept as a copy; each run's own output
    memory poisoned and freed before the next run."""
    results = []
    for _ in range(runs):
        out = _outputs(call(*args))
        results.append(tuple(t.clone() for t in out))
        _poison(out)
        del out
    return results


def assert_repeatable(name, results, deterministic=True, drift=None):
    first = results[0]
    for run, later in enumerate(results[1:], start=2):
        for k, (a, b) in enumerate(zip(first, later)):
            if deterministic:
                differ = (a.view(BITS[a.dtype]) != b.view(BITS[b.dtype])).sum().item()
                assert _same_bits(a, b), f"{name}: output {k} of run {run} differs from run 1 in {differ} elements"
            else:
                assert rel_error(b, a) <= drift, f"{name}: output {k} of run {run} drifts {rel_error(b, a):.2e} > {drift:.1e}"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("case", REPEATS, ids=[r.name for r in REPEATS])
def test_same_input_same_bits(case, device):
    args = case.make(device)
    results = repeat(case.call, args, RUNS[device])
    assert all(torch.isfinite(t).all() for t in results[0]), f"{case.name}: non-finite output on a finite input"
    assert_repeatable(case.name, results, case.deterministic, case.drift)


def test_every_kernel_is_in_the_table():
    """The table runs each op's forward and backward kernels at least once."""
    names = " ".join(r.name for r in REPEATS)
    for op in ("gelu", "softmax", "matmul", "cross_entropy"):
        assert op in names
    assert all(f"softmax {design}" in names for design in SOFTMAX_DESIGNS)


# ---------------------------------------------------------------------------
# The check itself can fail.
# ---------------------------------------------------------------------------


def test_the_check_catches_a_drifting_kernel():
    calls = []

    def drifting(x):  # a float sum whose order changes from run to run
        calls.append(1)
        return x * (1 + 1e-7 * len(calls))

    results = repeat(drifting, (torch.randn(100),))
    with pytest.raises(AssertionError, match="differs from run 1"):
        assert_repeatable("drifting", results)
    assert_repeatable("drifting", results, deterministic=False, drift=1e-6)
    with pytest.raises(AssertionError, match="drifts"):
        assert_repeatable("drifting", results, deterministic=False, drift=1e-8)


@pytest.mark.gpu
def test_the_check_catches_an_element_left_unwritten():
    """A kernel whose last block forgets an element: the poisoned memory shows it
    (the CUDA caching allocator gives the next run the freed block)."""

    def forgets_the_last(x):
        y = torch.empty_like(x)
        torch.mul(x[:-1], 2, out=y[:-1])  # out=: no temporary takes the freed block
        return y

    x = torch.randn(1 << 20, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # no free block left from earlier tests: run 1 gets the zeros below
    zeros = torch.zeros_like(x)
    del zeros  # a block of zeros back in the pool: run 1's output
    results = repeat(forgets_the_last, (x,), RUNS["cuda"])
    assert results[0][0][-1] == 0 and torch.isnan(results[1][0][-1])
    with pytest.raises(AssertionError, match="differs from run 1"):
        assert_repeatable("forgets the last", results)


# ---------------------------------------------------------------------------
# Between processes: matmul's autotuner may pick another tile configuration.
# ---------------------------------------------------------------------------

# The interpreter runs any tile shape: a few, to check the bound on the CPU too.
CPU_CONFIGS = [
    triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}, num_warps=4, num_stages=1)
    for m, n, k in [(64, 64, 64), (32, 32, 32), (16, 64, 16), (64, 32, 128)]
]


def _matmul_with(config, a, b):
    M, K = a.shape
    N = b.shape[1]
    plan = pointer_plan(describe(a, b), split=1)
    # C as the plan lays it out (rows padded to 16 bytes on a GPU where N's are not: its Multiples say so)
    c = torch.empty_strided((M, N), (plan.c_row_stride, 1), device=a.device, dtype=a.dtype)
    meta = {**config.kwargs, "GROUP_M": MATMUL_TUNING.group_m}  # the program order is the plan's, not a config's
    meta.update(plan.multiples.constexprs())  # the sizes' and strides' multiples
    grid = (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]), 1)
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    kernel = matmul_module.matmul_kernel if a.is_cuda else launcher(matmul_module.matmul_kernel, a)
    kernel[grid](
        a, b, c, M, N, K, 0, *a.stride(), 0, *b.stride(), 0, *c.stride(), 0, 1,  # no split K
        ALLOW_TF32=False, ACCUMULATE=False, UPCAST_OPERANDS=a.device.type != "cuda" and a.dtype == torch.bfloat16,
        **meta, **options,
    )  # fmt: skip
    return c


# Two configurations sum K in different orders, in float32: the difference is a
# few float32 roundings of the sum, far below one ulp of a half-precision output.
CONFIG_DRIFT = {torch.float16: torch.finfo(torch.float16).eps, torch.bfloat16: torch.finfo(torch.bfloat16).eps,
                torch.float32: TOLERANCE[torch.float32]}  # fmt: skip


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_matmul_tile_configurations_agree(device, dtype):
    M, N, K = sized(device, (100, 70, 300), (1000, 1031, 4096))
    a, b = randn(device, M, K, dtype=dtype), randn(device, K, N, dtype=dtype)
    configs = matmul_module.CONFIGS if device == "cuda" else CPU_CONFIGS
    results = {}
    for config in configs:
        try:
            results[str(config)] = _matmul_with(config, a, b)
        except triton.runtime.errors.OutOfResources:  # too much shared memory for this dtype: the autotuner skips it too
            continue
    assert len(results) >= 2, "fewer than two configurations ran"
    _assert_configurations_agree(results, a, b, dtype)
    assert _same_bits(tk.matmul(a, b), tk.matmul(a, b))


def _assert_configurations_agree(results: dict, a, b, dtype) -> None:
    """Each result right, and within CONFIG_DRIFT of the first."""
    first_name, first = next(iter(results.items()))
    exact = a.double() @ b.double()
    for name, c in results.items():
        assert rel_error(c, exact) <= TOLERANCE[dtype], name
        drift = rel_error(c, first)
        assert drift <= CONFIG_DRIFT[dtype], f"{name} vs {first_name}: {drift:.2e} > {CONFIG_DRIFT[dtype]:.1e}"


def _matmul_tma_with(config, a, b):
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty(M, N, device=a.device, dtype=a.dtype)
    meta = {**config.kwargs, "GROUP_M": MATMUL_TUNING.group_m}
    tiles = triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"])
    set_scratch_allocator()
    matmul_module.matmul_tma_kernel[(min(tiles, sm_count(a.device.index)),)](
        a, b, c, M, N, K, a.stride(0), b.stride(0), c.stride(0),
        A_COLUMN_MAJOR=False, B_COLUMN_MAJOR=False, C_POINTERS=False, UPCAST_OPERANDS=False, ACCUMULATE=False,
        **meta, num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return c


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_matmul_tma_configurations_agree(dtype):
    """The TMA kernel's autotune candidates (Hopper and newer) against each other and the pointer kernel."""
    a, b = randn("cuda", 1000, 4096, dtype=dtype), randn("cuda", 4096, 1032, dtype=dtype)
    if not tma_available(a.device):
        pytest.skip("needs a GPU with TMA (Hopper or newer)")
    results = {"pointer kernel": _matmul_with(matmul_module.CONFIGS[0], a, b)}
    for config in matmul_module.TMA_CONFIGS:
        results[str(config)] = _matmul_tma_with(config, a, b)
    _assert_configurations_agree(results, a, b, dtype)
