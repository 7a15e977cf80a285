"""The rules of rules.py, given to DTensor: ``register_sharding`` for each op, and the arguments its cache keys on.

``torch.distributed.tensor.experimental.register_sharding`` (public, experimental; in torch 2.5 and
later, so in the 2.11 of the GPU machines and the 2.13 of CI) takes a function of the op's
arguments that returns, for one mesh dim, ``(output placements, input placements)`` pairs, and
expands them over every dim of the mesh.  Two things are added here:

* **arguments by name.**  DTensor hands the rule the arguments as the call gave them, trailing ones
  left at their defaults dropped; ``_call`` binds them to the schema's names, defaults filled in,
  and turns a rule's ``{name: placement}`` into the positional list, checking that every tensor
  given has a placement (a rule that forgets one fails loudly, not with DTensor's count mismatch).
  Every op also gets the strategy that replicates everything, last (see rules.py).
* **the cache key.**  DTensor caches a call's sharding by its tensors' specs and by the non-tensor
  arguments from ``RuntimeSchemaInfo.static_argnum`` on.  ``register_sharding`` guesses that index
  as the first ``int`` argument, so a rule that reads a ``bool``, a ``str`` or an ``int[]`` before
  it (matmul_backward's ``a_grad``, layer_norm's ``normalized_shape``) would be served another
  call's answer.  Each op's strategy is registered again with the index of its first non-tensor
  argument: every non-tensor argument is part of the key.  (``register_op_strategy`` is the
  propagator's documented method; the propagator itself is reached as register_sharding reaches it.)

Nothing here needs a process group: the rules are registered at ``import ops``, and cost nothing
until a DTensor reaches a tk op.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from .rules import RULES, R


def install() -> list[str]:
    """Register every rule of rules.py with DTensor; the names of the ops registered."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
    from torch.distributed.tensor.experimental import register_sharding

    propagator = DTensor._op_dispatcher.sharding_propagator
    for name, rule in RULES.items():
        op = getattr(torch.ops.tk, name).default
        register_sharding(op)(_Call(op, rule))
        static = RuntimeSchemaInfo(static_argnum=_first_non_tensor(op), needs_pytree=False)
        propagator.register_op_strategy(op, propagator.op_strategy_funcs[op], static)
    return list(RULES)


def _first_non_tensor(op) -> int:
    """The index of the op's first argument that is not a tensor (its count if none is)."""
    for i, argument in enumerate(op._schema.arguments):
        if not _is_tensor(argument.type):
            return i
    return len(op._schema.arguments)


def _is_tensor(schema_type) -> bool:
    return schema_type.isSubtypeOf(torch._C.OptionalType(torch._C.TensorType.get()))


class _Call:
    """A rule of rules.py as register_sharding calls it: positional arguments in, placement lists out."""

    def __init__(self, op, rule):
        self.op, self.rule = op, rule
        self.arguments = op._schema.arguments
        self.names = [a.name for a in self.arguments]
        self.tensors = [a.name for a in self.arguments if _is_tensor(a.type)]
        self.n_outputs = len(op._schema.returns)
        self.__name__ = f"tk_{op._schema.name.split('::')[-1]}_sharding"

    def bind(self, args, kwargs) -> SimpleNamespace:
        """The call's arguments by name, the ones it left out at their defaults."""
        values = {}
        for i, argument in enumerate(self.arguments):
            if i < len(args):
                values[argument.name] = args[i]
            elif argument.name in kwargs:
                values[argument.name] = kwargs[argument.name]
            else:
                values[argument.name] = argument.default_value
        return SimpleNamespace(**values)

    def __call__(self, *args, **kwargs):
        a = self.bind(args, kwargs)
        given = [name for name in self.tensors if getattr(a, name) is not None]
        everything_replicated = ([R] * self.n_outputs, dict.fromkeys(given, R))
        pairs = []
        for outputs, inputs in [*self.rule(a), everything_replicated]:
            if sorted(inputs) != sorted(given) or len(outputs) != self.n_outputs:
                raise AssertionError(
                    f"the sharding rule of {self.op} places {sorted(inputs)} and {len(outputs)} results; "
                    f"the call has tensors {sorted(given)} and the op {self.n_outputs} results"
                )
            pairs.append((list(outputs), [inputs.get(name) for name in self.names]))
        return pairs


def strategies(name: str, *args, **kwargs) -> list[tuple[list, list]]:
    """The strategies ``torch.ops.tk.<name>(*args, **kwargs)`` accepts on one mesh dim, as DTensor is given
    them: ``(output placements, input placements)`` pairs, the input list in the schema's order (None for
    what is not a tensor).  The tensors may be plain tensors: a rule reads only their shapes and dtypes."""
    op = getattr(torch.ops.tk, name).default
    return _Call(op, RULES[name])(*args, **kwargs)
