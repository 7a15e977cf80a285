"""The report of one op: terminal tables, report.md, results.json, results.csv, throughput.png."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

from tabulate import tabulate

from . import breakdown, schema

JSON_NAME, CSV_NAME, MD_NAME, PNG_NAME = "results.json", "results.csv", "report.md", "throughput.png"


# --------------------------------------------------------------------------
# Numbers as people read them.
# --------------------------------------------------------------------------


def fmt_time(ms: float | None) -> str:
    if ms is None:
        return ""
    if ms < 1:
        return f"{ms * 1e3:.1f} µs" if ms < 0.1 else f"{ms * 1e3:.0f} µs"
    if ms < 1000:
        return f"{ms:.3g} ms" if ms < 100 else f"{ms:.0f} ms"
    return f"{ms / 1e3:.2f} s"


def _num(x: float | None, digits: int = 3) -> str:
    if x is None:
        return ""
    if x == 0 or abs(x) >= 10 ** (digits - 1):
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def ratio(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}x"


def share(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.0f}%"


def _err(x: float | None) -> str:
    if x is None:
        return ""
    return "inf" if math.isinf(x) else f"{x:.1e}"


def _bytes(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def device_label(environment: dict) -> str:
    """The device a report ran on, as its pages name it."""
    return environment.get("gpu") or f"CPU ({environment.get('cpu')})"


def _status(r: dict) -> str:
    s = {"ok": "ok", "wrong": "WRONG", "failed": "FAILED", "skipped": "skipped"}[r["status"]]
    if r["interpreted"] and r["status"] in ("ok", "wrong"):
        s += ", interpreted"
    return s


# --------------------------------------------------------------------------
# Tables.
# --------------------------------------------------------------------------


def groups(records: list[dict]) -> list[tuple[str, str, list[dict]]]:
    """(dtype, shape label, records) in sweep order; skipped peers are left out."""
    out: dict[tuple, list[dict]] = {}
    for r in records:
        if r["status"] == "skipped":
            continue
        out.setdefault((r["dtype"], r["shape_label"]), []).append(r)
    return [(d, s, rs) for (d, s), rs in out.items()]


def table_rows(records: list[dict], bound: str) -> tuple[list[str], list[list[str]]]:
    show_graph = any(r["cudagraph_ms"] is not None for r in records)
    eager_graph = next((r["cudagraph_ms"] for r in records if r["variant"] == "eager" and r["status"] == "ok"), None)
    headers = ["variant", "status", "median", "p20-p80", "first call"]
    if show_graph:
        headers.append("CUDA graph (vs eager)")
    headers += ["GB/s", "TFLOP/s", "% of " + ("matmul" if bound == "compute" else "copy"), "vs eager", "vs compile"]
    headers += [records[0]["kernel_unit"] or "kernels" if records else "kernels", "rel. error", "note"]
    rows = []
    for r in records:
        flag = " (!)" if r["status"] == "wrong" else ""
        median = fmt_time(r["median_ms"]) + flag if r["median_ms"] is not None else ""
        spread = f"{fmt_time(r['p20_ms'])} - {fmt_time(r['p80_ms'])}" if r["p20_ms"] is not None else ""
        row = [r["variant"] + (" *" if r["best"] else ""), _status(r), median, spread, fmt_time(r["first_call_ms"])]
        if show_graph:
            row.append(_graph_time(r, eager_graph))
        note = (r["error"] or "").splitlines()[0][:90] if r["status"] != "ok" else (r["error"] or "")[:90]
        row += [_num(r["gbps"]), _num(r["tflops"]), share(r["limit_share"]), ratio(r["speedup_vs_eager"])]
        row += [ratio(r["speedup_vs_compile"]), "" if r["kernels"] is None else str(r["kernels"]), _err(r["rel_error"]), note]
        rows.append(row)
    return headers, rows


def _graph_time(r: dict, eager_graph: float | None) -> str:
    """The CUDA-graph time and, where eager has one, eager's over it: the device-side speed-up of a small call,
    which the host-bound median hides."""
    if r["cudagraph_ms"] is None:
        return ""
    if eager_graph is None or r["status"] not in ("ok", "wrong"):
        return fmt_time(r["cudagraph_ms"])
    return f"{fmt_time(r['cudagraph_ms'])} ({ratio(eager_graph / r['cudagraph_ms'])})"


def group_title(op: str, dtype: str, label: str, records: list[dict]) -> str:
    return f"{op} | {dtype} | {label} | {_bytes(records[0]['bytes'])} moved, {records[0]['flops']:,} FLOP"


def terminal_tables(doc: dict) -> str:
    parts = []
    for dtype, label, recs in groups(doc["records"]):
        headers, rows = table_rows(recs, doc["bound"])
        parts.append(group_title(doc["op"], dtype, label, recs))
        parts.append(tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True))
        parts.append("")
    parts.append(legend(doc))
    return "\n".join(parts)


def legend(doc: dict) -> str:
    device = doc["settings"]["device"]
    lines = ["* best correct variant; (!) output outside the tolerance, time shown for information."]
    if device == "cpu":
        lines.append(
            "CPU: times are wall clock, not device events; tk runs in Triton's interpreter there (numpy),"
            " so its time is no performance figure and gets no throughput or speed-up."
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


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:  # a full disk: no half-written temporary left behind
        tmp.unlink(missing_ok=True)
        raise


def write_json(doc: dict, folder: Path) -> Path:
    path = folder / JSON_NAME
    _write_atomic(path, json.dumps(_clean(doc), indent=1, allow_nan=False) + "\n")
    return path


def csv_value(name: str, value) -> str:
    if value is None:
        return ""
    if name == "shape":
        return "x".join(str(v) for v in value)
    if name == "kernel_names":
        return ";".join(value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def write_csv(doc: dict, folder: Path) -> Path:
    path = folder / CSV_NAME
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        fields = list(schema.RECORD_FIELDS)
        writer.writerow(fields)
        for rec in _clean(doc["records"]):
            writer.writerow([csv_value(k, rec.get(k)) for k in fields])
    os.replace(tmp, path)
    return path


def _env_rows(doc: dict) -> list[list[str]]:
    return [[k, str(v)] for k, v in doc["environment"].items() if v is not None]


def _limit_rows(doc: dict) -> list[list[str]]:
    lim = doc["limits"]
    rows = []
    if lim.get("copy"):
        c = lim["copy"]
        rows.append(["copy bandwidth", f"{c['gbps']:,.1f} GB/s", f"copy_ of {_bytes(c['bytes'])}, read + written"])
    for dtype, m in lim.get("matmul", {}).items():
        extra = f", allow_tf32={m['allow_tf32']}" if "allow_tf32" in m else ""
        rows.append([f"matmul {dtype}", f"{m['tflops']:,.2f} TFLOP/s", f"torch.matmul {m['n']}^3{extra}"])
    for e in lim.get("errors", []):
        rows.append(["not measured", "", e])
    return rows


def markdown(doc: dict, png_name: str | None) -> str:
    s = doc["settings"]
    out = [f"# {doc['op']}: tk against eager and torch.compile", ""]
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
    for dtype, label, recs in groups(doc["records"]):
        headers, rows = table_rows(recs, doc["bound"])
        out += [f"### {group_title(doc['op'], dtype, label, recs)}", ""]
        out.append(tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True))
        clocks = {r["sm_clock_mhz"] for r in recs if r["sm_clock_mhz"] is not None}
        if clocks:
            out += ["", f"SM clock after timing: {', '.join(f'{c:.0f}' for c in sorted(clocks))} MHz"]
        out.append("")
    out += [legend(doc), ""]
    out += breakdown.markdown_section(doc)  # many-kernel calls (a model's step): each variant's top kernels
    problems = [r for r in doc["records"] if r["status"] in ("failed", "wrong")]
    if problems:
        out += ["## Failures and wrong results", ""]
        for r in problems:
            out.append(f"- `{r['variant']}` {r['dtype']} {r['shape_label']}: {r['status']}: {r['error']}")
        out.append("")
    out += ["## Environment", "", tabulate(_env_rows(doc), headers=["", ""], tablefmt="github"), ""]
    return "\n".join(out)


def write_markdown(doc: dict, folder: Path, png_name: str | None) -> Path:
    path = folder / MD_NAME
    _write_atomic(path, markdown(doc, png_name))
    return path


def write_all(doc: dict, folder: Path) -> dict[str, Path]:
    """Every file of the report; the plot is best effort (a report without it is still a report)."""
    from . import plot

    files = {"json": write_json(doc, folder), "csv": write_csv(doc, folder)}
    try:
        files["png"] = plot.throughput(doc, folder / PNG_NAME)
    except Exception as e:  # noqa: BLE001
        doc.setdefault("notes", []).append(f"plot not drawn: {type(e).__name__}: {e}")
    files["md"] = write_markdown(doc, folder, PNG_NAME if "png" in files else None)
    return files
