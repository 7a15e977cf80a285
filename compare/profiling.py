"""``--profile``: a ``torch.profiler`` trace of each variant, and the NVTX ranges an outside profiler reads.

With ``--profile``, each variant of each case is profiled after its other measurements (never
during its timed calls): ``CALLS`` calls, the device synchronized around them, written as

    profile/<variant>/<dtype>/<shape>/trace.json         Chrome trace: chrome://tracing or ui.perfetto.dev
    profile/<variant>/<dtype>/<shape>/key_averages.txt   torch.profiler's table, by device time (CPU time on a CPU)
    profile/<variant>/<dtype>/<shape>/key_averages.json  its top rows, which report.html shows

Every variant's timed region (and its first call) carries an NVTX range named
``<variant> <dtype> <shape>`` on CUDA, whether or not ``--profile`` is given: Nsight Systems
shows them on its timeline, and Nsight Compute filters by them (``compare.ncu``).  On a CPU
there is no NVTX and the ranges are nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

import torch

CALLS = 5  # calls per trace: enough to see the steady state, small enough to open in a browser
TOP_ROWS = 15  # rows of key_averages kept for the report


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
    tmp = folder / f".key_averages.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(about, indent=1) + "\n")
    os.replace(tmp, folder / "key_averages.json")
    return folder


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
        found.append(about)
    return found
