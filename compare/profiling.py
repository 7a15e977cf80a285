"""``--profile``: a ``torch.profiler`` trace of each variant, and the NVTX ranges an outside profiler reads.

With ``--profile``, each variant of each case is profiled after its other measurements (never
during its timed calls): ``CALLS`` calls, the device synchronized around them, written as

    profile/<variant>/<dtype>/<shape>/trace.json         Chrome trace: chrome://tracing or ui.perfetto.dev
    profile/<variant>/<dtype>/<shape>/key_averages.txt   torch.profiler's table, by device time (CPU time on a CPU)
    profile/<variant>/<dtype>/<shape>/key_averages.json  its top rows, which report.html shows
    profile/<variant>/<dtype>/<shape>/memory.md          CUDA: what one call held at its peak, and where it was allocated
    profile/<variant>/<dtype>/<shape>/memory.pickle      CUDA: the allocator's history of that call, for pytorch.org/memory_viz

Every variant's timed region (and its first call) carries an NVTX range named
``<variant> <dtype> <shape>`` on CUDA, whether or not ``--profile`` is given: Nsight Systems
shows them on its timeline, and Nsight Compute filters by them (``compare.ncu``).  On a CPU
there is no NVTX and the ranges are nothing.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pickle
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from .files import write_atomic

CALLS = 5  # calls per trace: enough to see the steady state, small enough to open in a browser
TOP_ROWS = 15  # rows of key_averages kept for the report
HISTORY_ENTRIES = 100_000  # allocator events kept for one call: a model's training step makes some ten thousand


def timed_region(name: str, device: torch.device):
    """An NVTX range around a variant's timed calls on CUDA; nothing elsewhere."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.nvtx.range(name)


def folder_of(root: Path, variant: str, dtype: str, shape_label: str) -> Path:
    def safe(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", text).strip("_") or "_"

    return Path(root) / safe(variant) / dtype / safe(shape_label)


def _sort_key(device: torch.device) -> str:
    return "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"


def key_average_rows(prof, device: torch.device, calls: int, limit: int = TOP_ROWS) -> list[dict]:
    """The top ``limit`` rows of ``prof.key_averages()`` by self device time (self CPU time on a CPU), per call."""
    key = _sort_key(device)
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key, 0) or 0, reverse=True)[:limit]
    return [{"name": e.key, "calls": e.count / calls,
             "self_device_us": (getattr(e, "self_device_time_total", 0) or 0) / calls,
             "device_us": (getattr(e, "device_time_total", 0) or 0) / calls,
             "self_cpu_us": e.self_cpu_time_total / calls, "cpu_us": e.cpu_time_total / calls} for e in events]  # fmt: skip


def trace_variant(fn, args: tuple, device: torch.device, root: Path, variant: str, dtype: str, shape_label: str,
                  calls: int = CALLS) -> Path:  # fmt: skip
    """Profile ``calls`` calls of an already warmed-up ``fn``; its trace and tables under ``root``; the folder."""
    from torch.profiler import ProfilerActivity, profile

    from .kernels import profiler_chatter_filtered

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    folder = folder_of(root, variant, dtype, shape_label)
    folder.mkdir(parents=True, exist_ok=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    with profiler_chatter_filtered(), profile(activities=activities) as prof:
        with timed_region(f"{variant} {dtype} {shape_label} profile", device):
            for _ in range(calls):
                fn(*args)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    prof.export_chrome_trace(str(folder / "trace.json"))
    table = prof.key_averages().table(sort_by=_sort_key(device), row_limit=TOP_ROWS)
    (folder / "key_averages.txt").write_text(f"{calls} calls of {variant}, {dtype} {shape_label}\n{table}\n")
    rows = key_average_rows(prof, device, calls)
    about = {"variant": variant, "dtype": dtype, "shape_label": shape_label, "calls": calls,
             "device": device.type, "sorted_by": _sort_key(device), "rows": rows}  # fmt: skip
    write_atomic(folder / "key_averages.json", json.dumps(about, indent=1) + "\n")
    snapshot = memory_history(fn, args, device)
    if snapshot is not None:
        with open(folder / "memory.pickle", "wb") as f:
            pickle.dump(snapshot, f)
        title = f"{variant}, {dtype} {shape_label}: one call"
        trace = snapshot["device_traces"][_index(device)]
        write_atomic(folder / "memory.md", peak_markdown(title, at_peak(trace), cut=len(trace) >= HISTORY_ENTRIES))
    return folder


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def memory_history(fn, args: tuple, device: torch.device) -> dict | None:
    """The CUDA caching allocator's history over one call of ``fn`` (``torch.cuda.memory._snapshot`` with
    history recorded: every allocation and free, with its Python stack); None off CUDA."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES, stacks="python")
    try:
        out = fn(*args)
        torch.cuda.synchronize(device)
        del out
        return torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


@dataclass
class Held:
    """One allocation alive at the peak."""

    size: int
    where: str  # the innermost frame outside torch and the harness: who asked for it


def at_peak(trace: list[dict]) -> tuple[int, list[Held]]:
    """The most bytes allocated at once over a trace of the allocator's events (allocations made before the
    trace, such as the inputs, are not counted), and the allocations alive at that moment, largest first.
    An allocation counts until its free is requested, as ``torch.cuda.max_memory_allocated`` counts it (the
    allocator lowers allocated_bytes there; a block freed on another stream stays *active* until its free
    completes); the sizes are those asked for, before the allocator rounds them up."""
    sizes: dict[int, int] = {}
    total = peak = peak_at = 0
    for n, event in enumerate(trace):
        if event["action"] == "alloc":
            sizes[event["addr"]] = event["size"]
            total += event["size"]
            if total > peak:
                peak, peak_at = total, n
        elif event["action"] == "free_requested" and event["addr"] in sizes:
            total -= sizes.pop(event["addr"])
    live: dict[int, Held] = {}  # replayed up to the peak: who held it
    for event in trace[: peak_at + 1] if peak else []:
        if event["action"] == "alloc":
            live[event["addr"]] = Held(event["size"], _where(event.get("frames", [])))
        elif event["action"] == "free_requested":
            live.pop(event["addr"], None)
    return peak, sorted(live.values(), key=lambda h: h.size, reverse=True)


def _package_dir(module) -> str:
    return str(Path(module.__file__).resolve().parent) + os.sep


# Frames in these are passed over: the allocation is charged to the code that called into them.
_NOT_THE_CALLER = (_package_dir(torch), str(Path(__file__).resolve().parent) + os.sep)


@functools.lru_cache(maxsize=4096)
def _callers_file(name: str) -> bool:
    """Whether a frame in file `name` is the model's or tk's code (a history repeats a few hundred files)."""
    if not name or name.startswith("<"):  # <frozen importlib...>, <string>
        return False
    return not str(Path(name).resolve()).startswith(_NOT_THE_CALLER)


def _where(frames: list[dict]) -> str:
    """The innermost frame of the model's or tk's code (not torch's, not this harness's), as file:line name."""
    for frame in frames:  # innermost first
        if _callers_file(frame.get("filename", "")):
            return f"{Path(frame['filename']).name}:{frame.get('line')} {frame.get('name')}"
    return "(torch)"


def peak_markdown(title: str, found: tuple[int, list[Held]], top: int = 12, cut: bool = False) -> str:
    """memory.md: the peak, then what held it, grouped by where it was allocated.  `cut`: the history kept
    only its last HISTORY_ENTRIES events (a ring), so the call's first allocations are missing."""
    peak, held = found
    groups: dict[str, list[int]] = {}
    for h in held:
        groups.setdefault(h.where, []).append(h.size)
    rows = sorted(groups.items(), key=lambda kv: sum(kv[1]), reverse=True)
    lines = [f"# Memory at the peak: {title}", "",
             f"Peak above the memory held before the call: {peak / 1e6:,.1f} MB in {len(held)} allocations"
             " (sizes as asked for, before the allocator rounds them up).", "",
             "| allocated at | allocations | MB | largest, MB |", "|---|---|---|---|"]  # fmt: skip
    for where, sizes in rows[:top]:
        lines.append(f"| `{where}` | {len(sizes)} | {sum(sizes) / 1e6:,.1f} | {max(sizes) / 1e6:,.1f} |")
    if len(rows) > top:
        rest = [s for _, sizes in rows[top:] for s in sizes]
        lines.append(f"| (the rest) | {len(rest)} | {sum(rest) / 1e6:,.1f} | {max(rest) / 1e6:,.1f} |")
    if cut:
        lines += ["", f"**Incomplete:** the call made {HISTORY_ENTRIES:,} allocator events or more, and the history"
                  " kept the last ones only: allocations made before them are not counted."]  # fmt: skip
    lines += ["", "memory.pickle beside this page opens in pytorch.org/memory_viz (the allocator's whole history).", ""]
    return "\n".join(lines)


def read_profiles(op_dir: Path) -> list[dict]:
    """Every variant's key_averages.json under ``op_dir/profile``, with the paths of its files (relative)."""
    root = Path(op_dir) / "profile"
    found = []
    for path in sorted(root.rglob("key_averages.json")) if root.is_dir() else []:
        try:
            about = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        folder = path.parent.relative_to(op_dir)
        about.update(trace=str(folder / "trace.json"), table=str(folder / "key_averages.txt"))
        if (path.parent / "memory.md").is_file():
            about["memory"] = str(folder / "memory.md")
        found.append(about)
    return found
