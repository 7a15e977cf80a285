"""The CPU path (Triton's interpreter) must leave the process able to compile for CUDA.

An interpreted launch patches ``triton.language`` for its duration.  A Triton
module imported for the first time inside that window keeps the patched
objects for good: Triton's code generator, imported lazily, maps the builtin
``min`` to ``tl.core.builtin_min`` when it is imported, and with the patched
one every later CUDA compile of a kernel using ``min`` failed with
"'ir.value' object has no attribute 'data'".  These tests run in a fresh
process, since the module that was at fault is imported once per process.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_CPU_THEN_CUDA_FRONT_END = textwrap.dedent(
    """
    import torch
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend
    from triton._C.libtriton import ir

    import ops
    from ops.matmul.kernels import matmul_kernel

    # CPU tensors: every launch below runs in Triton's interpreter.
    a = torch.randn(37, 29, requires_grad=True)
    b = torch.randn(29, 41, requires_grad=True)
    torch.ops.tk.matmul(a, b).sum().backward()
    torch.ops.tk.softmax(torch.randn(4, 9), -1)
    torch.ops.tk.gelu(torch.randn(33), "tanh")

    from triton.compiler.code_generator import CodeGenerator
    assert CodeGenerator.builtin_namespace["min"] is tl.core.builtin_min, "the code generator kept a patched min"

    # The front end of a CUDA compile (Triton source to IR) needs no GPU.
    signature = {name: "i32" for name in matmul_kernel.arg_names}
    signature.update(a_ptr="*bf16", b_ptr="*bf16", c_ptr="*bf16")
    constants = dict(ALLOW_TF32=False, UPCAST_OPERANDS=False, ACCUMULATE=False, BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8)
    constants.update({name: 1 for name in matmul_kernel.arg_names if name.endswith("_MULTIPLE")})
    signature.update({name: "constexpr" for name in constants})
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    source = ASTSource(matmul_kernel, signature, constants)
    module = source.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(), context)
    assert "tt.dot" in str(module)
    print("front end built")
    """
)


def test_a_cuda_compile_after_cpu_launches_in_a_fresh_process():
    done = subprocess.run(
        [sys.executable, "-c", _CPU_THEN_CUDA_FRONT_END], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "front end built" in done.stdout


# ---------------------------------------------------------------------------
# Casts to and from bfloat16 in the interpreter (ops/runtime/interpreter.py).
# ---------------------------------------------------------------------------


def _cast_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def cast_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask).to(y_ptr.dtype.element_ty), mask=mask)

    return cast_kernel


def test_bfloat16_rounding_is_pytorchs_bit_for_bit():
    """Round to the nearest, ties to even, as the GPU and PyTorch do, from float32 and from float64
    (once, not through float32), subnormals, the edge of the range and the specials included."""
    import numpy as np
    import torch

    from ops.runtime.interpreter import bfloat16_bits, bfloat16_values

    rng = np.random.default_rng(0)
    edges = [0.0, -0.0, np.inf, -np.inf, 3.3895313892515355e38, 3.39e38, 9.2e-41, 2.0**-133, 2.0**-134, 3 * 2.0**-135]
    for dtype in (np.float32, np.float64):
        x = np.concatenate([rng.standard_normal(20000) * 10.0 ** rng.integers(-45, 39, 20000), edges]).astype(dtype)
        expected = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        assert np.array_equal(bfloat16_bits(x), expected), dtype
        assert np.isnan(bfloat16_values(bfloat16_bits(np.array([np.nan], dtype)))).all()
    bits = np.arange(1 << 16, dtype=np.uint16)
    values = bfloat16_values(bits)
    expected = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).float().numpy()
    assert np.array_equal(values, expected, equal_nan=True)


def test_casts_to_and_from_bfloat16_keep_the_value_on_the_cpu():
    """The interpreter keeps bfloat16 as its bits, truncated float32 to it (65504 became 65280, the
    GPU gives 65536), and converted every other pair with numpy's astype of the bits: float64 3.0
    came out as the bfloat16 of bits 3 (about 3e-40)."""
    import torch

    from ops.runtime import launcher

    kernel = _cast_kernel()
    values = torch.tensor([3.0, -0.15625, 1e-3, 65504.0, -2.5e8, 0.0, 1.0 + 3 * 2**-9], dtype=torch.float64)
    for src, dst in [(torch.float64, torch.bfloat16), (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32),
                     (torch.bfloat16, torch.float64), (torch.float16, torch.bfloat16),
                     (torch.bfloat16, torch.float16), (torch.int32, torch.bfloat16), (torch.bfloat16, torch.int32)]:  # fmt: skip
        x = values.to(src)
        y = torch.empty(len(values), dtype=dst)
        launcher(kernel, x)[(1,)](x, y, len(values), BLOCK=8)
        assert torch.equal(y, x.to(dst)), (src, dst, y, x.to(dst))


def test_ops_that_cast_float64_to_bfloat16_inside_a_kernel_are_right_on_the_cpu():
    """The two calls that returned wrong answers through that cast: softmax's backward of a bfloat16 x
    softmaxed in float64 (dx came back 0), and the loss of float64 logits asked for in bfloat16 (~1e-40)."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(4, 37, dtype=torch.bfloat16, requires_grad=True)
    y = torch.ops.tk.softmax(x, -1, torch.float64)
    grad = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, grad)
    y64 = torch.softmax(x.detach().double(), -1)
    expected = y64 * (grad - (grad * y64).sum(-1, keepdim=True))
    assert dx.dtype == torch.bfloat16 and ((dx.double() - expected).norm() / expected.norm()) < 1e-2

    logits, target = torch.randn(8, 11, dtype=torch.float64), torch.randint(0, 11, (8,))
    loss = torch.ops.tk.cross_entropy(logits, target, dtype=torch.bfloat16)
    expected = F.cross_entropy(logits, target)
    assert loss.dtype == torch.bfloat16 and abs(loss.double() - expected) <= 2**-8 * expected
