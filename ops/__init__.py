"""tk ops: hand-written Triton kernels registered as ``torch.ops.tk.*``.

``import ops`` imports every module and package of this one: each op's file
(or folder) registers its op(s) and the spec the comparison harness reads.
Adding an op is adding one file (or folder) here; docs/design.md is the map.
"""

import importlib
import pkgutil

from .spec import SPECS, OpSpec, get_spec

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")


from .patching import patch, unpatch  # noqa: E402  (after the loop: ops.patch is the function)

__all__ = ["SPECS", "OpSpec", "get_spec", "nn", "patch", "unpatch"]
