"""The schema of ``results.json`` (and, flattened, of ``results.csv``).

Version 1.  Top level::

    schema           "tk-compare"
    schema_version   1
    op, bound        the op's name; "memory" or "compute" (what the share of limit is measured against)
    complete         true once every (dtype, shape) ran; false in the report of an interrupted run
    started_utc, finished_utc
    settings         device, dtypes, shapes, variants, rep_ms, rounds, timing_method, quick, capture
    environment      python, torch, triton, cpu; on a GPU also gpu, driver, cuda, sm_count, l2_cache_mib...
    limits           method, copy {gbps, bytes, ms} or null, matmul {dtype: {tflops, n, ms}}, errors [...]
    skipped          [{variant, reason}]: peers that are not installed
    records          one per (dtype, shape, variant), fields below

A record's ``status`` is ``ok`` (output within the tolerance), ``wrong``
(it ran, its output is not within the tolerance: its times are kept but
flagged), ``failed`` (it raised: ``error`` says at which stage and why) or
``skipped``.  Times are milliseconds per call; a ``null`` is a value that
does not exist (a failed variant's time, a speed-up without a baseline, a
throughput of an interpreted kernel, which is no performance figure).
"""

from __future__ import annotations

SCHEMA = "tk-compare"
SCHEMA_VERSION = 1

STATUSES = ("ok", "wrong", "failed", "skipped")

# field -> (allowed types, meaning).  The CSV has these columns, in this order.
RECORD_FIELDS = {
    "op": (str, "op name"),
    "dtype": (str, "torch dtype name, e.g. bfloat16"),
    "shape": (list, "the spec's shape tuple (CSV: dims joined by 'x')"),
    "shape_label": (str, "the spec's label for the shape"),
    "variant": (str, "eager, eager-unfused, compile, compile-max-autotune, tk, a peer..."),
    "kind": (str, "eager | unfused | compile | max-autotune | tk | peer"),
    "status": (str, "ok | wrong | failed | skipped"),
    "error": ((str, type(None)), "why failed/wrong/skipped, with the stage that failed"),
    "interpreted": (bool, "true when the kernels ran in Triton's interpreter (tk on CPU)"),
    "device": (str, "cuda | cpu"),
    "timing_method": (str, "how the times were taken"),
    "bytes": (int, "the spec's bytes moved per call"),
    "flops": (int, "the spec's FLOPs per call"),
    "tolerance": ((float, type(None)), "max relative norm error allowed: the spec's for the dtype, raised to 2x rounding_error where that is larger"),
    "rounding_error": ((float, int, type(None)), "relative norm error of the float64 answer rounded to the dtype: no variant can do better"),
    "rel_error": ((float, int, type(None)), "||out - ref64|| / ||ref64||"),
    "max_abs_error": ((float, int, type(None)), "max |out - ref64|"),
    "first_call_ms": ((float, type(None)), "the first call, with compile/autotune/JIT, device synchronized"),
    "median_ms": ((float, type(None)), "steady-state median per call"),
    "p20_ms": ((float, type(None)), "20th percentile"),
    "p80_ms": ((float, type(None)), "80th percentile"),
    "samples": (int, "timed calls behind the quantiles"),
    "cudagraph_ms": ((float, type(None)), "CUDA-graph replay time per call (small calls on a GPU)"),
    "gbps": ((float, type(None)), "bytes / median, GB/s"),
    "tflops": ((float, type(None)), "flops / median, TFLOP/s"),
    "limit_share": ((float, type(None)), "GB/s over measured copy bandwidth (memory-bound) or TFLOP/s over measured matmul (compute-bound)"),
    "speedup_vs_eager": ((float, type(None)), "eager median / this median"),
    "speedup_vs_compile": ((float, type(None)), "compile median / this median"),
    "kernels": ((int, type(None)), "launches per call (GPU kernels; on a CPU, ops: see kernel_unit)"),
    "kernel_unit": ((str, type(None)), "kernels | ops"),
    "kernel_names": (list, "what was launched in one call (CSV: joined by ';')"),
    "kernel_us": (dict, "kernel name -> time per call in the profiler run: device time (GPU), CPU time of the op (CPU)"),
    "sm_clock_mhz": ((float, type(None)), "SM clock read right after the shape was timed (GPU)"),
    "best": (bool, "the fastest correct variant of its (dtype, shape), interpreted ones excluded"),
}

TOP_FIELDS = ("schema", "schema_version", "op", "bound", "complete", "started_utc", "finished_utc",
              "settings", "environment", "limits", "skipped", "records")  # fmt: skip


def validate(doc: dict) -> list[str]:
    """Every way ``doc`` departs from the schema (an empty list when it conforms)."""
    problems = [f"missing top-level field {k!r}" for k in TOP_FIELDS if k not in doc]
    if doc.get("schema") != SCHEMA or doc.get("schema_version") != SCHEMA_VERSION:
        problems.append(f"schema is {doc.get('schema')!r} v{doc.get('schema_version')!r}, expected {SCHEMA!r} v{SCHEMA_VERSION}")
    for i, rec in enumerate(doc.get("records", [])):
        for name, (types, _) in RECORD_FIELDS.items():
            if name not in rec:
                problems.append(f"record {i}: missing {name!r}")
            elif not isinstance(rec[name], types) or (isinstance(rec[name], bool) and bool not in _tuple(types)):
                problems.append(f"record {i}: {name}={rec[name]!r} is a {type(rec[name]).__name__}")
        if rec.get("status") not in STATUSES:
            problems.append(f"record {i}: status {rec.get('status')!r} not in {STATUSES}")
        if rec.get("status") in ("failed", "skipped", "wrong") and not rec.get("error"):
            problems.append(f"record {i}: status {rec.get('status')} without an error text")
    return problems


def _tuple(types) -> tuple:
    return types if isinstance(types, tuple) else (types,)
