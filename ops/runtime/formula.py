"""Backward formulas that are one call of another op: one declaration, a Python and a C++ autograd."""

import functools
from typing import Any

import torch

from . import native
from .library import NAMESPACE, NATIVE_CUDA

GRAD = "grad"  # the incoming gradient (of the op's one result)
RESULT = "result"  # the op's result, saved for the backward
_INCOMING, _ARGUMENT, _RESULT, _NEEDS, _DTYPE = 0, 1, 2, 3, 4  # tokens, numbered as _native.cpp numbers them
_NO_GRADIENT, _IS_INCOMING = -2, -1


def needs_grad(name: str) -> tuple[str, str]:
    """A backward argument: whether forward argument ``name`` needs a gradient (a bool)."""
    return ("needs_grad", name)


def dtype_of(name: str) -> tuple[str, str]:
    """A backward argument: the dtype of forward tensor argument ``name`` (saved, not the tensor)."""
    return ("dtype_of", name)


def register_formula(op, *, backward=None, arguments=(), gradients: dict[str, Any]) -> None:
    """Declare ``op``'s backward as one call ``backward(*arguments)`` of another tk op
    (both as ``register_op`` returns them).

    ``arguments`` lists what that op is called with: ``GRAD``, ``RESULT``, a
    forward argument by name (saved from the forward), ``needs_grad(name)`` or
    ``dtype_of(name)``.
    ``gradients`` maps each forward argument that gets a gradient to ``GRAD``
    (the incoming gradient itself) or to the index of the backward op's
    result that is its gradient.  For example, softmax's::

        register_formula(softmax, backward=softmax_backward,
                         arguments=(GRAD, RESULT, "dim", dtype_of("x")), gradients={"x": 0})

    One declaration serves both paths.  It registers the same formula in
    Python through ``op.register_autograd`` (traced calls, the CPU), and on
    CUDA hands it to the native lane, whose C++ autograd node runs it with no
    Python on either side of the call.  An op whose backward is more than
    that (cross_entropy's, with two results) calls ``register_autograd``
    itself.
    """
    formula = Formula(op._opoverload, None if backward is None else backward._opoverload, arguments, gradients)
    op.register_autograd(formula.backward, setup_context=formula.setup_context)
    if NATIVE_CUDA:
        native.set_formula(NAMESPACE, formula.op_name, formula.native_description())


class Formula:
    """A parsed ``register_formula`` declaration: its Python formula and the native lane's description."""

    def __init__(self, op, backward, arguments, gradients: dict[str, Any]):
        schema = op._schema
        if len(schema.returns) != 1:
            raise ValueError(f"{schema.name}: register_formula is for an op with one result; use register_autograd")
        self.op_name = schema.name.split("::")[-1]
        self.backward_op = backward
        names = [a.name for a in schema.arguments]
        position = {name: i for i, name in enumerate(names)}

        def token(a) -> tuple[int, int]:
            name = a[1] if isinstance(a, tuple) else a
            if name not in position and name not in (GRAD, RESULT):
                raise ValueError(f"{schema.name}: the formula names {name!r}, not one of its arguments {names}")
            if isinstance(a, tuple):
                return (_NEEDS if a[0] == "needs_grad" else _DTYPE), position[name]
            if a == GRAD:
                return _INCOMING, 0
            return (_RESULT, 0) if a == RESULT else (_ARGUMENT, position[a])

        self.tokens = [token(a) for a in arguments]
        for name in gradients:
            token(name)
        self.gradients = [gradients.get(name) for name in names]  # per forward argument
        self.tensors = [i for kind, i in self.tokens if kind == _ARGUMENT and _is_tensor(schema.arguments[i].type)]
        self.values = [i for kind, i in self.tokens if kind == _ARGUMENT and i not in self.tensors]
        self.saves_result = any(kind == _RESULT for kind, _ in self.tokens)
        self.dtypes = [i for kind, i in self.tokens if kind == _DTYPE]

    def setup_context(self, ctx, inputs, output):
        ctx.save_for_backward(*(inputs[i] for i in self.tensors), *((output,) if self.saves_result else ()))
        ctx.values = {i: inputs[i] for i in self.values}
        ctx.dtypes = {i: inputs[i].dtype for i in self.dtypes}

    def backward(self, ctx, grad):
        saved = ctx.saved_tensors
        kept = {**dict(zip(self.tensors, saved)), **ctx.values}
        # One entry per argument the call gave: the dispatcher drops trailing ones left at their
        # defaults (a traced call's, through torch.library's autograd), which need no gradient.
        needs = ctx.needs_input_grad

        def need(i: int) -> bool:
            return i < len(needs) and needs[i]

        def argument(kind, i):
            if kind == _INCOMING:
                return grad
            if kind == _RESULT:
                return saved[-1]
            if kind == _DTYPE:
                return ctx.dtypes[i]
            return need(i) if kind == _NEEDS else kept[i]

        results = () if self.backward_op is None else self.backward_op(*(argument(k, i) for k, i in self.tokens))
        results = results if isinstance(results, (tuple, list)) else (results,)
        return tuple(
            None if g is None or not need(i) else grad if g == GRAD else results[g] for i, g in enumerate(self.gradients)
        )

    def native_description(self) -> tuple:
        """(node name, backward op, tokens, gradient codes), as ``_native.cpp``'s ``formula_from`` reads it."""
        node_name = "Tk" + "".join(part.capitalize() for part in self.op_name.split("_")) + "Backward"
        backward_name = "" if self.backward_op is None else self.backward_op._schema.name
        codes = [_NO_GRADIENT if g is None else _IS_INCOMING if g == GRAD else int(g) for g in self.gradients]
        return node_name, backward_name, self.tokens, codes


def _is_tensor(schema_type) -> bool:
    """A ``Tensor`` or ``Tensor?`` argument."""
    return schema_type.isSubtypeOf(torch._C.OptionalType(torch._C.TensorType.get()))


def keep_formulas_in_step(name: str, op) -> None:
    """A formula registered later with ``op.register_autograd`` replaces a declared one on both paths:
    the native lane forgets its copy, so calls needing a gradient go to the new Python formula."""
    if not NATIVE_CUDA:
        return
    register_autograd = op.register_autograd

    @functools.wraps(register_autograd)
    def register_autograd_and_forget(*args, **kwargs):
        native.set_formula(NAMESPACE, name, None)
        return register_autograd(*args, **kwargs)

    op.register_autograd = register_autograd_and_forget

