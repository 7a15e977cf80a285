"""Softmax along any dim, forward and backward: ``torch.ops.tk.softmax``, ``torch.ops.tk.softmax_backward``.

    op.py       the registered ops: argument checks, then a plan, then its launch
    kernels.py  Triton kernels that read rows from memory: one block, looped, split
    held.py     Triton kernels that hold rows on chip across programs
    gluon.py    the held forward in Gluon, for eager 16-bit launches on Hopper
    spec.py     what the comparison harness reads

The math and the designs are described in op.py's docstring.
"""

from . import op, spec  # noqa: F401  (registers the ops and their specs)
from .op import softmax, softmax_backward

__all__ = ["softmax", "softmax_backward"]
