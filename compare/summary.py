"""One page over many ops' reports: what a sweep of every op (``make bench``) is read by.

Each op's report (``<run>/<op>/report.md``) has every dtype, shape and variant.
Over sixteen ops a reader first wants three things, which this page gives:
for each op and dtype, tk at the largest shape (share of the limit, speed-up
over eager, compile and the fastest other variant); every large case where tk
is not the fastest; every small case where tk is behind by CUDA-graph time;
and every variant that failed or gave a wrong answer.

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

from .formats import device_label, fmt_megabytes, fmt_microseconds, fmt_ratio
from .record import LARGE, LARGEST, SMALL, cells, groups, titles
from .schema import SCHEMA

LARGE_BYTES = 64e6  # "large": 64 MB moved or more, where a kernel should be at the hardware's limit
TIE = 1.02  # tk within 2% of the fastest other variant counts as level with it


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


def compare_case(records: list[dict]) -> dict | None:
    """tk against the others at one shape: None when tk or every other variant has no time."""
    tk = next((r for r in records if r["kind"] == "tk" and _timed(r)), None)
    others = [r for r in records if r["kind"] != "tk" and _timed(r)]
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
    }


def _shapes(records: list[dict]) -> dict[str, list[dict]]:
    """One (op, dtype)'s records by shape label (skipped peers left out, as in the op's report)."""
    return {label: shape_records for _, label, shape_records in groups(records)}


# Each table: a case's key (op, dtype, shape, MB moved), then tk's fields that record.py shows in
# the table, then how tk compares with the fastest other variant.


def _key(op: str, dtype: str, label: str, nbytes: int) -> list[str]:
    return [op, dtype, label, fmt_megabytes(nbytes)]


def _against(vs_best: float, best: dict) -> str:
    return f"{fmt_ratio(vs_best)} ({best['variant']})"


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
        rows.append([*_key(op, dtype, label, tk["bytes"]), *cells(LARGEST, tk), _against(case["vs_best"], case["best"])])
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
                comparison = [_against(case["vs_best"], case["best"]), fmt_ratio(case["graph_vs_best"])]
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
            others = [r for r in shape_records if r["kind"] != "tk" and _graphed(r)]
            if tk is None or not others or tk["bytes"] >= LARGE_BYTES:
                continue
            count += 1
            best = min(others, key=lambda r: r["cudagraph_ms"])
            vs_best = best["cudagraph_ms"] / tk["cudagraph_ms"]
            if vs_best * TIE < 1:
                comparison = [f"{fmt_microseconds(best['cudagraph_ms'])} ({best['variant']})", fmt_ratio(vs_best)]
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
    out += [
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
