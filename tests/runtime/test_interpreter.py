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
    constants = dict(ALLOW_TF32=False, UPCAST_OPERANDS=False, BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8)
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
