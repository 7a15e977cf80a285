"""Timing one call, the way each device allows.

CUDA: ``triton.testing.do_bench``: CUDA events around each call, the L2
cache flushed (a 256 MB buffer zeroed) before every repetition, warm-up
first.  Its figure includes the host time to launch the call, which is what
a user pays for a small tensor.  For small calls we also give the CUDA-graph
replay time (``do_bench_cudagraph``, no L2 flush), the time without launch
overhead.

CPU: wall clock (``time.perf_counter``) around each call, repeated.

Steady-state times never include the first call: that one is timed apart,
since it carries the compile, the autotuning, Triton's JIT.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

CUDA_METHOD = "triton.testing.do_bench (CUDA events, L2 flushed before each repetition), pooled over interleaved rounds"
CUDAGRAPH_METHOD = "triton.testing.do_bench_cudagraph (CUDA-graph replay, no L2 flush)"
CPU_METHOD = "wall clock (time.perf_counter) around each call, repeated; not device-event timing"


@dataclass
class Samples:
    """Per-call times in milliseconds, gathered over one or more rounds."""

    ms: list[float] = field(default_factory=list)

    def add(self, more) -> None:
        self.ms.extend(float(t) for t in more)

    def quantile(self, q: float) -> float | None:
        if not self.ms:
            return None
        data = sorted(self.ms)
        pos = q * (len(data) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(data) - 1)
        return data[lo] + (data[hi] - data[lo]) * (pos - lo)

    @property
    def median(self) -> float | None:
        return statistics.median(self.ms) if self.ms else None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def first_call(fn: Callable, args: tuple, device: torch.device):
    """(output, milliseconds) of one call, the device synchronized around it."""
    synchronize(device)
    start = time.perf_counter()
    out = fn(*args)
    synchronize(device)
    return out, (time.perf_counter() - start) * 1e3


def bench_cuda(fn: Callable, args: tuple, rep_ms: float, warmup_ms: float = 25) -> list[float]:
    """All of do_bench's per-repetition times for ``fn(*args)``, in ms."""
    from triton.testing import do_bench

    call = lambda: fn(*args)  # noqa: E731
    try:
        return list(do_bench(call, warmup=warmup_ms, rep=rep_ms, return_mode="all"))
    except (AssertionError, TypeError, ValueError):  # a Triton without return_mode="all"
        return list(do_bench(call, warmup=warmup_ms, rep=rep_ms, quantiles=[0.2, 0.5, 0.8]))


def bench_cudagraph(fn: Callable, args: tuple, rep_ms: float) -> float | None:
    """Median CUDA-graph replay time in ms, or None when the call cannot be captured."""
    from triton.testing import do_bench_cudagraph

    try:
        return float(do_bench_cudagraph(lambda: fn(*args), rep=rep_ms, return_mode="median"))
    except Exception:  # capture is not possible for every call (host syncs, allocations...)
        torch.cuda.synchronize()
        return None


def bench_cpu(fn: Callable, args: tuple, budget_ms: float, min_reps: int = 3, max_reps: int = 200) -> list[float]:
    """Wall-clock times of repeated calls: at least ``min_reps``, then until the budget is spent."""
    times = []
    spent = 0.0
    while len(times) < min_reps or (spent < budget_ms and len(times) < max_reps):
        start = time.perf_counter()
        fn(*args)
        elapsed = (time.perf_counter() - start) * 1e3
        times.append(elapsed)
        spent += elapsed
    return times


def bench(fn: Callable, args: tuple, device: torch.device, rep_ms: float) -> list[float]:
    if device.type == "cuda":
        return bench_cuda(fn, args, rep_ms)
    return bench_cpu(fn, args, rep_ms)


def method(device: torch.device) -> str:
    return CUDA_METHOD if device.type == "cuda" else CPU_METHOD
