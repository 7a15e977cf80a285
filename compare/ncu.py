"""``--ncu`` (``make profile OP=softmax TOOL=ncu``): Nsight Compute over one case's variants.

For the sweep's first (dtype, shape), each variant runs in a process of its own under ncu::

    ncu --nvtx --nvtx-include tk-ncu/ --metrics <METRICS> --export ncu/<variant>.ncu-rep --force-overwrite \\
        python -m compare.ncu --child '{"op": ..., "variant": ..., "dtype": ..., "shape": [...]}'

The child builds the variant as the harness does, makes the inputs (seed 0), calls it twice
(compiling, autotuning, warming up: outside the range) and once more inside the NVTX range
``tk-ncu``: ncu profiles only the kernels launched in that range.  The report is then read back
as CSV (``ncu --import <report> --csv --page raw --print-units base``) and summarized per
kernel (``parse_csv``, ``summarize``):

    ncu/<variant>.ncu-rep     the whole report: open it in Nsight Compute (ncu-ui) for every section
    ncu/<variant>.csv         the raw page, one row per kernel
    ncu/summary.md, .json     per kernel: time, DRAM bandwidth and its share of peak, achieved and
                              theoretical occupancy, registers per thread, local-memory (spill) traffic

ncu replays each kernel once per group of metrics, with the clocks locked to base
(``--clock-control base``, its default) and the caches flushed between passes: its durations
are the kernel's alone at base clock, not the report's medians.  Read the two side by side.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

RANGE = "tk-ncu"
TIMEOUT_S = 900  # per variant: a cold torch.compile, an autotune, and ncu's replays of a few kernels

# metric -> (column, what it is, unit the table shows)
METRICS = {
    "gpu__time_duration.sum": ("time", "the kernel's duration", "µs"),
    "dram__bytes.sum.per_second": ("DRAM", "achieved DRAM bandwidth", "GB/s"),
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": ("DRAM %", "DRAM throughput, share of peak", "%"),
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("SM %", "SM throughput, share of peak", "%"),
    "sm__warps_active.avg.pct_of_peak_sustained_active": ("occupancy", "achieved occupancy", "%"),
    "sm__maximum_warps_per_active_cycle_pct": ("theoretical", "theoretical occupancy", "%"),
    "launch__registers_per_thread": ("registers", "registers per thread", ""),
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum": ("spill loads", "local-memory bytes loaded (register spills)", "B"),
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum": ("spill stores", "local-memory bytes stored (register spills)", "B"),
    "launch__grid_size": ("grid", "blocks launched", ""),
    "launch__block_size": ("block", "threads per block", ""),
}

_PREFIX = {"": 1.0, "n": 1e-9, "u": 1e-6, "µ": 1e-6, "m": 1e-3, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def ncu_path() -> str | None:
    """Nsight Compute's command line: ``$NCU``, else ``ncu`` on PATH."""
    return shutil.which(os.environ.get("NCU", "ncu"))


def unavailable(device: torch.device, gpus: int = 1) -> str | None:
    """Why --ncu cannot run here, or None."""
    if device.type != "cuda":
        return f"Nsight Compute profiles GPU kernels; the device is {device.type}"
    if gpus > 1:
        return "it runs one variant at a time in one process: leave out --gpus"
    if ncu_path() is None:
        return "ncu (Nsight Compute) is not on PATH; set NCU=/path/to/ncu"
    return None


# --------------------------------------------------------------------------
# The command lines.
# --------------------------------------------------------------------------


def child_argv(op: str, variant: str, dtype: str, shape) -> list[str]:
    case = {"op": op, "variant": variant, "dtype": dtype, "shape": list(shape)}
    return [sys.executable, "-m", "compare.ncu", "--child", json.dumps(case)]


def profile_command(ncu: str, report: Path, child: list[str]) -> list[str]:
    """ncu over ``child``, the kernels of its ``tk-ncu`` NVTX range only, the summary's metrics, into ``report``."""
    return [ncu, "--nvtx", "--nvtx-include", f"{RANGE}/", "--metrics", ",".join(METRICS),
            "--export", str(report), "--force-overwrite", *child]  # fmt: skip


def import_command(ncu: str, report: Path) -> list[str]:
    """The report's raw page as CSV, in base units (seconds, bytes)."""
    return [ncu, "--import", str(report), "--csv", "--page", "raw", "--print-units", "base"]


# --------------------------------------------------------------------------
# Reading ncu's CSV.
# --------------------------------------------------------------------------


def number(text: str | None, unit: str = "") -> float | None:
    """A CSV value in its unit as a plain number (seconds, bytes, bytes/second); None for n/a."""
    if text is None:
        return None
    text = text.strip().replace(",", "")
    try:
        value = float(text)
    except ValueError:
        return None
    unit = unit.strip()
    # ncu's base units: `ns`, `byte/s`, `byte` (Nsight Compute 2025 on an H100); older releases and its
    # documentation spell `nsecond`, `Kbyte`, `Gbyte/second`.  `byte/s` before `s`: its prefix is no prefix.
    for base in ("byte/second", "byte/s", "second", "s", "byte"):
        if unit.endswith(base) and unit[: -len(base)] in _PREFIX:
            return value * _PREFIX[unit[: -len(base)]]
    return value  # %, register/thread, block, ...


def _csv_rows(text: str) -> list[list[str]]:
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("==")]
    return list(csv.reader(io.StringIO("\n".join(lines))))


def parse_csv(text: str) -> list[dict]:
    """One dict per profiled kernel: ``ID``, ``Kernel Name`` and each metric as (value, unit) strings.

    Two layouts are read: the raw page (``--page raw``: a header row, a row of units, a row per
    kernel, a column per metric) and the details page (``--page details``: a row per kernel and
    metric, with "Metric Name", "Metric Unit" and "Metric Value" columns)."""
    rows = _csv_rows(text)
    if not rows:
        return []
    header = rows[0]
    if "Metric Name" in header:  # the details page: pivot to one dict per kernel
        kernels: dict[str, dict] = {}
        for row in rows[1:]:
            cell = dict(zip(header, row))
            kernel = kernels.setdefault(cell.get("ID", ""), {"ID": cell.get("ID", ""), "Kernel Name": cell.get("Kernel Name", "")})
            kernel[cell["Metric Name"]] = (cell.get("Metric Value", ""), cell.get("Metric Unit", ""))
        return list(kernels.values())
    body = rows[1:]
    units = {}
    if body and not body[0][header.index("ID")].strip().isdigit():  # the row of units under the header
        units = dict(zip(header, body[0]))
        body = body[1:]
    out = []
    for row in body:
        cell = dict(zip(header, row))
        kernel = {"ID": cell.get("ID", ""), "Kernel Name": cell.get("Kernel Name", "")}
        kernel.update({name: (cell[name], units.get(name, "")) for name in METRICS if name in cell})
        out.append(kernel)
    return out


def summarize(kernels: list[dict], variant: str) -> list[dict]:
    """The summary's row per kernel: time in µs, DRAM in GB/s, shares in %, registers, spill bytes."""
    rows = []
    for k in kernels:
        row = {"variant": variant, "kernel": k["Kernel Name"], "id": k["ID"]}
        for metric, (column, _, unit) in METRICS.items():
            value = number(*k[metric]) if metric in k else None
            if value is not None and unit == "µs":
                value *= 1e6
            elif value is not None and unit == "GB/s":
                value /= 1e9
            row[column] = value
        rows.append(row)
    return rows


def markdown(result: dict) -> str:
    from tabulate import tabulate

    columns = [c for c, _, _ in METRICS.values()]
    units = {c: u for c, _, u in METRICS.values()}
    out = [f"# {result['op']}: Nsight Compute, {result['dtype']} {result['shape_label']}", ""]
    out += ["Each variant in a process of its own, its kernels inside the NVTX range `tk-ncu` profiled once, at base"
            " clocks with caches flushed between replays (ncu's defaults): compare kernels with each other here,"
            " not with the report's medians. The .ncu-rep files open in Nsight Compute.", ""]  # fmt: skip
    rows = [[r["variant"], r["kernel"][:60], *("" if r[c] is None else f"{r[c]:,.4g}" for c in columns)]
            for r in result["rows"]]  # fmt: skip
    headers = ["variant", "kernel", *(f"{c} ({units[c]})" if units[c] else c for c in columns)]
    out.append(tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True))
    out += ["", *(f"- `{m}`: {what}" for m, (_, what, _) in METRICS.items())]
    for e in result["errors"]:
        out.append(f"- **{e['variant']}**: {e['error']}")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------
# Running it.
# --------------------------------------------------------------------------


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                       *filter(None, [os.environ.get("PYTHONPATH")])]))  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


def profile_case(sweep, op_dir: Path, progress=None) -> dict:
    """Nsight Compute over every variant of the sweep's first case; the summary (also written to ncu/)."""
    from .limits import dtype_name

    ncu = ncu_path()
    dtype, shape = sweep.cases()[0]
    spec, folder = sweep.spec, Path(op_dir) / "ncu"
    folder.mkdir(parents=True, exist_ok=True)
    result = {"op": spec.name, "dtype": dtype_name(dtype), "shape": list(shape), "shape_label": spec.describe(shape),
              "rows": [], "errors": [], "folder": "ncu", "command": ""}  # fmt: skip
    for v in sweep.variants:
        if v.kind == "peer" and "cuda" not in v.peer_devices:
            continue
        if progress is not None:
            progress.status(f"ncu: {v.name} ({result['dtype']} {result['shape_label']})")
        report = folder / f"{v.name}.ncu-rep"
        command = profile_command(ncu, report, child_argv(spec.name, v.name, result["dtype"], shape))
        result["command"] = result["command"] or " ".join(command)
        try:
            done = _run(command, TIMEOUT_S)
            if done.returncode != 0 or not report.exists():
                raise RuntimeError(f"ncu exited with {done.returncode}: {(done.stderr or done.stdout)[-600:]}")
            table = _run(import_command(ncu, report), 120)
            (folder / f"{v.name}.csv").write_text(table.stdout)
            kernels = parse_csv(table.stdout)
            if not kernels:
                raise RuntimeError("no kernel in the range (nothing launched on the GPU?)")
            result["rows"] += summarize(kernels, v.name)
        except (OSError, subprocess.SubprocessError, RuntimeError) as e:
            result["errors"].append({"variant": v.name, "error": f"{type(e).__name__}: {e}".strip()[:1000]})
    (folder / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    (folder / "summary.md").write_text(markdown(result))
    return result


def child(case: dict) -> int:
    """One variant of one case, warmed up, then called once inside the NVTX range ncu profiles."""
    import ops

    from . import models, selection
    from .variants import all_variants

    spec = {**ops.SPECS, **models.model_specs()}[case["op"]]
    variant = next(v for v in all_variants(spec, max_autotune=True) if v.name == case["variant"])
    device = torch.device("cuda")
    torch.manual_seed(0)
    args = spec.make_inputs(tuple(case["shape"]), selection.DTYPES[case["dtype"]], device)
    fn = variant.build(device)
    for _ in range(2):  # compile, autotune, warm: outside the range
        fn(*args)
    torch.cuda.synchronize()
    with torch.cuda.nvtx.range(RANGE):
        fn(*args)
        torch.cuda.synchronize()
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m compare.ncu", description="the process Nsight Compute profiles (--ncu)")
    p.add_argument("--child", required=True, help="the case, as JSON: op, variant, dtype, shape")
    args = p.parse_args(argv)
    return child(json.loads(args.child))


if __name__ == "__main__":
    sys.exit(main())
