"""Cross entropy over (N, C) logits, never materializing the softmax: ``torch.ops.tk.cross_entropy``.

A call goes one way through the folder:

    op.py       the registered ops (the loss and its logsumexp; the backward; the user-facing
                composite) and their checks; ``forward`` and ``backward``, the bodies as Python
                entry points that take a ``tuning``; ``describe``, a call's Meta
    plan.py     Tuning (every constant), Meta, and choose_forward_plan / choose_backward_plan
    launch.py   run_forward / run_backward: allocate and launch what a plan says
    kernels.py  the row kernels and the sums over the rows
    spec.py     what the comparison harness reads

The math is described in op.py's docstring; the designs and which shapes take which in
docs/ops/cross_entropy.md.
"""

from . import op, spec  # noqa: F401  (registers the ops and their specs)
from .op import cross_entropy

__all__ = ["cross_entropy"]
