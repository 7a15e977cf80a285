"""``kernels/index.json`` and ``index.md``: every captured kernel of an op's report, both sides.

The hand-written side: each of tk's kernels (its source), the compiled specializations the
cases launched (``compiled``), and per case the launches that ran (``tk``).  The generated
side: per compiled variant and case, Inductor's modules, kernels, library calls and stages
(``generated``).  The profiler's time of each kernel comes from the report's records.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .formats import fmt_time
from .record import NOISY, marked


def write_index(
    op_dir: Path, spec, device: torch.device, handwritten: list[dict], generated: list[dict], doc: dict
) -> None:
    """``kernels/index.json`` and ``index.md``: every kernel, with the profiler's times from ``doc``'s records.
    ``generated``: the capture's entries (``capture.Entry`` as dicts), both sides: tk's cases go to ``tk``,
    and the compiled specializations they launched to their kernel's ``compiled``."""
    times = {}
    for r in doc["records"]:
        for name, us in (r.get("kernel_us") or {}).items():
            times[(r["variant"], r["dtype"], r["shape_label"], name)] = us
    tk = [e for e in generated if e.get("side") == "tk"]
    generated = [e for e in generated if e.get("side", "generated") == "generated"]
    index = {"op": spec.name, "device": device.type, "handwritten": handwritten, "generated": generated, "tk": tk}
    by_name = {h["name"]: h for h in handwritten}
    for e in tk:
        for launch in e["launches"] + ((e.get("planned") or {}).get("launches") or []):
            h = by_name.get(launch["kernel"])
            for ir in launch.get("ir", []) if h is not None else []:
                if all(c["folder"] != ir["folder"] for c in h["compiled"]):
                    h["compiled"].append({**ir, "target": launch.get("target")})
    for e in index["generated"]:
        for k in e["kernels"]:
            k["us_per_call"] = _time_of(times, e, k["name"])
    root = Path(op_dir) / "kernels"
    root.mkdir(parents=True, exist_ok=True)
    (root / "index.json").write_text(json.dumps(index, indent=1, default=str) + "\n")
    (Path(op_dir) / "index.md").write_text(index_markdown(index, doc))


def _time_of(times: dict, entry: dict, name: str):
    """The profiler's time of kernel ``name`` (on a CPU, Inductor prefixes it: graph_0_cpp_fused_...)."""
    key = (entry["variant"], entry["dtype"], entry["shape_label"])
    for (v, d, s, n), us in times.items():
        if (v, d, s) == key and (n == name or n.endswith("_" + name)):
            return us
    return None


def _us(value) -> str:
    return "" if value is None else f"{value:.2f}"


def _median(records: dict, variant: str, dtype: str, label: str) -> str:
    """The variant's median at that case, as report.md shows it (marked where it is not stable)."""
    r = records.get((variant, dtype, label))
    if r is None or r.get("median_ms") is None:
        return ""
    return marked(fmt_time(r["median_ms"]), r, NOISY)


PROFILER_NOTE = (
    "**profiler µs**: the kernel's time per call over two calls under `torch.profiler`, which adds a cost of its own"
    " to every op it records (on a CPU often more than a small op itself): where a kernel sits in its variant, not a"
    " timing. **median**: the variant's timed median per call, report.md's figure, the one to quote."
)


def index_markdown(index: dict, doc: dict) -> str:
    from tabulate import tabulate

    op = index["op"]
    gpu = index["device"] == "cuda"
    records = {(r["variant"], r["dtype"], r["shape_label"]): r for r in doc["records"]}
    out = [f"# {op}: the kernels that compete", ""]
    out.append("profiler µs: device time of the kernel." if gpu else
               "CPU run: profiler µs is the CPU time of the kernel (or op);"
               " tk's kernels run in Triton's interpreter there, timed as the whole tk op.")  # fmt: skip
    out += ["", PROFILER_NOTE]
    out += ["", "## Hand-written (tk)", ""]
    tk_recs = [r for r in doc["records"] if r["variant"] == "tk"]
    rows = []
    for h in index["handwritten"]:
        per_shape = [f"{r['dtype']} {r['shape_label']}: {_us(r['kernel_us'][h['name']])} (tk median "
                     f"{_median(records, 'tk', r['dtype'], r['shape_label'])})"
                     for r in tk_recs if h["name"] in (r.get("kernel_us") or {})]  # fmt: skip
        regs = "; ".join(
            f"{c['info'].get('n_regs', '?')} regs, {c['info'].get('shared', '?')} B shared, {c['info'].get('num_warps', '?')} warps"
            for c in h["compiled"]
        )
        lower = ", ".join(f"[{c['folder']}]({c['folder']})" for c in h["compiled"])
        rows.append([h["name"], f"[{h['file']}]({h['file']})", h["lines"], "<br>".join(per_shape) or "", regs, lower])
    headers = ["kernel", "source", "lines", "profiler µs per call", "compiled", "ttir/ttgir/llir/ptx/sass"]
    out.append(tabulate(rows, headers=headers, tablefmt="github"))
    if not gpu:
        ops_times = [f"{r['dtype']} {r['shape_label']}: {n} {_us(us)} profiler µs" for r in tk_recs
                     for n, us in (r.get("kernel_us") or {}).items()]  # fmt: skip
        if ops_times:
            out += ["", "The tk op per call (interpreted, not a performance figure): " + "; ".join(ops_times)]
    out += tk_launches_markdown(index)
    out += ["", "## Generated by Inductor", ""]
    rows = []
    for e in index["generated"]:
        for k in e["kernels"]:
            info = k.get("info") or {}
            regs = f"{info['n_regs']} regs, {info.get('shared', '?')} B shared" if "n_regs" in info else ""
            path = f"{e['folder']}/{k['file']}"
            rows.append([k["name"], e["variant"], e["dtype"], e["shape_label"], k["kind"], k["lines"],
                         _us(k.get("us_per_call")), _median(records, e["variant"], e["dtype"], e["shape_label"]),
                         regs, f"[{k['file']}]({path})",
                         f"[{e['modules'][0]['file']}]({e['folder']}/{e['modules'][0]['file']})" if e["modules"] else ""])  # fmt: skip
        for name in e["extern"]:
            median = _median(records, e["variant"], e["dtype"], e["shape_label"])
            rows.append([f"extern_kernels.{name}", e["variant"], e["dtype"], e["shape_label"], "extern (library)",
                         "", "", median, "", "", ""])  # fmt: skip
        if e["error"]:
            rows.append([f"(capture: {e['error']})", e["variant"], e["dtype"], e["shape_label"], *[""] * 7])
    headers = ["kernel", "variant", "dtype", "shape", "kind", "lines", "profiler µs per call", "median (report.md)",
               "compiled", "source", "module"]  # fmt: skip
    out.append(tabulate(rows, headers=headers, tablefmt="github"))
    out += ["", "Each `output_code.py` runs by itself (`python output_code.py` benchmarks the module), as Inductor's own do.", ""]
    out += stages_markdown(index)
    return "\n".join(out)


def launch_text(launch: dict) -> str:
    """A launch in one line: grid, constexprs, options, the autotuner's choice."""
    knobs = " ".join(f"{k}={v}" for k, v in {**launch["constexprs"], **launch["options"]}.items())
    chosen = launch.get("chosen_config")
    chosen = (" autotuned to " + " ".join(f"{k}={v}" for k, v in chosen.items())) if chosen else ""
    return f"`{launch['kernel']}` grid {launch['grid']} {knobs}{chosen}".rstrip()


def _ir_links(launch: dict) -> str:
    return "; ".join(", ".join(f"[{f.rsplit('.', 1)[1]}]({ir['folder']}/{f})" for f in ir["files"]) for ir in launch.get("ir", []))


def tk_launches_markdown(index: dict) -> list[str]:
    """Per case, the launches tk's variant made (and those planned for an H100, with their IR, on a CPU)."""
    if not index.get("tk"):
        return []
    out = ["", "### The launches of tk's kernels, per case", ""]
    for e in index["tk"]:
        ran = "; ".join(launch_text(launch) + (f" ({_ir_links(launch)})" if launch.get("ir") else "")
                        for launch in e["launches"]) or "none seen"  # fmt: skip
        out.append(f"- {e['dtype']} {e['shape_label']}: {ran}" + (f" (capture: {e['error']})" if e["error"] else ""))
        planned = e.get("planned")
        if planned:
            rows = "; ".join(f"{launch_text(launch)} ({_ir_links(launch) or ', '.join(launch.get('errors', []))})"
                             for launch in planned["launches"])  # fmt: skip
            out.append(f"  - planned for an {planned['gpu']} ({planned['target']}): {rows}")
    return out


def stages_markdown(index: dict) -> list[str]:
    """Per compiled variant and case, the TORCH_LOGS stages stored beside its output code."""
    from .stages import STAGES

    rows = []
    for e in index["generated"]:
        if not e.get("stages"):
            continue
        cells = []
        for stage in STAGES:
            got = e["stages"].get(stage, {})
            cells.append(f"[{got['file']}]({e['folder']}/{got['file']})" if "file" in got else got.get("source", ""))
        rows.append([e["variant"], e["dtype"], e["shape_label"], *cells])
    if not rows:
        return []
    from tabulate import tabulate

    out = ["## Inductor's stages (TORCH_LOGS)", ""]
    out += [f"- `{stage}`: {what}" for stage, (_, what) in STAGES.items()]
    out += ["", tabulate(rows, headers=["variant", "dtype", "shape", *STAGES], tablefmt="github"), ""]
    return out

