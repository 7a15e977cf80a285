"""Matrix multiplication, 2-D or batched 3-D, any strides: ``torch.ops.tk.matmul`` and its backward.

    op.py       the registered ops: checks, then describe -> choose_plan -> run; ``forward`` and ``backward``;
                ``product_into(out, a, b, accumulate=)``: out = (or +=) a @ b in place, for sums over chunks
    plan.py     Tuning (every constant), Meta (what a call is), Plan (how it runs), describe, choose_plan
    launch.py   run(plan, a, b, out=None, accumulate=False): allocations and launches, nothing decided
    kernels.py  the pointer kernel, the TMA kernel (Hopper), the split-K sum, the autotuner's configs
    spec.py     what the comparison harness reads

The math and the designs are described in op.py's docstring; docs/ops/matmul.md has the plan table.
"""

from . import op, spec  # noqa: F401  (registers the ops and their specs)
from .op import matmul

__all__ = ["matmul"]
