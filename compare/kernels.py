"""How many kernels a call launches, from ``torch.profiler``.

On a GPU a kernel is a device activity of the profiler (kernels, and the
memcpy/memset a call issues): an unfused composition shows several, a fused
one shows one.

A CPU has no kernel launches to observe, so the count there is of the
*operations* a call runs: Inductor's C++ kernels (visible because compiled
variants are built with ``cpp.enable_kernel_profile``), ATen ops called at
the top level, and custom ops (a tk op is one, whatever it runs inside),
leaving out allocations, views and other bookkeeping.

The profiler's own chatter on the C-level stderr (the CPU build of torch
2.13 writes ``USDT:... SyncActivityProfilerHandler.cpp:52] profiler_start``
and ``..._stop`` for every session; older Kineto ``STAGE:...`` lines) is
kept off the terminal: file descriptor 2 goes to a temporary file while a
session runs, and every other line written there meanwhile is written back.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.profiler import ProfilerActivity, profile

# Kineto's log lines about a session starting and stopping: "<TAG>:<date> <time> <pid>:<tid> <file>.cpp:<line>] ...".
_PROFILER_CHATTER = re.compile(
    rb"^(USDT|STAGE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)? \d+:\d+ "
    rb"(SyncActivityProfilerHandler\.cpp:\d+\] profiler_(start|stop)"
    rb"|ActivityProfilerController\.cpp:\d+\] Completed Stage: .*)\s*$"
)

# ATen ops that launch no computation of their own.
_BOOKKEEPING = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros_like", "view", "reshape",
    "_reshape_alias", "as_strided", "expand", "t", "transpose", "permute", "unsqueeze", "squeeze", "detach",
    "alias", "lift_fresh", "resolve_conj", "resolve_neg", "set_", "resize_", "contiguous", "_unsafe_view",
    "select", "slice", "numpy_T", "result_type", "to", "_to_copy", "item", "_local_scalar_dense",
}  # fmt: skip


@dataclass
class KernelProfile:
    count: int
    names: list[str]  # one per launch of one call, in order
    device_us: dict[str, float] = field(default_factory=dict)  # name -> µs per call (device on GPU, CPU op time on CPU)
    unit: str = "kernels"


# What the profiler names a node of the autograd engine: a container, whose ops count one by one
# (a compiled function's backward runs inside one, and its fused kernels are what took the time).
_AUTOGRAD_NODE = "autograd::engine::evaluate_function:"


def _is_op(name: str) -> bool:
    return "::" in name and not name.startswith("aten::") and not name.startswith(_AUTOGRAD_NODE)


def _counts_on_cpu(event) -> bool:
    name = event.name
    if "cpp_fused" in name or "triton_" in name:
        return True
    if name.startswith("aten::"):
        return name[len("aten::") :] not in _BOOKKEEPING
    return _is_op(name)


def _cpu_launches(events) -> list:
    """Top-most counted events: nothing inside a counted op is counted again."""
    names = []
    for ev in events:
        if not _counts_on_cpu(ev):
            continue
        parent = ev.cpu_parent
        nested = False
        while parent is not None:
            if _counts_on_cpu(parent):
                nested = True
                break
            parent = parent.cpu_parent
        if not nested:
            names.append(ev)
    return names


def _is_device_event(ev) -> bool:
    return getattr(ev, "device_type", None) == torch.autograd.DeviceType.CUDA


def without_profiler_chatter(text: bytes) -> bytes:
    """``text`` less the profiler's session lines (everything else kept, in order)."""
    return b"".join(line for line in text.splitlines(keepends=True) if not _PROFILER_CHATTER.match(line))


@contextlib.contextmanager
def profiler_chatter_filtered(fd: int = 2):
    """Run the block with ``fd`` (stderr) going to a temporary file, then write back what is not the
    profiler's chatter.  Where the descriptor cannot be redirected, the block runs as it is."""
    try:
        sys.stderr.flush()
        saved = os.dup(fd)
    except (OSError, ValueError, AttributeError):
        yield
        return
    with tempfile.TemporaryFile() as held, contextlib.ExitStack() as stack:
        try:
            os.dup2(held.fileno(), fd)
        except OSError:
            os.close(saved)
            yield
            return
        stack.callback(os.close, saved)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, fd)
            held.seek(0)
            kept = without_profiler_chatter(held.read())
            if kept:
                os.write(fd, kept)


def profile_call(fn: Callable, args: tuple, device: torch.device, calls: int = 2) -> KernelProfile:
    """Profile ``calls`` calls of an already warmed-up ``fn`` and return one call's share."""
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    with profiler_chatter_filtered(), profile(activities=activities) as prof:
        for _ in range(calls):
            fn(*args)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    events = list(prof.events())
    if device.type == "cuda":
        launched = [ev for ev in events if _is_device_event(ev)]
        names = [ev.name for ev in launched]
        device_us: dict[str, float] = {}
        for ev in launched:
            device_us[ev.name] = device_us.get(ev.name, 0.0) + ev.time_range.elapsed_us() / calls
        count = len(names) // calls
        return KernelProfile(count, names[:count], device_us, "kernels")
    launched = _cpu_launches(events)
    cpu_us: dict[str, float] = {}
    for ev in launched:
        cpu_us[ev.name] = cpu_us.get(ev.name, 0.0) + ev.cpu_time_total / calls
    count = len(launched) // calls
    return KernelProfile(count, [ev.name for ev in launched[:count]], cpu_us, "ops")
