"""Whether this thread runs an op's body eagerly, launching its kernels itself.

An eager call of a tk op (nothing traces it) runs the op's body with this flag
on: ``launcher`` then launches kernels straight through the compiled binary
instead of handing ``wrap_triton`` to a tracer, and the few rules that depend on
how a kernel is launched (a Gluon kernel, which Inductor cannot trace; a launch
that overlaps the one before) may apply.  Both the registry and the native lane
run bodies this way, so the flag lives below both.
"""

import threading
from collections.abc import Callable

import torch

_direct = threading.local()  # .on: this thread runs a body eagerly, launching kernels itself


def launching_directly() -> bool:
    """Whether this thread runs an op's body eagerly, launching kernels itself (not traced for Inductor)."""
    return getattr(_direct, "on", False)


def run_direct(body: Callable, args, kwargs):
    """Run ``body`` with its kernels launched straight through Triton."""
    previous = getattr(_direct, "on", False)
    _direct.on = True
    try:
        for a in args:
            if isinstance(a, torch.Tensor):
                index = a.get_device()  # -1 on the CPU
                if index >= 0 and index != torch._C._cuda_getDevice():
                    with torch.cuda.device(index):  # Triton launches on the current device
                        return body(*args, **kwargs)
                break
        return body(*args, **kwargs)
    finally:
        _direct.on = previous

