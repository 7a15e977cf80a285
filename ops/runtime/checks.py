"""Argument checks shared by the ops: clear errors, naming the op and the argument, before any kernel runs."""

import torch
from torch._subclasses.fake_tensor import is_fake as _is_fake

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
SUPPORTED_DEVICES = ("cuda", "cpu", "meta")


def check_tensor(op: str, arg: str, t, dtypes=FLOAT_DTYPES, ndims=None) -> None:
    """Raise TypeError/ValueError naming ``op``'s argument ``arg`` if ``t`` does not fit."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"tk.{op}: {arg} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"tk.{op}: {arg} has dtype {_name(t.dtype)}; supported: {_names(dtypes)}")
    if t.device.type not in SUPPORTED_DEVICES:
        raise ValueError(f"tk.{op}: {arg} is on device {t.device}; tk ops run on cuda and cpu")
    if ndims is not None and t.dim() not in ndims:
        want = " or ".join(str(n) for n in ndims)
        raise ValueError(f"tk.{op}: {arg} must be {want}-D, got a {t.dim()}-D tensor of shape {tuple(t.shape)}")


def result_dtype(op: str, arg: str, dtype: torch.dtype | None, default: torch.dtype) -> torch.dtype:
    """A ``dtype`` argument asking for a result's dtype: ``default`` if None, else a floating dtype."""
    if dtype is None:
        return default
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"tk.{op}: {arg} {_name(dtype)} is not a floating dtype; supported: {_names(FLOAT_DTYPES)}")
    return dtype


def promoted_float(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    """``torch.promote_types(a, b)`` for two of FLOAT_DTYPES, in Python.  torch.promote_types is an aten op:
    a body that calls it is seen calling one, which the native lane cannot replay (rope's every call took
    the Python path for it, 111 against 12 us a call; docs/perf-notes.md, version 60b)."""
    if a == b:
        return a
    if torch.float64 in (a, b):
        return torch.float64
    return torch.float32  # float32 beside a 16-bit dtype, or float16 beside bfloat16


def reads_as_float32(x_dtype: torch.dtype, dtype: torch.dtype) -> bool:
    """Whether a result asked for in `dtype` can come from an x of `x_dtype` read as it is: a 16-bit
    x into float32.  tk's kernels compute 16-bit inputs in float32, so casting x first (what a
    `dtype` argument means in PyTorch, and autocast's cast) gives the same bits for 8 more
    bytes an element."""
    return dtype == torch.float32 and x_dtype in (torch.float16, torch.bfloat16)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _names(dtypes) -> str:
    return ", ".join(map(_name, dtypes))


def check_same(op: str, tensors: dict[str, torch.Tensor]) -> None:
    """All tensors on one device and of one dtype."""
    (first_name, first), *rest = tensors.items()
    for name, t in rest:
        if t.device != first.device:
            raise ValueError(f"tk.{op}: {first_name} is on {first.device} but {name} is on {t.device}")
        if t.dtype != first.dtype:
            raise TypeError(f"tk.{op}: {first_name} has dtype {first.dtype} but {name} has dtype {t.dtype}")


def is_dense(t: torch.Tensor) -> bool:
    """True if ``t``'s elements fill one contiguous span of memory (any order)."""
    return t.is_contiguous() or torch._prims_common.is_non_overlapping_and_dense_or_false(t)


def on_cuda(t: torch.Tensor) -> bool:
    return t.device.type == "cuda"


def is_fake(t: torch.Tensor) -> bool:
    """Whether `t` is a fake tensor (traced: no data, no readable pointer).  A plain tensor is
    answered without torch's check, which costs 1-3 µs a call on the host."""
    return type(t) is not torch.Tensor and _is_fake(t)
