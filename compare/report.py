"""The report of one op: terminal tables, report.md, results.json, results.csv, throughput.png (report.html: html.py,
written after these by ``session.Run.write_report``)."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

from tabulate import tabulate

from . import breakdown
from .files import write_atomic
from .formats import device_label, fmt_bytes, fmt_time
from .record import (CONFIGS, RECORD_FIELDS, RESULTS, TableView, cells, csv_cell, flag_legend, groups,
                     has_peak_memory, titles)

JSON_NAME, CSV_NAME, MD_NAME, PNG_NAME = "results.json", "results.csv", "report.md", "throughput.png"
CONFIGS_PNG_NAME = "configs.png"
MEMORY_PNG_NAME = "memory.png"


# --------------------------------------------------------------------------
# Tables.
# --------------------------------------------------------------------------


def table_rows(records: list[dict], bound: str, table: str = RESULTS) -> tuple[list[str], list[list[str]]]:
    """The results table of one (dtype, shape), or its ``CONFIGS`` table: the titles, and a row per variant (per
    configuration of tk's kernel; see record.py)."""
    view = TableView.of(records, bound)
    return titles(table, view), [cells(table, r, view) for r in records]


def group_title(op: str, dtype: str, label: str, records: list[dict]) -> str:
    return f"{op} | {dtype} | {label} | {fmt_bytes(records[0]['bytes'])} moved, {records[0]['flops']:,} FLOP"


def terminal_tables(doc: dict) -> str:
    parts = [f"{doc['op']}: {doc['call']}", ""] if doc.get("call") else []
    for table, key in ((RESULTS, "records"), (CONFIGS, "configs")):
        for dtype, label, recs in groups(doc.get(key, [])):
            headers, rows = table_rows(recs, doc["bound"], table)
            parts.append(group_title(doc["op"], dtype, label, recs) + (" | configurations" if table == CONFIGS else ""))
            parts.append(tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True))
            parts.append("")
    parts.append(legend(doc))
    return "\n".join(parts)


def legend(doc: dict) -> str:
    device = doc["settings"]["device"]
    lines = ["* best correct variant; (!) output outside the tolerance, time shown for information."]
    lines += flag_legend([r for r in doc["records"] + doc.get("configs", []) if r["status"] != "skipped"])
    if device == "cpu":
        lines.append(
            "CPU: times are wall clock, not device events; tk runs in Triton's interpreter there (numpy),"
            " so its time is no performance figure and gets no throughput or speed-up. No peak memory: the CPU"
            " allocator keeps no peak (on CUDA, the caching allocator's peak above the inputs)."
        )
    lines.append(f"Timing: {doc['settings']['timing_method']}.")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# Files.
# --------------------------------------------------------------------------


def _clean(value):
    """JSON has no inf or NaN: they become null (the record's error text says why)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def write_json(doc: dict, folder: Path) -> Path:
    path = folder / JSON_NAME
    write_atomic(path, json.dumps(_clean(doc), indent=1, allow_nan=False) + "\n")
    return path


def write_csv(doc: dict, folder: Path) -> Path:
    path = folder / CSV_NAME
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(list(RECORD_FIELDS))
        for rec in _clean(doc["records"]):
            writer.writerow([csv_cell(field, rec.get(name)) for name, field in RECORD_FIELDS.items()])
    os.replace(tmp, path)
    return path


def _env_rows(doc: dict) -> list[list[str]]:
    return [[k, str(v)] for k, v in doc["environment"].items() if v is not None]


def _stability(m: dict) -> str:
    """How a limit's repetitions spread, and the mark where that is not stable."""
    if "samples" not in m:  # a report written before limits kept their spread
        return ""
    spread = f"; p20-p80 {fmt_time(m['p20_ms'])} - {fmt_time(m['p80_ms'])} over {m['samples']} repetitions"
    return spread + ("" if m["stable"] else ": **not stable** (~ on every share of it)")


def _limit_rows(doc: dict) -> list[list[str]]:
    lim = doc["limits"]
    rows = []
    if lim.get("copy"):
        c = lim["copy"]
        how = f"copy_ of {fmt_bytes(c['bytes'])}, read + written{_stability(c)}"
        rows.append(["copy bandwidth", f"{c['gbps']:,.1f} GB/s" + ("" if c.get("stable", True) else " ~"), how])
    for dtype, m in lim.get("matmul", {}).items():
        extra = f", allow_tf32={m['allow_tf32']}" if "allow_tf32" in m else ""
        value = f"{m['tflops']:,.2f} TFLOP/s" + ("" if m.get("stable", True) else " ~")
        rows.append([f"matmul {dtype}", value, f"torch.matmul {m['n']}^3{extra}{_stability(m)}"])
    for e in lim.get("errors", []):
        rows.append(["not measured", "", e])
    return rows


def _profile_lines(doc: dict, folder: Path | None) -> list[str]:
    """report.md's pointers to --profile's traces and --ncu's summary (report.html shows their tables)."""
    from . import profiling

    out = []
    profiles = profiling.read_profiles(folder) if folder is not None else []
    if profiles:
        out += ["## Profiles (torch.profiler)", "",
                "Chrome traces open in ui.perfetto.dev or chrome://tracing; report.html shows each key_averages table.", ""]
        for p in profiles:
            top = p["rows"][0] if p["rows"] else None
            lead = f"; top: `{top['name'][:60]}`" if top else ""
            memory = f", [memory at the peak]({p['memory']})" if p.get("memory") else ""
            out.append(f"- {p['variant']} {p['dtype']} {p['shape_label']}: [trace]({p['trace']}),"
                       f" [key_averages]({p['table']}){memory}{lead}")
        out.append("")
    result = doc.get("ncu")
    if result:
        out += ["## Nsight Compute", "", f"{result['dtype']} {result['shape_label']}: [ncu/summary.md](ncu/summary.md)"
                f" ({len(result['rows'])} kernels; {len(result['errors'])} variants not profiled)", ""]
    return out


def markdown(doc: dict, png_name: str | None, folder: Path | None = None, configs_png: str | None = None,
             memory_png: str | None = None) -> str:  # fmt: skip
    s = doc["settings"]
    out = [f"# {doc['op']}: tk against eager and torch.compile", ""]
    if doc.get("call"):
        out += [f"Compares {doc['call']}.", ""]
    if not doc["complete"]:
        out += ["**Incomplete: the run was interrupted; the tables hold what ran before.**", ""]
    out += [
        f"- device: {device_label(doc['environment'])}; started {doc['started_utc']}, finished {doc['finished_utc']}",
        f"- dtypes: {', '.join(s['dtypes'])}; shapes: {', '.join(s['shape_labels'])}",
        f"- variants: {', '.join(s['variants'])}; bound: {doc['bound']} "
        f"(share of limit against {'matmul throughput' if doc['bound'] == 'compute' else 'copy bandwidth'})",
        f"- timing: {s['timing_method']}; {s['rounds']} interleaved round(s) of {s['rep_ms']} ms per variant;"
        " the first call (compile, autotune, JIT) is timed apart and excluded",
        "- correctness: relative norm error against the float64 reference, within the spec's tolerance per dtype "
        "(raised to twice the error of the exact answer rounded to the dtype, where that is larger)",
    ]
    if s["device"] == "cpu":
        out.append(
            "- **CPU run**: wall-clock times; tk runs in Triton's interpreter, so its time is shown but is not a"
            " performance figure. The kernel column counts ops (profiler), not GPU kernels."
        )
    for sk in doc.get("skipped", []):
        out.append(f"- peer `{sk['variant']}` skipped: {sk['reason']}")
    out += ["", "## Measured limits", ""]
    out.append(tabulate(_limit_rows(doc) or [["none", "", ""]], headers=["limit", "value", "how"], tablefmt="github"))
    out += ["", "## Results", ""]
    if png_name:
        out += [f"![throughput]({png_name})", ""]
    if memory_png:
        out += [f"![time against peak memory]({memory_png})", ""]
    for dtype, label, recs in groups(doc["records"]):
        headers, rows = table_rows(recs, doc["bound"])
        out += [f"### {group_title(doc['op'], dtype, label, recs)}", ""]
        out.append(tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True))
        clocks = {r["sm_clock_mhz"] for r in recs if r["sm_clock_mhz"] is not None}
        if clocks:
            out += ["", f"SM clock after timing: {', '.join(f'{c:.0f}' for c in sorted(clocks))} MHz"]
        out.append("")
    out += _configs_lines(doc, configs_png)
    out += [legend(doc), ""]
    out += breakdown.markdown_section(doc)  # many-kernel calls (a model's step): each variant's top kernels
    out += _profile_lines(doc, folder)
    problems = [r for r in doc["records"] + doc.get("configs", []) if r["status"] in ("failed", "wrong")]
    if problems:
        out += ["## Failures and wrong results", ""]
        for r in problems:
            out.append(f"- `{r['variant']}` {r['dtype']} {r['shape_label']}: {r['status']}: {r['error']}")
        out.append("")
    out += ["## Environment", "", tabulate(_env_rows(doc), headers=["", ""], tablefmt="github"), ""]
    return "\n".join(out)


def configs_intro(doc: dict) -> list[str]:
    """What the configurations tables are, and on a CPU what their times are not (report.md and report.html)."""
    lines = ["tk's kernel under each configuration its op declares, on the same inputs as the variants: checked"
             " against the float64 answer and timed the same way; * the fastest correct one."]  # fmt: skip
    if doc["settings"]["device"] == "cpu":
        lines.append("CPU run: each configuration ran in Triton's interpreter (which ignores warps and stages):"
                     " its time is shown, but is no performance figure.")  # fmt: skip
    return lines


def _configs_lines(doc: dict, png_name: str | None) -> list[str]:
    """report.md's section of --configs: each configuration of tk's kernel, per (dtype, shape)."""
    if not doc.get("configs"):
        return []
    out = ["## Kernel configurations (--configs)", ""]
    for line in configs_intro(doc):
        out += [line, ""]
    if png_name:
        out += [f"![configurations]({png_name})", ""]
    for dtype, label, recs in groups(doc["configs"]):
        headers, rows = table_rows(recs, doc["bound"], CONFIGS)
        out += [f"### {group_title(doc['op'], dtype, label, recs)}", ""]
        out += [tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True), ""]
    return out


def write_markdown(doc: dict, folder: Path, png_name: str | None, configs_png: str | None = None,
                   memory_png: str | None = None) -> Path:  # fmt: skip
    path = folder / MD_NAME
    write_atomic(path, markdown(doc, png_name, folder, configs_png, memory_png))
    return path


def write_all(doc: dict, folder: Path) -> dict[str, Path]:
    """Every file of the report; the plot is best effort (a report without it is still a report)."""
    from . import plot

    files = {"json": write_json(doc, folder), "csv": write_csv(doc, folder)}
    drawings = [("png", plot.throughput, PNG_NAME)]
    if has_peak_memory(doc["records"]):
        drawings.append(("memory_png", plot.memory, MEMORY_PNG_NAME))
    if doc.get("configs"):
        drawings.append(("configs_png", plot.configurations, CONFIGS_PNG_NAME))
    for name in (PNG_NAME, MEMORY_PNG_NAME, CONFIGS_PNG_NAME):  # an earlier run's plot is not this run's
        (folder / name).unlink(missing_ok=True)  # (report.html embeds the plots it finds in the folder)
    for key, draw, name in drawings:
        try:
            files[key] = draw(doc, folder / name)
        except Exception as e:  # noqa: BLE001
            doc.setdefault("notes", []).append(f"plot {name} not drawn: {type(e).__name__}: {e}")
    configs_png = CONFIGS_PNG_NAME if "configs_png" in files else None
    memory_png = MEMORY_PNG_NAME if "memory_png" in files else None
    files["md"] = write_markdown(doc, folder, PNG_NAME if "png" in files else None, configs_png, memory_png)
    return files
