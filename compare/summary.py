"""One page over many ops' reports: what a sweep of every op (``make bench``) is read by.

Each op's report (``<run>/<op>/report.md``) has every dtype, shape and variant.
Over sixteen ops a reader first wants the worst case, which this page gives
first: for each op and dtype, the smallest ratio of the fastest other
variant's time to tk's over every shape (CUDA-graph times under 64 MB moved,
where tk and another variant have one, medians otherwise: the speed target is
tk at ``TARGET`` or more) and the shape where it happens, and tk's smallest
share of the limit among the cases of 64 MB or more.  Then tk at the largest
shape (share of the limit, speed-up over eager, compile and the fastest other
variant); every large case where tk is not the fastest; every small case where
tk is behind by CUDA-graph time; and every variant that failed or gave a wrong
answer.  A ratio taken from a figure that is not stable is marked ``~``
(``record.FLAGS``), as in the op's report.

The harness writes ``summary.md`` into the run folder when it runs more than
one op.  A sweep split over several runs (one per dtype, or an op run again)
is put together from their folders, later runs replacing an (op, dtype) that
an earlier one had:

    python -m compare.summary logs/runs/RUN1 logs/runs/RUN2 --out summary.md

A report may be kept as ``results.json.gz`` (logs/examples/h100/sweep/ is), so a
kept sweep is refreshed for one op by naming its folder, then the new run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

from tabulate import tabulate

from . import record
from .formats import device_label, fmt_megabytes, fmt_microseconds, fmt_ratio
from .record import LARGE, LARGEST, SMALL, cells, flags_of, groups, titles
from .schema import SCHEMA

LARGE_BYTES = 64e6  # "large": 64 MB moved or more, where a kernel should be at the hardware's limit
TIE = 1.02  # tk within 2% of the fastest other variant counts as level with it
TARGET = 0.97  # the speed target: tk at least 0.97x the fastest of eager, torch.compile and the peers


REPORT_NAMES = ("results.json", "results.json.gz")


def _report_of(folder: Path) -> Path | None:
    """An op folder's report: its results.json, or else that file gzipped."""
    return next((folder / name for name in REPORT_NAMES if (folder / name).is_file()), None)


def _reports_in(folder: Path) -> list[Path]:
    """The folder's own report, or else each of its sub-folders' reports."""
    own = _report_of(folder)
    if own is not None:
        return [own]
    return [path for sub in sorted(folder.glob("*/")) if (path := _report_of(sub)) is not None]


def _read(path: Path) -> str:
    return gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()


def find_docs(folders: list[Path]) -> list[dict]:
    """The reports in `folders` (op folders, or run folders holding them), in the order given."""
    docs = []
    for folder in folders:
        folder = Path(folder)
        paths = _reports_in(folder)
        if not paths:
            raise FileNotFoundError(f"no results.json or results.json.gz in {folder} or in its sub-folders")
        for path in paths:
            try:
                doc = json.loads(_read(path))
            except (json.JSONDecodeError, UnicodeDecodeError, gzip.BadGzipFile, EOFError) as e:
                raise ValueError(f"{path} is not valid JSON (gzipped where named .gz): {e}") from e
            if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
                raise ValueError(f"{path} is not a report of python -m compare (its 'schema' is not {SCHEMA!r})")
            docs.append(doc)
    return docs


def merge(docs: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """Records by (op, dtype); a later document's records of an (op, dtype) replace an earlier one's."""
    merged: dict[tuple[str, str], list[dict]] = {}
    for doc in docs:
        fresh: dict[tuple[str, str], list[dict]] = {}
        for r in doc["records"]:
            fresh.setdefault((r["op"], r["dtype"]), []).append(r)
        merged.update(fresh)
    return merged


def _timed(r: dict) -> bool:
    return r["status"] == "ok" and r["median_ms"] is not None and not r["interpreted"]


def _rival(r: dict) -> bool:
    """A variant tk is judged against: neither tk nor tk under another plan (a lesson beside tk, not a rival)."""
    return r["kind"] not in ("tk", "tk-plan")


def compare_case(records: list[dict]) -> dict | None:
    """tk against the others at one shape: None when tk or every other variant has no time."""
    tk = next((r for r in records if r["kind"] == "tk" and _timed(r)), None)
    others = [r for r in records if _rival(r) and _timed(r)]
    if tk is None or not others:
        return None
    best = min(others, key=lambda r: r["median_ms"])
    graph_ratio = None
    if tk["cudagraph_ms"] and best["cudagraph_ms"]:
        graph_ratio = best["cudagraph_ms"] / tk["cudagraph_ms"]
    return {
        "tk": tk,
        "best": best,
        "vs_best": best["median_ms"] / tk["median_ms"],
        "graph_vs_best": graph_ratio,
        "noisy": _noisy(record.NOISY, tk, best),
    }


def _noisy(flag: str, *records: dict) -> bool:
    return any(flag in flags_of(r) for r in records)


def judged_case(records: list[dict]) -> dict | None:
    """tk against the fastest other at one shape by the figure the speed target names: under 64 MB moved the
    CUDA-graph time, where tk and another variant have one (against the variant fastest by it); the median
    otherwise.  None when tk or every other variant has no time."""
    tk = next((r for r in records if r["kind"] == "tk" and _timed(r)), None)
    if tk is not None and tk["bytes"] < LARGE_BYTES and _graphed(tk):
        others = [r for r in records if _rival(r) and _graphed(r)]
        if others:
            best = min(others, key=lambda r: r["cudagraph_ms"])
            ratio = best["cudagraph_ms"] / tk["cudagraph_ms"]
            noisy = _noisy(record.NOISY_GRAPH, tk, best)
            return {"tk": tk, "best": best, "ratio": ratio, "by": "CUDA graph", "noisy": noisy}
    case = compare_case(records)
    if case is None:
        return None
    return {"tk": case["tk"], "best": case["best"], "ratio": case["vs_best"], "by": "median", "noisy": case["noisy"]}


def _shapes(records: list[dict]) -> dict[str, list[dict]]:
    """One (op, dtype)'s records by shape label (skipped peers left out, as in the op's report)."""
    return {label: shape_records for _, label, shape_records in groups(records)}


# Each table: a case's key (op, dtype, shape, MB moved), then tk's fields that record.py shows in
# the table, then how tk compares with the fastest other variant.


def _key(op: str, dtype: str, label: str, nbytes: int) -> list[str]:
    return [op, dtype, label, fmt_megabytes(nbytes)]


def _against(vs_best: float, best: dict, noisy: bool = False) -> str:
    return f"{fmt_ratio(vs_best)}{record.MARK if noisy else ''} ({best['variant']})"


WORST_HEADERS = ["op", "dtype", "worst: fastest other / tk", "at shape", "by", f"meets {TARGET:.2f}x",
                 "lowest tk % of limit, 64 MB or more", "at shape"]  # fmt: skip


def worst_cases_table(merged: dict) -> list[list[str]]:
    """Per (op, dtype): the shape where tk does worst against the fastest other variant (``judged_case``),
    and the case of 64 MB or more where tk's share of the limit is lowest."""
    rows = []
    for (op, dtype), records in sorted(merged.items()):
        judged = [(label, case) for label, recs in _shapes(records).items() if (case := judged_case(recs)) is not None]
        if not judged:
            rows.append([op, dtype, "no time for tk or no other variant", "", "", "", "", ""])
            continue
        label, worst = min(judged, key=lambda lc: lc[1]["ratio"])
        meets = "yes" if worst["ratio"] >= TARGET else "NO"
        shares = [(lb, c["tk"]) for lb, c in judged
                  if c["tk"]["bytes"] >= LARGE_BYTES and c["tk"].get("limit_share") is not None]  # fmt: skip
        share, share_label = "", ""
        if shares:
            share_label, tk = min(shares, key=lambda lt: lt[1]["limit_share"])
            share = record.share_cell(tk)
        rows.append([op, dtype, _against(worst["ratio"], worst["best"], worst["noisy"]), label, worst["by"], meets,
                     share, share_label])  # fmt: skip
    return rows


LARGEST_COMPARISON = ["tk vs the fastest other"]


def largest_shapes_table(merged: dict) -> list[list[str]]:
    rows = []
    for (op, dtype), records in sorted(merged.items()):
        by_shape = _shapes(records)
        label = max(by_shape, key=lambda s: by_shape[s][0]["bytes"])
        case = compare_case(by_shape[label])
        if case is None:
            blank = [""] * (len(titles(LARGEST)) + len(LARGEST_COMPARISON) - 1)
            rows.append([*_key(op, dtype, label, by_shape[label][0]["bytes"]), "no time for tk or no other variant", *blank])
            continue
        tk = case["tk"]
        rows.append([*_key(op, dtype, label, tk["bytes"]), *cells(LARGEST, tk),
                     _against(case["vs_best"], case["best"], case["noisy"])])  # fmt: skip
    return rows


LARGE_COMPARISON = ["tk vs the fastest other", "the same, CUDA-graph times"]


def large_cases(merged: dict) -> tuple[int, list[list[str]]]:
    """How many large (op, dtype, shape) cases there are, and the rows of those where tk is not level with the fastest."""
    count, behind = 0, []
    for (op, dtype), records in sorted(merged.items()):
        for label, shape_records in _shapes(records).items():
            case = compare_case(shape_records)
            if case is None or case["tk"]["bytes"] < LARGE_BYTES:
                continue
            count += 1
            if case["vs_best"] * TIE < 1:
                comparison = [_against(case["vs_best"], case["best"], case["noisy"]), fmt_ratio(case["graph_vs_best"])]
                behind.append([*_key(op, dtype, label, case["tk"]["bytes"]), *cells(LARGE, case["tk"]), *comparison])
    return count, behind


def _graphed(r: dict) -> bool:
    return _timed(r) and bool(r["cudagraph_ms"])


SMALL_COMPARISON = ["the fastest other, µs", "tk vs it"]


def small_cases(merged: dict) -> tuple[int, list[list[str]]]:
    """How many small (op, dtype, shape) cases have CUDA-graph times for tk and another variant, and
    the rows of those where tk is not level with the fastest by that time.

    A small call's median is mostly the host launching it and the timing events around it (a few
    µs, moving by half a µs between runs); its CUDA-graph time is the GPU's, so the small cases
    are judged by that, against the variant fastest by it."""
    count, behind = 0, []
    for (op, dtype), records in sorted(merged.items()):
        for label, shape_records in _shapes(records).items():
            tk = next((r for r in shape_records if r["kind"] == "tk" and _graphed(r)), None)
            others = [r for r in shape_records if _rival(r) and _graphed(r)]
            if tk is None or not others or tk["bytes"] >= LARGE_BYTES:
                continue
            count += 1
            best = min(others, key=lambda r: r["cudagraph_ms"])
            vs_best = best["cudagraph_ms"] / tk["cudagraph_ms"]
            if vs_best * TIE < 1:
                noisy = record.MARK if _noisy(record.NOISY_GRAPH, tk, best) else ""
                fastest = f"{fmt_microseconds(best['cudagraph_ms'])} ({best['variant']})"
                comparison = [fastest, fmt_ratio(vs_best) + noisy]
                behind.append([*_key(op, dtype, label, tk["bytes"]), *cells(SMALL, tk), *comparison])
    return count, behind


def problems(merged: dict) -> list[list[str]]:
    """Variants that failed or were wrong: a row per (op, variant, status, reason), with the cases it covers."""
    where: dict[tuple, list[str]] = {}
    for (op, dtype), records in sorted(merged.items()):
        for r in records:
            if r["status"] not in ("failed", "wrong"):
                continue
            reason = r["error"] or f"relative error {r['rel_error']} over the tolerance {r['tolerance']}"
            key = (op, r["variant"], r["status"], reason.splitlines()[0][:120])
            where.setdefault(key, []).append(f"{dtype} {r['shape_label']}")
    rows = []
    for (op, variant, status, reason), cases in where.items():
        shown = ", ".join(cases[:3]) + (" ..." if len(cases) > 3 else "")
        rows.append([op, variant, status, str(len(cases)), shown, reason])
    return rows


def _header(docs: list[dict]) -> list[str]:
    env = docs[0]["environment"]
    copy = docs[0]["limits"].get("copy") or {}
    started = min(d["started_utc"] for d in docs)
    finished = max(d["finished_utc"] or d["started_utc"] for d in docs)
    lines = [
        f"- device: {device_label(env)}; torch {env.get('torch')}, Triton {env.get('triton')}",
        f"- {len({d['op'] for d in docs})} ops from {len(docs)} reports, {started} to {finished}",
    ]
    if copy.get("gbps"):
        lines.append(f"- copy bandwidth (the memory-bound limit): {copy['gbps']:,.0f} GB/s")
    incomplete = sorted({d["op"] for d in docs if not d["complete"]})
    if incomplete:
        lines.append(f"- interrupted, partial: {', '.join(incomplete)}")
    return lines


def _headers(shape_title: str, table: str, comparison: list[str]) -> list[str]:
    return ["op", "dtype", shape_title, "MB moved", *titles(table), *comparison]


def markdown(docs: list[dict]) -> str:
    merged = merge(docs)
    out = ["# Every op: tk against eager, torch.compile and the peers", "", *_header(docs), ""]
    legend = record.flag_legend([r for records in merged.values() for r in records if r["status"] != "skipped"])
    out += [
        "## The worst case of each op and dtype", "",
        f"Over every shape: the fastest other variant's time over tk's where that is smallest (the target is "
        f"{TARGET:.2f}x or more), by CUDA-graph time under 64 MB moved where tk and another variant have one, by "
        "median otherwise; and tk's lowest share of the limit among the cases of 64 MB or more.", "",
        tabulate(worst_cases_table(merged), WORST_HEADERS, tablefmt="github"), "",
        *[f"{line}\n" for line in legend],
        "## The largest shape of each op and dtype", "",
        "Share of the limit: of the copy bandwidth, or of cuBLAS for a compute-bound op. "
        "Speed-ups are ratios of medians in the same run; the last column is against the fastest other variant.", "",
        tabulate(largest_shapes_table(merged), _headers("largest shape", LARGEST, LARGEST_COMPARISON), tablefmt="github"),
        "",
    ]  # fmt: skip
    count, behind = large_cases(merged)
    out += [
        f"## Large cases (64 MB moved or more) where tk is not within {100 * (TIE - 1):.0f}% of the fastest", "",
        f"{count - len(behind)} of {count} large cases have tk within {100 * (TIE - 1):.0f}% of the fastest other variant's median.",
        "",
    ]
    if behind:
        out += [tabulate(behind, _headers("shape", LARGE, LARGE_COMPARISON), tablefmt="github"), ""]
    count, behind = small_cases(merged)
    out += [
        f"## Small cases (under 64 MB) where tk is not within {100 * (TIE - 1):.0f}% of the fastest by CUDA-graph time", "",
        f"{count - len(behind)} of {count} small cases with CUDA-graph times have tk within {100 * (TIE - 1):.0f}% of "
        "the fastest other variant's. (Their medians are mostly launch and timing overhead: see the op's report.)", "",
    ]  # fmt: skip
    if behind:
        out += [tabulate(behind, _headers("shape", SMALL, SMALL_COMPARISON), tablefmt="github"), ""]
    rows = problems(merged)
    out += ["## Variants that failed or were wrong", ""]
    out += [tabulate(rows, ["op", "variant", "status", "cases", "where", "reason"], tablefmt="github") if rows else "None.", ""]
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m compare.summary", description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", type=Path, help="run folders (or op folders); later ones replace an (op, dtype)")
    p.add_argument("--out", type=Path, help="write the page here (default: print it)")
    args = p.parse_args(argv)
    try:
        docs = find_docs(args.folders)
    except (FileNotFoundError, ValueError) as e:
        p.error(str(e))
    page = markdown(docs)
    if args.out:
        try:
            args.out.write_text(page)
        except OSError as e:
            p.exit(1, f"{p.prog}: error: cannot write {args.out}: {e}\n")
    else:
        print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
