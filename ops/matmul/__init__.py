"""Matrix multiplication, 2-D or batched 3-D, any strides: ``torch.ops.tk.matmul`` and its backward.

    op.py       the registered ops: checks, which kernel takes the problem, the launches
    kernels.py  the pointer kernel, the TMA kernel (Hopper), the split-K sum
    spec.py     what the comparison harness reads

The math and the designs are described in op.py's docstring.
"""

from . import op, spec  # noqa: F401  (registers the ops and their specs)
from .op import matmul

__all__ = ["matmul"]
