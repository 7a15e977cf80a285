"""Models compared as a whole, beside the single ops.

A model in ``examples/`` that defines a module-level ``SPEC`` (an ``OpSpec``)
is compared like an op: ``python -m compare --op gpt_block``.  Its spec's
callables are one training step (forward and backward) of the model built
from PyTorch ops (``reference``), from hand-written compositions
(``unfused``) and from tk ops (``tk``); the harness times them, checks them
against the float64 step and profiles them, and the report breaks each
variant's time down by kernel (``compare.breakdown``).

Models stay out of ``ops.SPECS``: that registry is the ops', and
``--op all`` means every op.  A model is run by its name.
"""

from __future__ import annotations

import importlib
import pkgutil

from ops import OpSpec


def model_specs() -> dict[str, OpSpec]:
    """The spec of every example model, by name (imports each module of ``examples``)."""
    import examples

    found: dict[str, OpSpec] = {}
    for module in pkgutil.iter_modules(examples.__path__):
        if module.name.startswith("_"):
            continue
        spec = getattr(importlib.import_module(f"examples.{module.name}"), "SPEC", None)
        if isinstance(spec, OpSpec):
            found[spec.name] = spec
    return found
