"""Throughput against problem size, one line per variant, the measured limit drawn (throughput.png); each
variant's time against its peak memory, a panel per case (memory.png, where peak memory was measured: CUDA);
with --configs, each configuration of tk's kernel, one line per shape (configs.png)."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .record import RECORD_FIELDS, groups  # noqa: E402

# One colour and marker per variant kind, so that a reader finds tk at a glance.
_STYLE = {
    "eager": ("tab:blue", "o", "-"),
    "unfused": ("tab:cyan", "v", "--"),
    "compile": ("tab:orange", "s", "-"),
    "max-autotune": ("tab:red", "D", "-"),
    "tk": ("tab:green", "*", "-"),
    "tk-plan": ("tab:olive", "P", "--"),
    "peer": ("tab:purple", "^", ":"),
}


def _x_axis(recs: list[dict], size_key: str) -> tuple[dict, bool]:
    """x position per shape label, and whether the axis is the (log) size itself.

    Sizes on a log axis when every shape has a size of its own; otherwise
    (softmax rows of 16384 to 1048576 columns all move 268 MB) the shapes
    stand side by side in sweep order, so that none hides another.
    """
    sizes = dict.fromkeys((r["shape_label"], r[size_key]) for r in recs)
    by_size = {size for _, size in sizes}
    if len(by_size) == len(sizes):
        return {label: size for label, size in sizes}, True
    return {label: i for i, (label, _) in enumerate(sizes)}, False


def throughput(doc: dict, path: Path) -> Path:
    compute = doc["bound"] == "compute"
    metric = "tflops" if compute else "gbps"
    unit = RECORD_FIELDS[metric].unit
    size_key = "flops" if compute else "bytes"
    dtypes = list(dict.fromkeys(r["dtype"] for r in doc["records"]))
    fig, axes = plt.subplots(1, max(len(dtypes), 1), figsize=(8.6 * max(len(dtypes), 1), 4.6), squeeze=False)
    lim = doc["limits"]
    for ax, dtype in zip(axes[0], dtypes):
        recs = [r for r in doc["records"] if r["dtype"] == dtype]
        variants = list(dict.fromkeys(r["variant"] for r in recs))
        xpos, by_size = _x_axis(recs, size_key)
        seen_kinds: dict[str, int] = {}
        for name in variants:
            pts = sorted((r for r in recs if r["variant"] == name and r[metric] is not None), key=lambda r: xpos[r["shape_label"]])
            if not pts:
                continue
            kind = pts[0]["kind"]
            color, marker, style = _STYLE.get(kind, ("tab:gray", "x", "-"))
            nth = seen_kinds[kind] = seen_kinds.get(kind, -1) + 1
            # Later variants of a kind (compile of the unfused composition...): same colour, dashed, hollow.
            face = color if nth == 0 else "white"
            style = style if nth == 0 else ("--", "-.", ":")[(nth - 1) % 3]
            lw = 2.4 if kind == "tk" else 1.5
            ax.plot([xpos[r["shape_label"]] for r in pts], [r[metric] for r in pts], style, marker=marker, color=color, lw=lw,
                    ms=10 if marker == "*" else 6, mfc=face, label=name)  # fmt: skip
            wrong = [r for r in pts if r["status"] == "wrong"]
            if wrong:
                ax.scatter([xpos[r["shape_label"]] for r in wrong], [r[metric] for r in wrong], s=140, facecolors="none",
                           edgecolors="red", lw=1.5, zorder=5, label=f"{name}: wrong result")  # fmt: skip
        limit = (lim.get("matmul", {}).get(dtype) or {}).get("tflops") if compute else (lim.get("copy") or {}).get("gbps")
        if limit:
            what = "matmul (torch)" if compute else "copy bandwidth"
            value = f"{limit:,.0f}" if limit >= 100 else f"{limit:.3g}"
            ax.axhline(limit, color="black", ls="--", lw=1, label=f"measured {what}: {value} {unit}")
        if by_size:
            ax.set_xscale("log", base=2)
        if xpos:
            ax.set_xticks(list(xpos.values()))
            ax.set_xticklabels(list(xpos), rotation=30, ha="right", fontsize=8)
            ax.minorticks_off()
        size = (("FLOPs" if compute else "bytes moved") + " per call (shape)") if by_size else "shape (sweep order)"
        _frame(ax, f"{doc['op']} {dtype}", size, unit)
    device = doc["environment"].get("gpu") or "CPU, wall clock"
    note = "  (interpreted tk not plotted)" if doc["settings"]["device"] == "cpu" else ""
    fig.suptitle(f"{doc['op']}: throughput on {device}{note}", fontsize=11)
    return _save(fig, path)


def memory(doc: dict, path: Path, columns: int = 4) -> Path:
    """Time against peak memory, a panel per (dtype, shape), a labelled point per variant: the trade-off of
    designs that buy speed with memory (linear cross entropy's chunk sizes trace a curve)."""
    cases = [(d, label, recs) for d, label, recs in groups(doc["records"]) if any(r.get("peak_bytes") is not None for r in recs)]
    rows = -(-len(cases) // columns)
    width = min(columns, len(cases))
    fig, axes = plt.subplots(rows, width, figsize=(4.4 * width, 3.6 * rows), squeeze=False)
    for ax, (dtype, label, recs) in zip(axes.flat, cases):
        pts = [r for r in recs if r.get("peak_bytes") is not None and r["median_ms"] is not None]
        for n, r in enumerate(pts):
            color, marker, _ = _STYLE.get(r["kind"], ("tab:gray", "x", "-"))
            ax.scatter(r["peak_bytes"] / 1e6, r["median_ms"], color=color, marker=marker, s=70 if marker == "*" else 28)
            # Labels at three heights in turn, so that neighbours' names do not print over each other.
            ax.annotate(r["variant"], (r["peak_bytes"] / 1e6, r["median_ms"]), fontsize=6, xytext=(3, 3 + 8 * (n % 3)),
                        textcoords="offset points")  # fmt: skip
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("peak memory above the inputs, MB")
        ax.set_ylabel("ms per call, median")
        ax.set_title(f"{dtype} {label}", fontsize=9)
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(cases):]:
        ax.set_visible(False)
    fig.suptitle(f"{doc['op']}: time against peak memory on {doc['environment'].get('gpu') or 'CPU'}", fontsize=11)
    return _save(fig, path)


def configurations(doc: dict, path: Path) -> Path:
    """--configs: per dtype, each configuration of tk's kernel (x, in the op's order) against its throughput, or
    its time where none has one (the interpreter's: no performance figure), a line per shape; failed ones as x at 0."""
    records = doc["configs"]
    metric = "tflops" if doc["bound"] == "compute" else "gbps"
    if not any(r[metric] is not None for r in records):
        metric = "median_ms"
    dtypes = list(dict.fromkeys(r["dtype"] for r in records))
    labels = list(dict.fromkeys(r["variant"] for r in records))
    x = {label: i for i, label in enumerate(labels)}
    width = max(6.0, 0.7 * len(labels) + 3)  # room for each configuration's label
    fig, axes = plt.subplots(1, len(dtypes), figsize=(width * len(dtypes), 4.6), squeeze=False)
    for ax, dtype in zip(axes[0], dtypes):
        recs = [r for r in records if r["dtype"] == dtype]
        for shape in dict.fromkeys(r["shape_label"] for r in recs):
            mine = [r for r in recs if r["shape_label"] == shape]
            timed = [r for r in mine if r[metric] is not None]
            (line,) = ax.plot([x[r["variant"]] for r in timed], [r[metric] for r in timed], "o-", lw=1.2, label=shape)
            failed = [x[r["variant"]] for r in mine if r["status"] == "failed"]
            if failed:
                color = line.get_color()
                ax.scatter(failed, [0] * len(failed), marker="x", s=80, color=color, label=f"{shape}: failed")
        ax.set_xticks(list(x.values()))
        ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=8)
        unit = RECORD_FIELDS[metric].unit + (" per call, median" if metric == "median_ms" else "")
        _frame(ax, f"{doc['op']} {dtype}", "configuration", unit)
    device = doc["environment"].get("gpu") or "CPU"
    note = ": Triton's interpreter, wall clock, no performance figure" if doc["settings"]["device"] == "cpu" else ""
    fig.suptitle(f"{doc['op']}: tk's kernel under each configuration on {device}{note}", fontsize=11)
    return _save(fig, path)


def _frame(ax, title: str, xlabel: str, ylabel: str) -> None:
    """One panel's axes from 0, labels, grid, and its legend outside, on the right."""
    ax.set_ylim(bottom=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def _save(fig, path: Path) -> Path:
    """The figure written whole to ``path`` (a temporary file first: a reader never sees half a PNG)."""
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path
