"""tk ops on DTensors: a sharding rule for every op, forward and backward.

PyTorch goes past one device with ``torch.distributed``: FSDP2 (``fully_shard``) and tensor
parallelism through DTensor (``parallelize_module``).  A custom op meets a DTensor only through a
sharding rule; this package gives every ``torch.ops.tk`` op one, so a tk op given DTensors returns
DTensors with the right placements and gathers nothing it does not need:

    rules.py     each op's rule: the placements it runs on (pure functions of the call)
    install.py   the rules given to DTensor (``register_sharding``), keyed on the right arguments

``import ops`` registers them (nothing when this torch has no ``torch.distributed``); no process
group is needed until a DTensor is made.  docs/distributed.md says which op keeps which placement
and what each asks DTensor to redistribute; tests/distributed/ proves every rule on two CPU
processes (gloo).
"""

import torch

from .. import cross_entropy, gelu, linear_cross_entropy, matmul, norms, rope, softmax, swiglu, tour  # noqa: F401

RULED: list[str] = []  # the ops given a rule (empty without torch.distributed)

if torch.distributed.is_available():
    from .install import install

    RULED = install()
