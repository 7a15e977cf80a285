"""Debugging a kernel: act for chosen programs only, and check a kernel's inputs before it launches.

On CPU tensors tk's kernels run in Triton's interpreter (ops/runtime/interpreter.py): numpy
evaluates the kernel's Python once per program of the grid, so plain Python works inside a
kernel there: ``print``, ``breakpoint()``, a debugger's commands.  A grid has thousands of
programs, though, and a breakpoint hit in each of them is no help.  These act only when the
program running matches ``pid``:

    print_if("offsets", offsets, mask, pid=0)           # program 0 of axis 0 prints its offsets and mask
    breakpoint_if(pid=(3, None))                        # stops in program 3 of axis 0, any program of axis 1
    print_if("last rows", rows, pid=(range(60, 64),))   # programs 60 to 63

``pid`` is an int (axis 0), or a tuple with an entry per axis: an int, any container of ints
(a range, a set), or None for any program.  Values print as numpy arrays (``to_numpy``).

They are plain Python, not ``@triton.jit`` functions: a kernel that calls one runs under the
interpreter only (Triton's compiler refuses the call), so they are for the time of a
debugging session.  docs/debugging.md walks through one, and tests/workbench runs it.

``check_inputs_ready`` is the other half: before a launch, every tensor is a tensor, on one
device tk launches on, and contiguous where the kernel indexes it as if it were, with an
error that names the argument and says what to do.
"""

from __future__ import annotations

import sys

import numpy as np
import torch


def _interpreter_builder():
    from triton.runtime import interpreter

    return interpreter.interpreter_builder


def program_ids() -> tuple[int, int, int]:
    """The (axis 0, 1, 2) ids of the program the interpreter is running."""
    ids = getattr(_interpreter_builder(), "grid_idx", None)
    if ids is None:
        raise RuntimeError("program_ids(): no kernel is running in Triton's interpreter (CPU tensors) here")
    return tuple(int(i) for i in ids)


def _matches(want, have: int) -> bool:
    if want is None:
        return True
    if isinstance(want, int):
        return have == want
    return have in want


def selected(pid) -> bool:
    """Whether the running program matches ``pid`` (see the module's docstring)."""
    wanted = pid if isinstance(pid, tuple) else (pid,)
    return all(_matches(want, have) for want, have in zip(wanted, program_ids()))


def to_numpy(value):
    """A value inside an interpreted kernel (a block, a scalar) as numpy: what its program holds."""
    handle = getattr(value, "handle", None)
    data = getattr(handle, "data", None)
    if isinstance(data, np.ndarray):
        if data.dtype == np.uint16 and "bf16" in str(getattr(value, "dtype", "")):  # bfloat16 is kept as bits
            data = (data.astype(np.uint32) << 16).view(np.float32)
        return data
    return value


def _shown(value) -> str:
    value = to_numpy(value)
    if isinstance(value, np.ndarray):
        return np.array2string(value.squeeze() if value.size == 1 else value, threshold=16, max_line_width=120)
    return str(value)


def print_if(label: str, *values, pid=0, file=None) -> None:
    """Print ``label`` and ``values`` (as numpy) in the programs ``pid`` selects, with the program's ids."""
    if not selected(pid):
        return
    shown = " ".join(_shown(v) for v in values)
    print(f"[pid {program_ids()}] {label}: {shown}".rstrip(), file=file or sys.stdout, flush=True)


def breakpoint_if(pid=0) -> None:
    """``breakpoint()`` in the programs ``pid`` selects: the debugger opens in the kernel's own frame."""
    if selected(pid):
        frame = sys._getframe(1)  # the kernel's frame, not this one
        import pdb

        pdb.Pdb().set_trace(frame)


# --------------------------------------------------------------------------
# Before a launch.
# --------------------------------------------------------------------------

DEVICES = ("cuda", "cpu")


def check_inputs_ready(kernel: str, contiguous: bool = True, **tensors) -> None:
    """Raise a clear error unless every tensor in ``tensors`` is ready for ``kernel``: a torch.Tensor, on CUDA
    (compiled) or the CPU (Triton's interpreter), all on one device, and contiguous when ``contiguous``
    (a kernel that computes offsets as ``row * n_cols + col`` reads the wrong elements of a strided view)."""
    first = None
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{kernel}: {name} is a {type(t).__name__}, not a torch.Tensor")
        if t.device.type not in DEVICES:
            raise ValueError(f"{kernel}: {name} is on {t.device}; a Triton kernel runs on cuda (compiled) or cpu"
                             " (Triton's interpreter)")  # fmt: skip
        if first is None:
            first = (name, t.device)
        elif t.device != first[1]:
            raise ValueError(f"{kernel}: {first[0]} is on {first[1]} but {name} is on {t.device}: one launch reads"
                             f" one device's memory; move them together ({name}.to({str(first[1])!r}))")  # fmt: skip
        if contiguous and not t.is_contiguous():
            raise ValueError(f"{kernel}: {name} is not contiguous (shape {tuple(t.shape)}, strides {tuple(t.stride())}):"
                             f" a kernel indexing it as contiguous reads the wrong elements; pass {name}.contiguous(),"
                             " or give the kernel the strides")  # fmt: skip
