"""Where the time of a many-kernel call goes: the top kernels of each variant.

The results table gives each variant one line: its time and how many
kernels it launched.  For a call that launches dozens (a model's training
step) that says how long, not where.  This adds, per (dtype, shape), each
variant's kernels ranked by their total time per call, from the profiler
run every variant already gets (``record["kernel_us"]``): on a GPU the
device time of each kernel, on a CPU the CPU time of each top-level op (a tk
op is one, whatever it runs inside).

Only groups where some variant launches more than ``MIN_KERNELS`` kernels
get one: for a single op the kernel column of the table says it all.
"""

from __future__ import annotations

from tabulate import tabulate

from .formats import fmt_time
from .record import groups

MIN_KERNELS = 8  # a (dtype, shape) gets a breakdown when some variant launches more than this per call
TOP = 10  # kernels listed per variant; the rest are summed into one line
NAME_WIDTH = 72  # cuBLAS and CUTLASS kernel names run to hundreds of characters
AUTOGRAD_PREFIX = "autograd::engine::evaluate_function: "  # a backward node, as the CPU profiler names it


def short_name(name: str) -> str:
    if name.startswith(AUTOGRAD_PREFIX):
        name = "autograd: " + name[len(AUTOGRAD_PREFIX) :]
    return name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 1] + "…"


def needs_breakdown(records: list[dict]) -> bool:
    return any((r.get("kernels") or 0) > MIN_KERNELS and r.get("kernel_us") for r in records)


def variant_rows(record: dict, top: int = TOP) -> list[list[str]]:
    """[kernel, launches per call, µs per call, share] rows of one variant, largest first."""
    times = record.get("kernel_us") or {}
    total = sum(times.values())
    launches: dict[str, int] = {}
    for name in record.get("kernel_names") or []:
        launches[name] = launches.get(name, 0) + 1
    ranked = sorted(times.items(), key=lambda item: item[1], reverse=True)

    def share(us: float) -> str:
        return f"{100 * us / total:.1f}%" if total > 0 else ""

    rows = [[short_name(name), str(launches.get(name, "")), f"{us:.1f}", share(us)] for name, us in ranked[:top]]
    rest = ranked[top:]
    if rest:
        us = sum(t for _, t in rest)
        count = sum(launches.get(name, 0) for name, _ in rest)
        rows.append([f"({len(rest)} others)", str(count), f"{us:.1f}", share(us)])
    return rows


def busy_line(record: dict) -> str:
    """The kernels' summed time against the variant's median: what is left is launch gaps and host time."""
    total_us = sum((record.get("kernel_us") or {}).values())
    text = f"{fmt_time(total_us / 1e3)} in {record.get('kernels')} {record.get('kernel_unit') or 'kernels'} per call"
    if record.get("median_ms"):
        text += f", median {fmt_time(record['median_ms'])} per call"
        if record.get("device") == "cuda":
            text += f" (device busy {min(100 * total_us / 1e3 / record['median_ms'], 100):.0f}% of it)"
    return text


def markdown_section(doc: dict) -> list[str]:
    """Lines of the report's "Per-kernel breakdown" section; none when no group needs one."""
    gpu = doc["settings"]["device"] == "cuda"
    out = []
    for dtype, label, records in groups(doc["records"]):
        if not needs_breakdown(records):
            continue
        out += [f"### {doc['op']} | {dtype} | {label}", ""]
        for r in records:
            if not r.get("kernel_us"):
                continue
            out += [f"**{r['variant']}**: {busy_line(r)}", ""]
            headers = ["kernel" if gpu else "op", "launches", "µs per call", "share"]
            out.append(tabulate(variant_rows(r), headers=headers, tablefmt="github", disable_numparse=True))
            out.append("")
    if not out:
        return []
    unit = "kernels of each variant by device time" if gpu else "top-level ops of each variant by CPU time"
    return ["## Per-kernel breakdown", "", f"The {TOP} {unit} per call (profiler), the rest summed.", "", *out]
