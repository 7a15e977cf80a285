"""Cross entropy over (N, C) logits, never materializing the softmax: ``torch.ops.tk.cross_entropy``.

    op.py       the registered ops (the loss and its logsumexp; the backward; the user-facing
                composite), their checks, the launch configuration
    kernels.py  the row kernels and the sums over the rows
    spec.py     what the comparison harness reads

The math and the designs are described in op.py's docstring.
"""

from . import op, spec  # noqa: F401  (registers the ops and their specs)
from .op import cross_entropy

__all__ = ["cross_entropy"]
