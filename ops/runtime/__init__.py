"""The runtime below the ops: what publishes a Triton body as ``torch.ops.tk.<name>`` and launches its kernels.

An op file reaches the runtime through this surface only:

* ``register_op(name, body)``: the body becomes ``torch.ops.tk.<name>`` (registry.py);
* ``register_formula(op, backward=..., arguments=..., gradients=...)`` with ``GRAD``,
  ``RESULT``, ``needs_grad``, ``dtype_of``: a backward that is one call of another op (formula.py);
* ``follow_autocast(name, policies)`` with ``LOWER_PRECISION``, ``FLOAT32``, ``FLOAT32_RESULT``
  (autocast.py);
* ``launcher(kernel, like)[grid](...)``: every launch (launcher.py), and ``launching_directly()``
  (direct.py): whether this call is eager, which decides nothing but how a kernel may be launched;
  ``run_direct(body, args, kwargs)`` runs a body as an eager call of its op does (a spec's call of an
  entry point with another tuning, launched as the registered op launches); ``is_traced(args)``:
  whether anything but eager PyTorch sees a call (registry.py);
* the argument checks (checks.py) and the facts about a device (device.py).

Below it, and private to it: the fast launch of eager CUDA calls (launch.py), the
native lane that replays them from C++ (native.py, native.cpp) and Triton's
interpreter for CPU tensors (interpreter.py).  docs/design.md draws the layers.
"""

from .autocast import FLOAT32, FLOAT32_RESULT, LOWER_PRECISION, autocast_key, follow_autocast
from .checks import (
    FLOAT_DTYPES,
    check_same,
    check_tensor,
    is_dense,
    is_fake,
    on_cuda,
    promoted_float,
    reads_as_float32,
    result_dtype,
)
from .device import (
    H100,
    H200,
    INTERPRETER,
    ByKind,
    DeviceFacts,
    cuda_capability,
    device_facts,
    kind,
    resident_programs_per_sm,
    set_scratch_allocator,
    sm_count,
    tma_available,
)
from .direct import launching_directly, run_direct
from .formula import GRAD, RESULT, dtype_of, needs_grad, register_formula
from .launcher import launcher
from .library import NAMESPACE, NATIVE_CUDA
from .registry import is_traced, register_op

__all__ = [
    "ByKind", "DeviceFacts", "FLOAT32", "FLOAT32_RESULT", "H100", "H200", "INTERPRETER", "FLOAT_DTYPES", "GRAD", "LOWER_PRECISION", "NAMESPACE", "NATIVE_CUDA", "RESULT",
    "autocast_key", "check_same", "check_tensor", "cuda_capability", "device_facts", "dtype_of", "follow_autocast", "is_dense",
    "is_fake", "is_traced", "kind", "launcher", "launching_directly", "needs_grad", "on_cuda", "promoted_float", "reads_as_float32", "register_formula",
    "register_op", "resident_programs_per_sm", "result_dtype", "run_direct", "set_scratch_allocator", "sm_count",
    "tma_available",
]  # fmt: skip
