"""report.html: one op's report in one file that opens offline, both sides of each case side by side.

What report.md has (the results tables, the measured limits, the legend, the environment), the
plot inlined (base64 PNG), and per (dtype, shape) the hand-written side beside Inductor's:

* tk: the launches its variant made for that shape (kernel, how many per call, grid,
  constexprs and warps, the autotuner's choice), each kernel's time per call and launches
  where the profiler measured them (GPU), links to its compiled levels (TTIR, TTGIR, LLIR,
  PTX, SASS), and its source, coloured (``highlight``);
* each compiled variant: its kernels (kind, lines, time, launches, compiled levels), its
  library calls, links to output_code.py and to the TORCH_LOGS stages beside it, and each
  kernel's source;
* with ``--profile``, each variant's key_averages table and Chrome trace; with ``--ncu``,
  Nsight Compute's summary.

Everything is read from the report's own folder (results, ``kernels/index.json``,
``profile/``, ``ncu/``), so ``write`` runs last, after the other pages.  No script, no font or
style sheet from elsewhere: links are relative to the report's folder.
"""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path

from . import highlight, profiling, report
from .files import write_atomic
from .formats import device_label, fmt_time
from .record import CONFIGS, RESULTS, groups, has_peak_memory

HTML_NAME = "report.html"
MAX_SOURCE_LINES = 400  # longer sources are linked, not inlined (a model's whole module)

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1500px;
  padding:0 1.2rem 3rem;color:#1d2330}
h1{font-size:1.6rem;margin:1.2rem 0 .4rem}
h2{border-bottom:2px solid #d8dde6;padding-bottom:.2rem;margin-top:2rem}
h3{margin:1.6rem 0 .5rem;background:#eef2f8;padding:.35rem .6rem;border-radius:4px}
h4{margin:.6rem 0 .3rem}
table{border-collapse:collapse;margin:.4rem 0 .8rem;font-size:13px}
th,td{border:1px solid #d8dde6;padding:.2rem .45rem;text-align:left;vertical-align:top}
th{background:#f4f6fa}
tr.best td{background:#eefaf0}
tr.bad td{background:#fdeeee}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.pair{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:1rem}
.side{border:1px solid #d8dde6;border-radius:6px;padding:.4rem .7rem;min-width:0}
.side.tk{border-top:4px solid #2ca02c}
.side.gen{border-top:4px solid #ff7f0e}
.muted{color:#667}
.small{font-size:12px}
.bar{display:inline-block;height:.7em;background:#6b8fd6;margin-right:.35em;vertical-align:middle}
.tk .bar{background:#2ca02c}
.gen .bar{background:#ff7f0e}
details{margin:.3rem 0}
summary{cursor:pointer;font-weight:600}
nav a{margin-right:.8rem}
code{font-size:12.5px}
pre.code{background:#fbfbfd;border:1px solid #e3e6ec;border-radius:4px;padding:.4rem 0;max-height:34em;
  overflow:auto;font-size:12px;line-height:1.35;counter-reset:line;margin:.3rem 0}
pre.code .line{white-space:pre}
pre.code .line::before{counter-increment:line;content:counter(line);display:inline-block;width:3.2em;
  margin-right:.8em;text-align:right;color:#9aa3b2}
.k{color:#7b30d0;font-weight:600}
.s{color:#1a7f37}
.c{color:#8a8f98;font-style:italic}
.n{color:#b35900}
.d{color:#b3186e}
.f{color:#0550ae;font-weight:600}
.b{color:#0a7e8c}
.t{color:#c2410c}
.p{color:#8250df}
img.plot{max-width:100%;border:1px solid #e3e6ec}
.legend{white-space:pre-wrap;font-size:12.5px;background:#f8f9fb;padding:.5rem .7rem;border-radius:4px}
"""


def esc(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _anchor(*parts: str) -> str:
    return "case-" + re.sub(r"[^A-Za-z0-9_-]+", "-", "-".join(parts)).strip("-")


def _link(path: str, text: str | None = None) -> str:
    return f'<a href="{esc(path)}">{esc(text or path.rsplit("/", 1)[-1])}</a>'


def _table(headers: list[str], rows: list[list[str]], row_classes: list[str] | None = None, raw: bool = False) -> str:
    """A table; cells are escaped unless ``raw`` (then they are HTML already)."""
    head = "".join(f"<th>{h if raw else esc(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{c if raw else esc(c)}</td>" for c in row) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _read(op_dir: Path, path: str) -> str | None:
    try:
        return (op_dir / path).read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _source_block(op_dir: Path, path: str, title: str, open_: bool = False) -> str:
    """A collapsible, coloured source of the file at ``path`` (relative to the report)."""
    text = _read(op_dir, path)
    if text is None:
        return f"<p class='muted'>{esc(title)}: {_link(path)} (not found)</p>"
    lines = text.count("\n") + 1
    if lines > MAX_SOURCE_LINES:
        return f"<p>{esc(title)}: {_link(path)} ({lines} lines: open the file)</p>"
    summary = f"{esc(title)} <span class='muted small'>({lines} lines, {_link(path, 'file')})</span>"
    code = highlight.to_html(text, highlight.language_of(path))
    return f"<details{' open' if open_ else ''}><summary>{summary}</summary>{code}</details>"


# --------------------------------------------------------------------------
# Times and launch counts of a kernel in a variant's record.
# --------------------------------------------------------------------------


def _matches(profiled: str, name: str) -> bool:
    """The profiler's name of a kernel: the name itself, or with Inductor's prefix (graph_0_cpp_fused_...)."""
    return profiled == name or profiled.endswith("_" + name)


def kernel_time(rec: dict | None, name: str) -> float | None:
    for profiled, us in ((rec or {}).get("kernel_us") or {}).items():
        if _matches(profiled, name):
            return us
    return None


def kernel_launches(rec: dict | None, name: str) -> int | None:
    names = (rec or {}).get("kernel_names") or []
    return sum(_matches(n, name) for n in names) if names else None


def _bar(us: float | None, scale: float) -> str:
    if us is None or not scale:
        return ""
    return f'<span class="bar" style="width:{max(2, round(120 * us / scale))}px"></span>{us:,.2f}'


def _median(rec: dict | None) -> str:
    if rec is None:
        return ""
    text = fmt_time(rec.get("median_ms")) or rec.get("status", "")
    return f"{text} ({rec['status']})" if rec.get("status") not in ("ok", None) else text


# --------------------------------------------------------------------------
# The two sides of a case.
# --------------------------------------------------------------------------


def _knobs(launch: dict) -> str:
    """Constexprs and options as launched, and the config the autotuner chose (HTML)."""
    text = esc(" ".join(f"{k}={v}" for k, v in {**launch["constexprs"], **launch["options"]}.items()))
    chosen = launch.get("chosen_config")
    if chosen:
        text += " <b>autotuned:</b> " + esc(" ".join(f"{k}={v}" for k, v in chosen.items()))
    return text


def _ir_cell(launch: dict) -> str:
    parts = []
    for ir in launch.get("ir", []):
        links = " ".join(_link(f"{ir['folder']}/{f}", f.rsplit(".", 1)[1]) for f in ir["files"])
        info = ir.get("info") or {}
        facts = ", ".join(x for x in (f"{info['n_regs']} regs" if "n_regs" in info else "",
                                      f"{info['n_spills']} spills" if info.get("n_spills") else "",
                                      f"{info.get('shared', '?')} B shared", f"{info.get('num_warps', '?')} warps") if x)  # fmt: skip
        config = " ".join(f"{k}={v}" for k, v in (ir.get("config") or {}).items())
        lead = f"<span class='small'>{esc(config)}:</span> " if config else ""
        parts.append(f"{lead}{links} <span class='muted small'>({esc(facts)})</span>")
    parts += [f"<span class='muted'>not compiled: {esc(e)}</span>" for e in launch.get("errors", [])]
    return "<br>".join(parts)


def _grouped(launches: list[dict]) -> list[tuple[dict, int]]:
    """Launches with the same kernel, constexprs and options together: (the first, how many)."""
    out: dict[str, list] = {}
    for launch in launches:
        key = json.dumps([launch["kernel"], launch["constexprs"], launch["options"]], sort_keys=True, default=str)
        out.setdefault(key, [launch, 0])[1] += 1
    return [(first, count) for first, count in out.values()]


def tk_side(op_dir: Path, entry: dict | None, rec: dict | None, sources: dict, gpu: bool, scale: float) -> str:
    out = [f"<h4>tk (hand-written) <span class='muted'>median {esc(_median(rec))}</span></h4>"]
    if entry is None:
        return "".join(out) + "<p class='muted'>No launches recorded (capture off, or tk not in the sweep).</p>"
    rows = []
    for launch, count in _grouped(entry["launches"]):
        us = kernel_time(rec, launch["kernel"]) if gpu else None
        measured = kernel_launches(rec, launch["kernel"]) if gpu else None
        rows.append([f"<code>{esc(launch['kernel'])}</code>", str(measured if measured is not None else count),
                     esc(launch["grid"]), _knobs(launch), _bar(us, scale) if gpu else "<span class='muted'>interpreted</span>",
                     _ir_cell(launch)])  # fmt: skip
    where = "ran on this GPU" if gpu else "ran here, in Triton's interpreter (the CPU's plan)"
    out.append(f"<p class='small muted'>Launches per call that {where}.</p>")
    out.append(_table(["kernel", "launches", "grid", "constexprs, warps", "µs per call", "compiled levels"], rows, raw=True)
               if rows else "<p class='muted'>none seen</p>")  # fmt: skip
    if entry.get("error"):
        out.append(f"<p class='muted'>capture: {esc(entry['error'])}</p>")
    planned = entry.get("planned")
    if planned:
        rows = [[f"<code>{esc(launch['kernel'])}</code>", str(count), esc(launch["grid"]), _knobs(launch), _ir_cell(launch)]
                for launch, count in _grouped(planned["launches"])]  # fmt: skip
        out.append(f"<p class='small'>On an {esc(planned['gpu'])}: the launches its plan makes (fake tensors), compiled for"
                   f" {esc(planned['target'])} on this machine.</p>")  # fmt: skip
        out.append(_table(["kernel", "launches", "grid", "constexprs, warps", "compiled levels"], rows, raw=True))
        if planned.get("error"):
            out.append(f"<p class='muted small'>the plan stopped: {esc(planned['error'])}</p>")
    names = dict.fromkeys(launch["kernel"] for launch in entry["launches"] + ((planned or {}).get("launches") or []))
    for name in names:
        if name in sources:
            out.append(_source_block(op_dir, sources[name], name, open_=len(names) == 1))
    return "".join(out)


def generated_side(op_dir: Path, entry: dict, rec: dict | None, gpu: bool, scale: float) -> str:
    out = [f"<h4>{esc(entry['variant'])} (Inductor) <span class='muted'>median {esc(_median(rec))}</span></h4>"]
    links = [_link(f"{entry['folder']}/{m['file']}", m["file"]) for m in entry["modules"]]
    stages = []
    for stage, got in (entry.get("stages") or {}).items():
        stages.append(_link(f"{entry['folder']}/{got['file']}", stage) if "file" in got
                      else f"<span class='muted' title='{esc(got.get('source'))}'>{esc(stage)}: none</span>")  # fmt: skip
    if links or stages:
        out.append(f"<p class='small'>{' '.join(links)}{' | TORCH_LOGS: ' + ' '.join(stages) if stages else ''}</p>")
    rows = []
    for k in entry["kernels"]:
        us = kernel_time(rec, k["name"])
        lower = " ".join(_link(f"{entry['folder']}/{f}", f.rsplit(".", 1)[1]) for f in k.get("lower", []))
        info = k.get("info") or {}
        if "n_regs" in info:
            lower += f" <span class='muted small'>({info['n_regs']} regs, {info.get('shared', '?')} B shared)</span>"
        rows.append([f"<code>{esc(k['name'])}</code>", esc(k["kind"]), str(k["lines"]),
                     esc(kernel_launches(rec, k["name"]) or ""), _bar(us, scale), lower])  # fmt: skip
    rows += [[f"<code>extern_kernels.{esc(name)}</code>", "library", "", "", "", ""] for name in entry["extern"]]
    unit = "µs per call" if gpu else "profiler µs (CPU op)"
    out.append(_table(["kernel", "kind", "lines", "launches", unit, "compiled levels"], rows, raw=True)
               if rows else "<p class='muted'>no kernel</p>")  # fmt: skip
    if entry.get("error"):
        out.append(f"<p class='muted'>capture: {esc(entry['error'])}</p>")
    for k in entry["kernels"]:
        out.append(_source_block(op_dir, f"{entry['folder']}/{k['file']}", k["name"], open_=len(entry["kernels"]) == 1))
    return "".join(out)


def profile_block(profiles: list[dict]) -> str:
    out = []
    for p in profiles:
        by = "self device µs" if p["device"] == "cuda" else "self CPU µs"
        rows = [[esc(r["name"][:90]), f"{r['calls']:g}", f"{r['self_device_us']:,.2f}", f"{r['device_us']:,.2f}",
                 f"{r['self_cpu_us']:,.2f}"] for r in p["rows"]]  # fmt: skip
        table = _table(["name", "calls per call", "self device µs", "device µs", "self CPU µs"], rows, raw=True)
        summary = (f"{esc(p['variant'])}: torch.profiler over {p['calls']} calls, by {by} "
                   f"<span class='small'>({_link(p['trace'], 'trace.json')}, {_link(p['table'], 'key_averages.txt')})</span>")
        out.append(f"<details><summary>{summary}</summary>{table}</details>")
    return "".join(out)


# --------------------------------------------------------------------------
# The page.
# --------------------------------------------------------------------------


def _index(op_dir: Path) -> dict:
    try:
        return json.loads((op_dir / "kernels" / "index.json").read_text())
    except (OSError, ValueError):
        return {"handwritten": [], "generated": [], "tk": [], "device": None}


def _plot(op_dir: Path, name: str = report.PNG_NAME, alt: str = "throughput against size, one line per variant") -> str:
    try:
        data = base64.b64encode((op_dir / name).read_bytes()).decode()
    except OSError:
        return ""
    return f'<img class="plot" alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def _results_table(doc: dict, recs: list[dict], table: str = RESULTS) -> str:
    """One (dtype, shape)'s table of ``table`` (record.py), the best row and the bad ones marked."""
    headers, rows = report.table_rows(recs, doc["bound"], table)
    classes = ["best" if r.get("best") else ("bad" if r["status"] in ("failed", "wrong") else "") for r in recs]
    return _table(headers, rows, classes)


def _case(doc: dict, op_dir: Path, dtype: str, label: str, recs: list[dict], index: dict, profiles: list[dict]) -> str:
    gpu = doc["settings"]["device"] == "cuda"
    out = [f'<h3 id="{_anchor(dtype, label)}">{esc(report.group_title(doc["op"], dtype, label, recs))}</h3>',
           _results_table(doc, recs)]  # fmt: skip
    by_variant = {r["variant"]: r for r in recs}
    tk_entry = next((e for e in index.get("tk", []) if (e["dtype"], e["shape_label"]) == (dtype, label)), None)
    generated = [e for e in index.get("generated", []) if (e["dtype"], e["shape_label"]) == (dtype, label)]
    if tk_entry is not None or generated:
        times = [kernel_time(by_variant.get(e["variant"]), k["name"]) for e in generated for k in e["kernels"]]
        if tk_entry is not None and gpu:
            times += [kernel_time(by_variant.get("tk"), launch["kernel"]) for launch in tk_entry["launches"]]
        scale = max((t for t in times if t is not None), default=0.0)
        sources = {h["name"]: h["file"] for h in index.get("handwritten", [])}
        right = "".join(generated_side(op_dir, e, by_variant.get(e["variant"]), gpu, scale) for e in generated)
        left = tk_side(op_dir, tk_entry, by_variant.get("tk"), sources, gpu, scale)
        out.append(f'<div class="pair"><div class="side tk">{left}</div>'
                   f'<div class="side gen">{right or "<p class=muted>No compiled variant captured.</p>"}</div></div>')  # fmt: skip
    mine = [p for p in profiles if (p["dtype"], p["shape_label"]) == (dtype, label)]
    if mine:
        out.append("<h4>Profile</h4>" + profile_block(mine))
    return "".join(out)


def _configs_block(doc: dict, op_dir: Path) -> str:
    """--configs: each configuration of tk's kernel per (dtype, shape), its plot first."""
    if not doc.get("configs"):
        return ""
    out = ["<h2 id='configs'>Kernel configurations (--configs)</h2>"]
    out += [f"<p>{esc(line)}</p>" for line in report.configs_intro(doc)]
    out.append(_plot(op_dir, report.CONFIGS_PNG_NAME, "each configuration of tk's kernel, one line per shape"))
    for dtype, label, recs in groups(doc["configs"]):
        title = report.group_title(doc["op"], dtype, label, recs)
        out += [f"<h3>{esc(title)}</h3>", _results_table(doc, recs, CONFIGS)]
    return "".join(out)


def _ncu_block(result: dict | None) -> str:
    if not result:
        return ""
    from . import ncu

    columns = [c for c, _, _ in ncu.METRICS.values()]
    rows = [[r["variant"], r["kernel"][:70], *("" if r[c] is None else f"{r[c]:,.4g}" for c in columns)]
            for r in result["rows"]]  # fmt: skip
    units = {c: u for c, _, u in ncu.METRICS.values()}
    out = [f'<h2 id="ncu">Nsight Compute: {esc(result["dtype"])} {esc(result["shape_label"])}</h2>',
           f"<p class='small'>{_link('ncu/summary.md', 'summary.md')}; the .ncu-rep files in {_link('ncu', 'ncu/')} open in"
           " Nsight Compute. Kernels at base clock, caches flushed between replays: compare them with each other.</p>",
           _table(["variant", "kernel", *(f"{c} ({units[c]})" if units[c] else c for c in columns)], rows)]  # fmt: skip
    out += [f"<p class='muted'>{esc(e['variant'])}: {esc(e['error'])}</p>" for e in result.get("errors", [])]
    return "".join(out)


def page(doc: dict, op_dir: Path) -> str:
    op_dir = Path(op_dir)
    s = doc["settings"]
    index = _index(op_dir)
    profiles = profiling.read_profiles(op_dir)
    cases = list(groups(doc["records"]))
    nav = " ".join(f'<a href="#{_anchor(d, lab)}">{esc(d)} {esc(lab)}</a>' for d, lab, _ in cases)
    out = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
           f"<title>{esc(doc['op'])}: tk against eager and torch.compile</title><style>{CSS}</style></head><body>",
           f"<h1>{esc(doc['op'])}: tk against eager and torch.compile</h1>"]  # fmt: skip
    if not doc["complete"]:
        out.append("<p><b>Incomplete: the run was interrupted; the tables hold what ran before.</b></p>")
    facts = [f"device: {device_label(doc['environment'])}; started {doc['started_utc']}, finished {doc['finished_utc']}",
             f"dtypes: {', '.join(s['dtypes'])}; shapes: {', '.join(s['shape_labels'])}",
             f"variants: {', '.join(s['variants'])}; bound: {doc['bound']}",
             f"timing: {s['timing_method']}; {s['rounds']} interleaved round(s) of {s['rep_ms']} ms per variant"]  # fmt: skip
    if s["device"] == "cpu":
        facts.append("CPU run: wall-clock times; tk runs in Triton's interpreter, so its time is no performance figure")
    out.append("<ul>" + "".join(f"<li>{esc(f)}</li>" for f in facts) + "</ul>")
    out.append(f"<nav class='small'><b>Cases:</b> {nav} <a href='#environment'>environment</a>"
               f"{' <a href=#ncu>Nsight Compute</a>' if doc.get('ncu') else ''}</nav>")  # fmt: skip
    limits = [[cell.replace("**", "") for cell in row] for row in report._limit_rows(doc)] or [["none", "", ""]]
    out.append("<h2>Measured limits</h2>" + _table(["limit", "value", "how"], limits))
    out.append("<h2>Results</h2>" + _plot(op_dir))
    if has_peak_memory(doc["records"]):  # (a memory.png left by an earlier run in the folder is not this run's)
        out.append(_plot(op_dir, report.MEMORY_PNG_NAME, "each variant's time against its peak memory, a panel per case"))
    for dtype, label, recs in cases:
        out.append(_case(doc, op_dir, dtype, label, recs, index, profiles))
    out.append(_configs_block(doc, op_dir))
    out.append(f"<h2>Legend</h2><div class='legend'>{esc(report.legend(doc))}</div>")
    out.append(_ncu_block(doc.get("ncu")))
    problems = [r for r in doc["records"] + doc.get("configs", []) if r["status"] in ("failed", "wrong")]
    if problems:
        items = "".join(f"<li><code>{esc(r['variant'])}</code> {esc(r['dtype'])} {esc(r['shape_label'])}: {esc(r['status'])}:"
                        f" {esc(r['error'])}</li>" for r in problems)  # fmt: skip
        out.append(f"<h2>Failures and wrong results</h2><ul>{items}</ul>")
    out.append("<h2 id='environment'>Environment</h2>" + _table(["", ""], report._env_rows(doc)))
    out.append(f"<p class='muted small'>Also here: {_link(report.MD_NAME)}, {_link(report.JSON_NAME)}, {_link(report.CSV_NAME)},"
               f" {_link('index.md')}.</p></body></html>")  # fmt: skip
    return "\n".join(out)


def write(doc: dict, folder: Path) -> Path:
    path = Path(folder) / HTML_NAME
    write_atomic(path, page(doc, folder))
    return path

