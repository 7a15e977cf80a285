"""The schema of ``results.json`` (and, flattened, of ``results.csv``).

Version 1.  Top level::

    schema           "tk-compare"
    schema_version   1
    op, bound        the op's name; "memory" or "compute" (what the share of limit is measured against)
    call             (optional) what is compared, in words, where the op's name does not say it
    complete         true once every (dtype, shape) ran; false in the report of an interrupted run
    started_utc, finished_utc
    settings         device, dtypes, shapes, variants, rep_ms, rounds, timing_method, quick, capture
    environment      python, torch, triton, cpu; on a GPU also gpu, driver, cuda, sm_count, l2_cache_mib...
    limits           method, copy {gbps, bytes, ms} or null, matmul {dtype: {tflops, n, ms}}, errors [...]
    skipped          [{variant, reason}]: peers that cannot run here (not installed, not built, another device)
    records          one per (dtype, shape, variant): the fields declared in record.py, in that order
    configs          (with --configs) one record per (dtype, shape, configuration of tk's kernel), the same
                     fields; ``variant`` names the configuration (compare/configs.py)

A record's ``status`` is ``ok`` (output within the tolerance), ``wrong``
(it ran, its output is not within the tolerance: its times are kept but
flagged), ``failed`` (it raised: ``error`` says at which stage and why) or
``skipped``.  Times are milliseconds per call; a ``null`` is a value that
does not exist (a failed variant's time, a speed-up without a baseline, a
throughput of an interpreted kernel, which is no performance figure).
"""

from __future__ import annotations

from .record import RECORD_FIELDS, STATUSES

SCHEMA = "tk-compare"
SCHEMA_VERSION = 1

TOP_FIELDS = ("schema", "schema_version", "op", "bound", "complete", "started_utc", "finished_utc",
              "settings", "environment", "limits", "skipped", "records")  # fmt: skip


def validate(doc: dict) -> list[str]:
    """Every way ``doc`` departs from the schema (an empty list when it conforms)."""
    problems = [f"missing top-level field {k!r}" for k in TOP_FIELDS if k not in doc]
    if doc.get("schema") != SCHEMA or doc.get("schema_version") != SCHEMA_VERSION:
        problems.append(f"schema is {doc.get('schema')!r} v{doc.get('schema_version')!r}, expected {SCHEMA!r} v{SCHEMA_VERSION}")
    for i, rec in enumerate(doc.get("records", []) + doc.get("configs", [])):
        for name, field in RECORD_FIELDS.items():
            if name not in rec:
                problems.append(f"record {i}: missing {name!r}")
            elif not isinstance(rec[name], field.types) or (isinstance(rec[name], bool) and bool not in field.types):
                problems.append(f"record {i}: {name}={rec[name]!r} is a {type(rec[name]).__name__}")
        if rec.get("status") not in STATUSES:
            problems.append(f"record {i}: status {rec.get('status')!r} not in {STATUSES}")
        if rec.get("status") in ("failed", "skipped", "wrong") and not rec.get("error"):
            problems.append(f"record {i}: status {rec.get('status')} without an error text")
    return problems

