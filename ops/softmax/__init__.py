"""Softmax along any dim, forward and backward: ``torch.ops.tk.softmax``, ``torch.ops.tk.softmax_backward``.

    y = exp(x - max(x)) / sum(exp(x - max(x)))          along `dim`
    dx = y * (dy - sum(dy * y))                          its backward

A tensor is seen as (outer, n_cols, inner) around `dim`: each of the
outer * inner rows is reduced on its own, its elements `inner` apart in
memory (inner == 1 for the last dim, the common case, which Triton
specializes away).

Four designs, picked by row length, row count, dtype and device (plan.py):
* the row fits in one block: a program loads a tile of whole rows once (one
  row, for rows of thousands of columns; several stacked, for short ones),
  reduces each row in registers and writes it: one read and one write per
  element, the minimum;
* longer rows (no limit on the length), enough of them to fill the GPU: one
  program per row runs an *online* softmax.  The first pass keeps a running
  maximum and a running sum, rescaling the sum by exp(old_max - new_max)
  whenever the maximum grows, so max and sum come out of a single sweep; the
  second pass writes exp(x - max) / sum;
* longer rows, too few of them (64 rows of 2**20 columns would leave most
  SMs idle): *split rows*.  Each row is cut into segments and two kernels
  run over a (row, segment) grid.  The first computes each segment's online
  (max, sum) into a small scratch tensor; the second combines the partials
  of its row, M = max(m_i) and S = sum(s_i * exp(m_i - M)), the same
  rescaling as the online sum, and writes its segment.  The backward splits
  the same way: partial sums of dy * y, then dx.
* on CUDA, rows longer than a block are usually *held on chip across
  programs* instead (held.py; the protocol: ops/blocks/held_rows.py): each
  program of a persistent grid keeps one segment of a row in registers,
  publishes its partial, waits until every segment of the row has published
  (each partial one word, its own flag), combines the partials and writes
  its segment from the registers.  Float32 rows and every backward publish a
  round ahead ("lagged"): a program publishes the partial of its next row
  before it waits for this row's, so the wait overlaps a round of work.  x is
  read once, as in the one-block design, where the two designs above read it
  twice (an H100's L2 does not keep the first read: 60-70% of copy
  bandwidth).  The programs of a row must run at the same time, so the grid
  is sized to what fits on the GPU at once; a program that waits too long
  computes the missing partials itself, so the result never depends on
  scheduling and the kernel cannot hang.  Eager 16-bit forwards of aligned
  rows on Hopper take the same design written in Gluon (gluon.py), with the
  next segment staged in shared memory; the longest of them publish a round
  ahead too, from segments held in shared memory.

Precision: sums in float32 (float64 for float64 inputs).  On a GPU exp runs
as the hardware's exp2 with subnormals flushed (ops/blocks/fastmath.py):
values of y under 2**-126 (1.2e-38) come out 0, where torch.softmax keeps
them as subnormals; the interpreter (CPU) keeps them too.

    op.py       the registered ops: argument checks, describe (the call's Meta), then plan and launch
    plan.py     Tuning (every constant, with its measurement), Meta, the Plans, choose_plan
    launch.py   run(plan, tensors): scratch and launches, nothing decided
    kernels.py  Triton kernels that read rows from memory: one block, looped, split
    held.py     Triton kernels that hold rows on chip across programs
    gluon.py    the held forwards in Gluon, for eager 16-bit launches on Hopper (the only Gluon import)
    spec.py     what the comparison harness reads

docs/ops/softmax.md maps the designs, the plan table and how to change them.
"""

from . import op, spec  # noqa: F401  (registers the ops and their specs)
from .op import softmax, softmax_backward

__all__ = ["softmax", "softmax_backward"]
