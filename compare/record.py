"""A record, one variant on one (dtype, shape), and every field of it, each declared once.

A field's declaration is all the harness knows of it:

* its JSON types (``schema.validate`` checks results.json against them) and
  its value in a fresh record (``new_record``);
* its unit and meaning;
* how the CSV writes it (``results.csv`` has one column per field, in the
  order declared here) and how a table cell reads it;
* the tables that show it, each a ``Column``: the title, where the column
  stands, and its cell where that is more than the formatted value.

The runner measures and fills the values; ``report`` (report.md, the terminal,
results.csv), ``summary`` (summary.md), ``schema`` and ``plot`` read the
declarations.  A new metric is one ``Field`` below and the code in the runner
that measures it.

A figure that is not stable carries a flag (``FLAGS``, set by ``runner.derive``):
its cells show ``~`` (or ``(cache)``) and the legend of every page says why.

The tables:

* ``RESULTS``: a row per variant of a (dtype, shape), in the op's report.md
  and on the terminal;
* ``LARGEST``, ``LARGE``, ``SMALL``: summary.md's tables of tk against the
  fastest other variant (at each op's largest shape, at large shapes where
  tk is behind, at small shapes by CUDA-graph time); a field shown there is
  tk's value, between the case's key columns and the comparison;
* ``CONFIGS``: a row per configuration of tk's kernel on a (dtype, shape)
  (``--configs``: compare/configs.py), in report.md, report.html and on the terminal.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass

from .formats import fmt_bytes, fmt_error, fmt_microseconds, fmt_number, fmt_ratio, fmt_share, fmt_text, fmt_time

RESULTS = "results"
LARGEST = "largest shapes"
LARGE = "large cases"
SMALL = "small cases"
CONFIGS = "configurations"

NONE = type(None)

STATUSES = ("ok", "wrong", "failed", "skipped")  # a record's status: see schema.py for what each means

# Why a figure of a record is not to be read as a fact: the codes of the record's ``flags``, each set by
# ``runner.derive`` (or ``runner._time_graphs``) by the rule of ``timing.is_stable``: a time is stable when
# p80 / p20 of its calls is at most ``timing.UNSTABLE_SPREAD`` and it rests on ``timing.MIN_SAMPLES`` calls or more.
NOISY = "noisy"
NOISY_GRAPH = "noisy graph"
NOISY_EAGER = "noisy eager"
NOISY_COMPILE = "noisy compile"
UNSTABLE_LIMIT = "unstable limit"
ABOVE_LIMIT = "above limit"
FLAGS = {
    NOISY: "the timed calls spread (p80/p20 above 1.25, or fewer than 5 calls): the median, its throughput, share "
           "and speed-ups are not stable figures",
    NOISY_GRAPH: "the CUDA-graph replays spread the same way: the CUDA-graph time is not a stable figure",
    NOISY_EAGER: "eager's median, which 'vs eager' divides, is noisy",
    NOISY_COMPILE: "compile's median, which 'vs compile' divides, is noisy",
    UNSTABLE_LIMIT: "the measured limit's own repetitions spread the same way: the share of it is not a stable figure",
    ABOVE_LIMIT: "above 100% of the measured limit: the call's data were resident in cache (the copy limit streams "
                 "a buffer far larger than the caches; the matmul limit is one size's measured rate, not a peak)",
}  # fmt: skip
MARK = " ~"  # after a figure that is not stable
CACHE_MARK = " (cache)"  # after a share of the limit above 100%


@dataclass(frozen=True)
class TableView:
    """What a row of a table shows besides its own record: the same for every row of the table."""

    bound: str = "memory"  # the op's: "memory" (share of the copy bandwidth) or "compute" (of matmul)
    kernel_unit: str = "kernels"  # what the kernel column counts: GPU kernels, or ops on a CPU
    graph_times: bool = False  # some variant has a CUDA-graph time: the table gets the column
    eager_graph_ms: float | None = None  # eager's CUDA-graph time, which each variant's is compared to
    eager_graph_noisy: bool = False  # ...and whether that time is flagged
    peak_memory: bool = False  # some variant has a peak-memory figure (CUDA): the table gets the column

    @classmethod
    def of(cls, records: list[dict], bound: str) -> TableView:
        """The view of a results table: one (dtype, shape)'s records."""
        eager = next((r for r in records if r["variant"] == "eager" and r["status"] == "ok"), None)
        return cls(
            bound=bound,
            kernel_unit=(records[0]["kernel_unit"] or "kernels") if records else "kernels",
            graph_times=any(r["cudagraph_ms"] is not None for r in records),
            eager_graph_ms=eager["cudagraph_ms"] if eager else None,
            eager_graph_noisy=bool(eager) and NOISY_GRAPH in flags_of(eager),
            peak_memory=any(r.get("peak_bytes") is not None for r in records),
        )


Cell = Callable[[dict, TableView], str]


@dataclass(frozen=True)
class Column:
    """How one table shows a field."""

    table: str  # RESULTS, LARGEST, LARGE or SMALL
    title: str | Callable[[TableView], str]
    order: int  # left to right within the table (gaps of 10, so that a new column slots in)
    cell: Cell | None = None  # None: the field's ``fmt`` of the record's value
    shown: Callable[[TableView], bool] | None = None  # None: always


@dataclass(frozen=True)
class Field:
    """One field of a record: everything the harness knows of it (see the module's docstring)."""

    name: str
    types: tuple[type, ...]  # what results.json may hold
    meaning: str
    unit: str = ""
    default: object = None  # the value in a fresh record (copied: a list or dict is never shared)
    fmt: Callable[[object], str] = fmt_text  # how a table cell reads the value (None: an empty cell)
    csv: Callable[[object], str] | None = None  # a value that is not null in results.csv; None: ``csv_text``
    columns: tuple[Column, ...] = ()


def csv_text(value) -> str:
    """A value that is not null as results.csv writes it: floats in full (repr), dicts as sorted JSON."""
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, float):
        return repr(value)
    return str(value)


# --------------------------------------------------------------------------
# The cells of the results table that show more than one value.
# --------------------------------------------------------------------------


def _variant_cell(r: dict, view: TableView) -> str:
    return r["variant"] + (" *" if r["best"] else "")


def _status_cell(r: dict, view: TableView) -> str:
    text = r["status"].upper() if r["status"] in ("wrong", "failed") else r["status"]
    if r["interpreted"] and r["status"] in ("ok", "wrong"):
        text += ", interpreted"
    return text


def flags_of(r: dict) -> list[str]:
    """The record's flags (none in a report written before they were declared)."""
    return r.get("flags") or []


def marked(text: str, r: dict, *flags: str) -> str:
    """``text`` with the mark of a figure that is not stable, where the record has one of ``flags``."""
    return text + MARK if text and any(f in flags_of(r) for f in flags) else text


def _median_cell(r: dict, view: TableView) -> str:
    if r["median_ms"] is None:
        return ""
    return marked(fmt_time(r["median_ms"]), r, NOISY) + (" (!)" if r["status"] == "wrong" else "")


def _spread_cell(r: dict, view: TableView) -> str:
    return f"{fmt_time(r['p20_ms'])} - {fmt_time(r['p80_ms'])}" if r["p20_ms"] is not None else ""


def _graph_cell(r: dict, view: TableView) -> str:
    """The CUDA-graph time and, where eager has one, eager's over it: the device-side speed-up of a small call,
    which the host-bound median hides."""
    if r["cudagraph_ms"] is None:
        return ""
    own = marked(fmt_time(r["cudagraph_ms"]), r, NOISY_GRAPH)
    if view.eager_graph_ms is None or r["status"] not in ("ok", "wrong"):
        return own
    ratio = fmt_ratio(view.eager_graph_ms / r["cudagraph_ms"])
    if view.eager_graph_noisy or NOISY_GRAPH in flags_of(r):
        ratio += MARK
    return f"{own} ({ratio})"


def share_cell(r: dict, view: TableView | None = None) -> str:
    """The share of the limit: marked where it or its limit is not stable, and where it passes 100% (cache)."""
    text = marked(fmt_share(r.get("limit_share")), r, NOISY, UNSTABLE_LIMIT)
    return text + CACHE_MARK if text and ABOVE_LIMIT in flags_of(r) else text


def _noisy_cell(name: str, fmt: Callable[[object], str], *flags: str) -> Cell:
    """A figure computed from the median (and, for a speed-up, its baseline's): marked where one is noisy."""
    return lambda r, view: marked(fmt(r.get(name)), r, NOISY, *flags)


_vs_eager_cell = _noisy_cell("speedup_vs_eager", fmt_ratio, NOISY_EAGER)
_vs_compile_cell = _noisy_cell("speedup_vs_compile", fmt_ratio, NOISY_COMPILE)


def _size(n: int | None) -> str:
    return "" if n is None else fmt_bytes(n)


def _note_cell(r: dict, view: TableView) -> str:
    if r["status"] != "ok":
        return (r["error"] or "").splitlines()[0][:90]
    return (r["error"] or "")[:90]


def _limit_title(view: TableView) -> str:
    return "% of " + ("matmul" if view.bound == "compute" else "copy")


def _compute_bound(view: TableView) -> bool:
    """The configurations table shows the throughput the op is judged by: TFLOP/s, or GB/s (memory-bound)."""
    return view.bound == "compute"


def _memory_bound(view: TableView) -> bool:
    return not _compute_bound(view)


# --------------------------------------------------------------------------
# The fields, in the order of results.csv and of a record in results.json.
# --------------------------------------------------------------------------

RECORD_FIELDS: dict[str, Field] = {field.name: field for field in (
    Field("op", (str,), "op name"),
    Field("dtype", (str,), "torch dtype name, e.g. bfloat16"),
    Field("shape", (list,), "the spec's shape tuple (CSV: dims joined by 'x')",
          csv=lambda dims: "x".join(str(d) for d in dims)),
    Field("shape_label", (str,), "the spec's label for the shape"),
    Field("variant", (str,), "eager, eager-unfused, compile, compile-max-autotune, tk, a peer...; in results.json's "
          "configs, a configuration of tk's kernel (--configs)",
          columns=(Column(RESULTS, "variant", 10, cell=_variant_cell),
                   Column(CONFIGS, "configuration", 10, cell=_variant_cell))),
    Field("kind", (str,), "eager | unfused | compile | max-autotune | tk | tk-plan | compile-tk | peer"),
    Field("status", (str,), "ok | wrong | failed | skipped", default="failed",
          columns=(Column(RESULTS, "status", 20, cell=_status_cell), Column(CONFIGS, "status", 20, cell=_status_cell))),
    Field("error", (str, NONE), "why failed/wrong/skipped, with the stage that failed",
          columns=(Column(RESULTS, "note", 140, cell=_note_cell), Column(CONFIGS, "note", 140, cell=_note_cell))),
    Field("interpreted", (bool,), "true when the kernels ran in Triton's interpreter (tk on CPU)"),
    Field("device", (str,), "cuda | cpu"),
    Field("timing_method", (str,), "how the times were taken"),
    Field("bytes", (int,), "the spec's bytes moved per call", unit="B"),
    Field("flops", (int,), "the spec's FLOPs per call", unit="FLOP"),
    Field("tolerance", (float, NONE),
          "max relative norm error allowed: the spec's for the dtype, raised to 2x rounding_error where that is larger"),
    Field("rounding_error", (float, int, NONE),
          "relative norm error of the float64 answer rounded to the dtype: no variant can do better"),
    Field("rel_error", (float, int, NONE), "||out - ref64|| / ||ref64||", fmt=fmt_error,
          columns=(Column(RESULTS, "rel. error", 130), Column(CONFIGS, "rel. error", 130))),
    Field("max_abs_error", (float, int, NONE), "max |out - ref64|"),
    Field("first_call_ms", (float, NONE), "the first call, with compile/autotune/JIT, device synchronized", unit="ms",
          fmt=fmt_time, columns=(Column(RESULTS, "first call", 50), Column(CONFIGS, "first call", 50))),
    Field("median_ms", (float, NONE), "steady-state median per call", unit="ms", fmt=fmt_time,
          columns=(Column(RESULTS, "median", 30, cell=_median_cell), Column(CONFIGS, "median", 30, cell=_median_cell))),
    Field("p20_ms", (float, NONE), "20th percentile", unit="ms", fmt=fmt_time,
          columns=(Column(RESULTS, "p20-p80", 40, cell=_spread_cell),
                   Column(CONFIGS, "p20-p80", 40, cell=_spread_cell))),  # the columns show p80_ms too
    Field("p80_ms", (float, NONE), "80th percentile", unit="ms", fmt=fmt_time),
    Field("samples", (int,), "timed calls behind the quantiles", default=0),
    Field("cudagraph_ms", (float, NONE), "CUDA-graph replay time per call (small calls on a GPU)", unit="ms",
          fmt=fmt_time,
          columns=(Column(RESULTS, "CUDA graph (vs eager)", 60, cell=_graph_cell, shown=lambda view: view.graph_times),
                   Column(SMALL, "tk µs", 10, cell=lambda r, view: fmt_microseconds(r["cudagraph_ms"])))),
    Field("gbps", (float, NONE), "bytes / median, GB/s", unit="GB/s", fmt=fmt_number,
          columns=(Column(RESULTS, "GB/s", 70, cell=_noisy_cell("gbps", fmt_number)),
                   Column(CONFIGS, "GB/s", 70, cell=_noisy_cell("gbps", fmt_number), shown=_memory_bound))),
    Field("tflops", (float, NONE), "flops / median, TFLOP/s", unit="TFLOP/s", fmt=fmt_number,
          columns=(Column(RESULTS, "TFLOP/s", 80, cell=_noisy_cell("tflops", fmt_number)),
                   Column(CONFIGS, "TFLOP/s", 80, cell=_noisy_cell("tflops", fmt_number), shown=_compute_bound))),
    Field("limit_share", (float, NONE),
          "GB/s over measured copy bandwidth (memory-bound) or TFLOP/s over measured matmul (compute-bound)",
          fmt=fmt_share,
          columns=(Column(RESULTS, _limit_title, 90, cell=share_cell),
                   Column(CONFIGS, _limit_title, 90, cell=share_cell),
                   Column(LARGEST, "tk % of limit", 10, cell=share_cell),
                   Column(LARGE, "tk % of limit", 10, cell=share_cell))),
    Field("speedup_vs_eager", (float, NONE), "eager median / this median", unit="x", fmt=fmt_ratio,
          columns=(Column(RESULTS, "vs eager", 100, cell=_vs_eager_cell),
                   Column(LARGEST, "tk vs eager", 20, cell=_vs_eager_cell))),
    Field("speedup_vs_compile", (float, NONE), "compile median / this median", unit="x", fmt=fmt_ratio,
          columns=(Column(RESULTS, "vs compile", 110, cell=_vs_compile_cell),
                   Column(LARGEST, "tk vs compile", 30, cell=_vs_compile_cell))),
    Field("kernels", (int, NONE), "launches per call (GPU kernels; on a CPU, ops: see kernel_unit)", fmt=fmt_text,
          columns=(Column(RESULTS, lambda view: view.kernel_unit, 120),)),
    Field("kernel_unit", (str, NONE), "kernels | ops"),
    Field("kernel_names", (list,), "what was launched in one call (CSV: joined by ';')", default=[],
          csv=";".join),
    Field("kernel_us", (dict,),
          "kernel name -> time per call in the profiler run: device time (GPU), CPU time of the op (CPU)",
          unit="µs", default={}),
    Field("sm_clock_mhz", (float, NONE), "SM clock read right after the shape was timed (GPU)", unit="MHz"),
    Field("best", (bool,), "the fastest correct variant of its (dtype, shape), interpreted ones excluded",
          default=False),
    Field("flags", (list,), "why a figure is not stable: codes of record.FLAGS (CSV: joined by ';')", default=[],
          csv=";".join),
    Field("peak_bytes", (int, NONE),
          "bytes the CUDA caching allocator held above the inputs at the peak of one call (outputs and scratch "
          "included); null on a CPU, which has no allocator that keeps a peak", unit="B", fmt=_size,
          columns=(Column(RESULTS, "peak memory", 125, shown=lambda view: view.peak_memory),
                   Column(LARGEST, "tk peak memory", 40))),
    Field("worker", (int, NONE), "the worker process (its GPU, in order) that measured the case in a sweep split "
          "over GPUs (--gpus); null in a one-process run"),
)}  # fmt: skip


def new_record(**values) -> dict:
    """A record with every field: ``values`` where given, the declared default elsewhere."""
    unknown = set(values) - set(RECORD_FIELDS)
    if unknown:
        raise KeyError(f"not fields of a record: {', '.join(sorted(unknown))}")
    record = {name: copy.copy(field.default) for name, field in RECORD_FIELDS.items()}
    record.update(values)
    return record


def flag_legend(records: list[dict]) -> list[str]:
    """What the marks of these records' cells mean: a line per mark present, for a page's legend."""
    present = {f for r in records for f in flags_of(r)}
    unstable = [FLAGS[f] for f in (NOISY, NOISY_GRAPH, NOISY_EAGER, NOISY_COMPILE, UNSTABLE_LIMIT) if f in present]
    lines = [f"~ not a stable figure: {'; '.join(unstable)}."] if unstable else []
    if ABOVE_LIMIT in present:
        lines.append(f"(cache) {FLAGS[ABOVE_LIMIT]}.")
    return lines


def columns(table: str, view: TableView = TableView()) -> list[tuple[Field, Column]]:
    """The columns of ``table`` the view shows, left to right."""
    found = [(f, c) for f in RECORD_FIELDS.values() for c in f.columns if c.table == table]
    return sorted(((f, c) for f, c in found if c.shown is None or c.shown(view)), key=lambda fc: fc[1].order)


def titles(table: str, view: TableView = TableView()) -> list[str]:
    return [c.title(view) if callable(c.title) else c.title for _, c in columns(table, view)]


def cells(table: str, record: dict, view: TableView = TableView()) -> list[str]:
    """One row of ``table``: the record's cells (empty for a field the record lacks: a report written before
    the field was declared, which summary.md may be given beside newer ones)."""
    return [c.cell(record, view) if c.cell else f.fmt(record.get(f.name)) for f, c in columns(table, view)]


def csv_cell(field: Field, value) -> str:
    if value is None:
        return ""
    return (field.csv or csv_text)(value)


def has_peak_memory(records: list[dict]) -> bool:
    """Whether any timed variant has a peak-memory figure (CUDA runs; the CPU allocator keeps none)."""
    return any(r.get("peak_bytes") is not None and r["median_ms"] is not None for r in records)


def groups(records: list[dict]) -> list[tuple[str, str, list[dict]]]:
    """(dtype, shape label, records) in sweep order; skipped peers are left out."""
    out: dict[tuple, list[dict]] = {}
    for r in records:
        if r["status"] == "skipped":
            continue
        out.setdefault((r["dtype"], r["shape_label"]), []).append(r)
    return [(d, s, rs) for (d, s), rs in out.items()]
