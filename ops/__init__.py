"""tk ops: hand-written Triton kernels registered as ``torch.ops.tk.*``.

``import ops`` imports every module of this package, and each module
registers its op(s) and the spec the comparison harness reads.  Adding an
op is adding one file here.
"""

import importlib
import pkgutil

from ._registry import SPECS, OpSpec

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")


def get_spec(name: str) -> OpSpec:
    """The spec of op ``name``; a clear error listing the known ops otherwise."""
    try:
        return SPECS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; known ops: {', '.join(sorted(SPECS))}") from None


__all__ = ["SPECS", "OpSpec", "get_spec"]
