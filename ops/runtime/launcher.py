"""``launcher(kernel, like)``: a kernel launched on whatever device ``like`` lives on.

CUDA: ``wrap_triton(kernel)``, which Inductor can trace, or, inside an eager
call, the kernel launched directly through its compiled binary (launch.py).
CPU: the same kernel run by Triton's interpreter (interpreter.py).  Fake or
meta tensors: nothing runs.
"""

import torch
from torch._subclasses.fake_tensor import is_fake
from torch.library import wrap_triton

from .direct import launching_directly
from .interpreter import InterpretedKernel
from .launch import FastKernel, fast_kernel, spoil_recording


class _SkipLaunch:
    """Stands in for a kernel when the tensors are fake: shapes only, no data."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


_SKIP = _SkipLaunch()
_interpreted: dict[int, InterpretedKernel] = {}


def launcher(kernel, like: torch.Tensor):
    """What to index with a grid to launch ``kernel`` on ``like``'s device.

    CUDA: ``wrap_triton(kernel)``, which Inductor can trace, or, inside an
    eager shortcut, the kernel launched directly (see ``_launch.py``).
    CPU: the same kernel run by Triton's interpreter.  Fake or meta tensors:
    nothing runs.
    """
    if like.device.type == "cuda":
        if not launching_directly():
            return wrap_triton(kernel)
        fast = fast_kernel(kernel)
        if not isinstance(fast, FastKernel):
            spoil_recording(f"{kernel} launches through Triton's own path")
        return fast
    if like.device.type == "meta" or is_fake(like):
        return _SKIP
    spoil_recording("a kernel run by Triton's interpreter")
    found = _interpreted.get(id(kernel))
    if found is None:
        found = _interpreted[id(kernel)] = InterpretedKernel(kernel)
    return found

