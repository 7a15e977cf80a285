"""Timing one call, the way each device allows.

CUDA: ``triton.testing.do_bench``: CUDA events around each call, the L2
cache flushed (a 256 MB buffer zeroed) before every repetition, warm-up
first.  Its figure includes the host time to launch the call, which is what
a user pays for a small tensor.  For calls under 250 µs
(``runner.CUDAGRAPH_BELOW_MS``) we also give the CUDA-graph replay time,
the time without launch overhead, pooled over interleaved rounds too.  A
graph replays too fast for an L2 flush between calls, so the graph calls
the op in turn on *copies* of its inputs, enough of them to fill twice the
L2 cache: each call then reads its inputs from DRAM, as after a flush.
(Without that, a 32 MB weight read by a decoding matmul would stay in the
H100's 50 MB L2 from one replay to the next and read at L2 speed.)

CPU: wall clock (``time.perf_counter``) around each call, repeated.

Steady-state times never include the first call: that one is timed apart,
since it carries the compile, the autotuning, Triton's JIT.

A time is *stable* (``is_stable``) when p80 / p20 of its calls is at most
``UNSTABLE_SPREAD`` and it rests on ``MIN_SAMPLES`` calls or more; the pages
mark every figure that is not (``record.FLAGS``).  On an H100 a call of
tens of µs or more keeps p80/p20 near 1.01; a launch-bound call of a few µs
spreads by the host's jitter (its CUDA-graph time is the figure to read), and
a loaded 2-core CPU by 5x.

Peak memory (``peak_bytes``): what the CUDA caching allocator held above
the inputs at the peak of one call, its statistics reset just before.  A CPU
has no such allocator (the CPU allocator keeps no peak), so it is not
measured there.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

CUDA_METHOD = (
    "triton.testing.do_bench (CUDA events, L2 flushed before each repetition), pooled over interleaved rounds;"
    " calls under 250 µs also as CUDA-graph replays over rotating copies of the inputs (cold L2), in the same rounds"
)
GRAPH_MAX_COPIES = 256  # inputs under (2 x L2) / 256, about 400 KB on an H100, stay partly in L2
GRAPH_CALLS = 100  # calls per graph at least: a replay's own launch (10-30 µs) is shared by them all
CPU_METHOD = "wall clock (time.perf_counter) around each call, repeated; not device-event timing"
UNSTABLE_SPREAD = 1.25  # p80 / p20 above this: the figure is not stable (see the module's docstring)
MIN_SAMPLES = 5  # fewer calls than this: their quantiles say nothing about the spread


def is_stable(p20: float | None, p80: float | None, samples: int) -> bool:
    """The rule every page marks by: p80/p20 at most UNSTABLE_SPREAD, over MIN_SAMPLES calls or more."""
    if p20 is None or p80 is None or samples < MIN_SAMPLES:
        return False
    return p80 <= UNSTABLE_SPREAD * p20


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

    @property
    def stable(self) -> bool:
        return is_stable(self.quantile(0.2), self.quantile(0.8), len(self.ms))


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


def peak_bytes(fn: Callable, args: tuple, device: torch.device) -> int | None:
    """Bytes the CUDA caching allocator held above what was allocated before one call of ``fn(*args)``, at the
    call's peak: its outputs and scratch (the inputs are allocated before).  None on a device without one."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn(*args)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del out
    return max(int(peak), 0)


@contextlib.contextmanager
def autotune_events():
    """What Triton's autotuner did while the block ran: a list of (kernel, configs tried, seconds, from disk),
    filled where the installed Triton has ``knobs.autotuning.listener`` (3.9 has; elsewhere it stays empty)."""
    events: list[tuple[str, int, float | None, bool]] = []
    try:
        import triton

        knobs = triton.knobs.autotuning
        previous = knobs.listener
    except (ImportError, AttributeError):
        yield events
        return

    def listener(fn, key, best_config, configs_timings, duration, cache_hit, **_):
        events.append((getattr(fn, "__name__", str(fn)), len(configs_timings or {}), duration, bool(cache_hit)))
        if previous is not None:
            previous(fn=fn, key=key, best_config=best_config, configs_timings=configs_timings, duration=duration,
                     cache_hit=cache_hit)  # fmt: skip

    knobs.listener = listener
    try:
        yield events
    finally:
        knobs.listener = previous


def bench_cuda(fn: Callable, args: tuple, rep_ms: float, warmup_ms: float = 25) -> list[float]:
    """All of do_bench's per-repetition times for ``fn(*args)``, in ms."""
    from triton.testing import do_bench

    call = lambda: fn(*args)  # noqa: E731
    try:
        return list(do_bench(call, warmup=warmup_ms, rep=rep_ms, return_mode="all"))
    except (AssertionError, TypeError, ValueError):  # a Triton without return_mode="all"
        return list(do_bench(call, warmup=warmup_ms, rep=rep_ms, quantiles=[0.2, 0.5, 0.8]))


def rotating_copies(args: tuple, l2_bytes: int, max_copies: int = GRAPH_MAX_COPIES) -> list[tuple]:
    """``args`` and enough copies of it that their tensors fill twice ``l2_bytes`` (at most ``max_copies`` sets).

    A copy keeps each tensor's storage layout (size, strides, offset), so a
    kernel sees the same alignment and strides as on the original, and
    tensors that share a storage (``add(x, x)``, two views of one buffer)
    share its copy: the storage is counted and copied once."""
    storages = {a.untyped_storage().data_ptr(): a.untyped_storage().nbytes() for a in args if isinstance(a, torch.Tensor)}
    size = sum(storages.values())
    count = min(max_copies, max(1, -(-2 * l2_bytes // max(size, 1))))
    return [args] + [_copy_set(args) for _ in range(count - 1)]


def _copy_set(args: tuple) -> tuple:
    """One copy of ``args``: a new storage per storage, each tensor viewed on its copy as on the original."""
    copied = {}

    def copy(a):
        if not isinstance(a, torch.Tensor):
            return a
        storage = a.untyped_storage()
        if storage.data_ptr() not in copied:
            copied[storage.data_ptr()] = storage.clone()
        view = torch.empty(0, dtype=a.dtype, device=a.device).set_(
            copied[storage.data_ptr()], a.storage_offset(), a.size(), a.stride()
        )
        return view.requires_grad_(a.requires_grad)

    return tuple(copy(a) for a in args)


def bench_cudagraph(
    fn: Callable, args: tuple, rep_ms: float, max_copies: int = GRAPH_MAX_COPIES, max_replays: int = 1000
) -> float | None:
    """Median CUDA-graph replay time per call in ms, inputs cold; None when the call cannot be captured."""
    times = cudagraph_times(fn, args, rep_ms, max_copies, max_replays)
    return None if times is None else statistics.median(times)


def cudagraph_times(
    fn: Callable, args: tuple, rep_ms: float, max_copies: int = GRAPH_MAX_COPIES, max_replays: int = 1000
) -> list[float] | None:
    """CUDA-graph replay times per call in ms, inputs cold, for about ``rep_ms`` (at least 5
    replays); None when the call cannot be captured.

    One graph calls ``fn`` on the sets of ``rotating_copies`` in turn, at least
    ``GRAPH_CALLS`` times; the replays are timed with CUDA events and their
    time divided by the calls."""
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cuda"))
    copies = rotating_copies(args, torch.cuda.get_device_properties(device).L2_cache_size, max_copies)
    calls = [copies[i % len(copies)] for i in range(max(len(copies), GRAPH_CALLS))]
    try:
        graph = _capture(fn, calls)
    except Exception:  # capture is not possible for every call (host syncs, allocations...)
        torch.cuda.synchronize()
        return None
    graph.replay()  # the first replay uploads the graph
    times = []
    spent = 0.0
    while len(times) < 5 or (spent < rep_ms and len(times) < max_replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        elapsed = start.elapsed_time(end)
        times.append(elapsed / len(calls))
        spent += elapsed
    return times


def _capture(fn: Callable, calls: list[tuple]) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()  # warm-up off the default stream, as capture requires
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(*calls[-1])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for args in calls:
                fn(*args)
    except Exception:
        _clear_failed_capture()
        raise
    return graph


def _clear_failed_capture() -> None:
    """Undo what a failed capture leaves behind in the process.

    A capture marks the device's CUDA random generator as capturing and
    unmarks it when the capture ends well.  When the capture fails (a host
    sync, an allocation it cannot make) the mark stays, and every later
    random op on that device, torch.randn for the next shape's inputs among
    them, raises "Offset increment outside graph capture encountered
    unexpectedly": one variant that cannot be captured failed every case
    after it.  A small capture that ends well clears the mark."""
    torch.cuda.synchronize()
    scratch = torch.empty(1, device="cuda")
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        scratch.zero_()
    torch.cuda.synchronize()


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


def bench(fn: Callable, args: tuple, device: torch.device, rep_ms: float, min_reps: int = 3) -> list[float]:
    """Per-call times of ``fn(*args)`` for about ``rep_ms``; on a CPU at least ``min_reps`` of them."""
    if device.type == "cuda":
        return bench_cuda(fn, args, rep_ms)
    return bench_cpu(fn, args, rep_ms, min_reps=min_reps)


def method(device: torch.device) -> str:
    return CUDA_METHOD if device.type == "cuda" else CPU_METHOD
