"""The loss of a linear layer followed by cross entropy, without its logits: ``torch.ops.tk.linear_cross_entropy``.

A call goes one way through the folder:

    op.py       the registered ops (the forward, with the gradients it is asked for; the backward
                of reduction="none"; the user-facing composite) and their checks; ``forward`` and
                ``backward``, the bodies as Python entry points that take a ``tuning``;
                ``describe``, a call's Meta
    plan.py     Tuning (every constant), Meta, and choose_plan: the chunk of rows, the logits
                buffer, the row kernel's launch, how the weight gradient is summed
    launch.py   run: the chunks, each its GEMMs (cuBLAS, through torch) and its row kernel
    kernels.py  the row kernel: a chunk's losses and its logits' gradient, in place; and the row
                kernels of one vocabulary shard
    shard.py    the ops of one vocabulary shard (its stats of every row, its gradients)
    vocab_parallel.py  the loss of a vocabulary-sharded DTensor weight (tensor parallelism's lm_head):
                the shards' stats exchanged, the weight never gathered
    spec.py     what the comparison harness reads

The math is in op.py's docstring; the design, the chunk rule and its curve in
docs/ops/linear_cross_entropy.md.
"""

from . import op, shard, spec  # noqa: F401  (registers the ops and their specs)
from .op import linear_cross_entropy

__all__ = ["linear_cross_entropy"]
