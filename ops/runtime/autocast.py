"""torch.autocast: the cast PyTorch makes for the op a tk op stands in for."""

from collections.abc import Callable

import torch

from . import native
from .library import LIBRARY, NAMESPACE, NATIVE_CUDA

LOWER_PRECISION = "lower_precision"  # floating inputs in the autocast dtype, as for torch.matmul
FLOAT32 = "float32"  # floating inputs in float32: PyTorch's float32 list, as for F.layer_norm on CUDA
# FLOAT32 but for the first input, which comes as it is, and an unset `dtype` argument
# set to float32: for ops whose kernels widen a 16-bit input themselves and write a
# float32 result, so that the copy a cast would make is never made.  torch.softmax on
# CUDA (PyTorch's fp32_set_opt_dtype, with no other input) and the norms (on the float32
# list: their weights and biases are cast, as FLOAT32 casts them; they are small).
FLOAT32_RESULT = "float32_result"
_POLICIES = (LOWER_PRECISION, FLOAT32, FLOAT32_RESULT)
POLICIES: dict[str, dict[str, str]] = {}  # each op's policy per device type, as follow_autocast was given it


def follow_autocast(name: str, policies: dict[str, str]) -> None:
    """Under ``torch.autocast``, cast ``tk.<name>``'s inputs as PyTorch casts its own op's.

    ``policies`` maps a device type to LOWER_PRECISION, FLOAT32 or
    FLOAT32_RESULT (for an op with a ``dtype`` argument, whose kernels widen
    the first input themselves), copied from the
    lists PyTorch keeps per device (aten/src/ATen/autocast_mode.cpp); a
    device type left out runs the inputs as they come, as PyTorch does for an
    op on neither list.  Without this, an autocast model breaks at its first tk
    op: ``tk.matmul`` of an activation autocast left in bfloat16 and a float32
    weight is a dtype mismatch.  As in PyTorch, float64 tensors and tensors on
    another device are not cast, and the cast is differentiable, so gradients
    reach float32 weights in float32.  The kernel sits at the
    ``Autocast<Device>`` key, which the dispatcher visits only while autocast
    is on: other calls pay nothing."""
    op = getattr(getattr(torch.ops, NAMESPACE), name).default
    POLICIES[name] = dict(policies)
    for device_type, policy in policies.items():
        if policy not in _POLICIES:
            raise ValueError(f"tk.{name}: unknown autocast policy {policy!r} for {device_type}")
        if policy == FLOAT32_RESULT and _dtype_position(op) is None:
            raise ValueError(f"tk.{name}: autocast policy {policy!r} needs a `dtype` argument, and {op._schema} has none")
        if not torch._C._is_autocast_available(device_type):
            raise ValueError(f"tk.{name}: torch.autocast has no {device_type!r} device type")
        if device_type == "cuda" and NATIVE_CUDA:  # the same casts in C++ (see _native.cpp)
            native.register_autocast(NAMESPACE, name, device_type, policy)
            continue
        LIBRARY.impl(name, _autocast_kernel(op, device_type, policy), autocast_key(device_type), with_keyset=True)


def autocast_key(device_type: str) -> str:
    """The dispatch key autocast kernels of ``device_type`` sit at: AutocastCUDA, AutocastCPU..."""
    return "Autocast" + torch._C._dispatch_key_for_device(device_type)


def _autocast_kernel(op, device_type: str, policy: str) -> Callable:
    """The casts in Python: cast (or set the dtype), then call ``op`` with autocast's key excluded,
    as PyTorch's kernels do."""
    key = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, autocast_key(device_type)))
    dtype_at = _dtype_position(op)

    def kernel(keyset, *args, **kwargs):
        dtype = torch.get_autocast_dtype(device_type) if policy == LOWER_PRECISION else torch.float32
        first = ()
        if policy == FLOAT32_RESULT:  # the first argument as it comes, a float32 result asked for
            args, kwargs = _set_float32_dtype(args, kwargs, dtype_at, device_type)
            first, args = args[:1], args[1:]
        args = [*first, *(_autocast(a, device_type, dtype) for a in args)]
        kwargs = {k: _autocast(v, device_type, dtype) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(key):
            return op(*args, **kwargs)

    return kernel


def _dtype_position(op) -> int | None:
    """Where ``op``'s ``dtype`` argument is, if it has one."""
    names = [a.name for a in op._schema.arguments]
    return names.index("dtype") if "dtype" in names else None


def _set_float32_dtype(args, kwargs, at: int, device_type: str):
    """FLOAT32_RESULT: if the first argument is a tensor autocast would cast and no dtype is
    given, ask for float32.  (The dispatcher leaves out trailing arguments at their defaults,
    so an unset dtype may be missing from ``args``.)"""
    if not (args and _eligible(args[0], device_type)):  # float64, another device: as given
        return args, kwargs
    if len(args) > at:
        if args[at] is None:
            args = (*args[:at], torch.float32, *args[at + 1 :])
    elif kwargs.get("dtype") is None:
        kwargs = {**kwargs, "dtype": torch.float32}
    return args, kwargs


def _autocast(value, device_type: str, dtype: torch.dtype):
    """An argument as autocast hands it to an op: floating tensors on its device in ``dtype``, float64 kept."""
    if _eligible(value, device_type):
        return value.to(dtype)
    return value


def _eligible(value, device_type: str) -> bool:
    """Whether autocast casts ``value``: a floating tensor on its device, not float64."""
    return (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dtype != torch.float64
        and value.device.type == device_type
    )
