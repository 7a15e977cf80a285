"""A record's fields, each declared once (compare/record.py): the pages, the CSV and the schema read the declarations."""

import csv

import pytest

from compare import record, report, schema, summary

MB = 1_000_000


def make_record(variant, median_ms, **values):
    """A record as the runner leaves it: the declared defaults, what is known before the run, the measurements."""
    return record.new_record(
        op="fake", dtype="float32", shape=[64, 1024], shape_label="64x1024", variant=variant,
        kind="tk" if variant == "tk" else variant, status="ok", interpreted=False, device="cuda",
        timing_method="do_bench", bytes=512 * MB, flops=10**9, tolerance=1e-5, rel_error=1e-7,
        median_ms=median_ms, p20_ms=median_ms, p80_ms=median_ms, samples=3, gbps=512 * MB / median_ms / 1e6,
        limit_share=0.5, kernels=1, kernel_unit="kernels", **values,
    )  # fmt: skip


def make_doc(records):
    return {
        "schema": schema.SCHEMA, "schema_version": schema.SCHEMA_VERSION, "op": "fake", "bound": "memory",
        "complete": True, "started_utc": "2026-01-01T00:00:00Z", "finished_utc": "2026-01-01T00:00:01Z",
        "settings": {"device": "cuda", "dtypes": ["float32"], "shapes": [[64, 1024]], "shape_labels": ["64x1024"],
                     "variants": [r["variant"] for r in records], "rep_ms": 40.0, "rounds": 3,
                     "timing_method": "do_bench"},
        "environment": {"gpu": "A GPU"}, "limits": {"copy": None, "matmul": {}, "errors": []}, "skipped": [],
        "records": records,
    }  # fmt: skip


def test_results_table_columns_in_their_order():
    eager, tk = make_record("eager", 1.0), make_record("tk", 0.5)
    headers, rows = report.table_rows([eager, tk], "memory")
    assert headers == ["variant", "status", "median", "p20-p80", "first call", "GB/s", "TFLOP/s", "% of copy",
                       "vs eager", "vs compile", "kernels", "rel. error", "note"]  # fmt: skip
    assert rows[1][:4] == ["tk", "ok", "500 µs", "500 µs - 500 µs"]
    graphed = [make_record("eager", 1.0, cudagraph_ms=0.01), make_record("tk", 0.5, cudagraph_ms=0.008)]
    headers, rows = report.table_rows(graphed, "compute")
    assert headers[5] == "CUDA graph (vs eager)" and headers[8] == "% of matmul"
    assert [row[5] for row in rows] == ["10.0 µs (1.00x)", "8.0 µs (1.25x)"]  # and eager's over each
    assert headers[-3] == "kernels"


def test_a_fresh_record_has_every_field_and_shares_no_list():
    a, b = record.new_record(), record.new_record()
    assert list(a) == list(record.RECORD_FIELDS) == list(schema.RECORD_FIELDS)
    assert a["status"] == "failed" and a["samples"] == 0 and a["best"] is False and a["kernel_us"] == {}
    a["kernel_names"].append("k")
    assert b["kernel_names"] == [] and record.RECORD_FIELDS["kernel_names"].default == []
    with pytest.raises(KeyError, match="energy_mj"):
        record.new_record(energy_mj=1)


def test_a_new_metric_is_one_declaration(monkeypatch, tmp_path):
    """What the next metric needs: its Field.  The runner's record, the results table (where its order puts
    it), results.csv, the schema and the summary's table of the largest shapes all take it from there."""
    peak = record.Field(
        "energy_mj", (int, type(None)), "energy drawn by one call", unit="mJ",
        fmt=lambda n: "" if n is None else f"{n} mJ",
        columns=(record.Column(record.RESULTS, "energy", 126), record.Column(record.LARGEST, "tk energy", 50)),
    )  # fmt: skip
    monkeypatch.setitem(record.RECORD_FIELDS, peak.name, peak)
    assert record.new_record()["energy_mj"] is None
    records = [make_record("eager", 1.0, energy_mj=3), make_record("tk", 0.5, energy_mj=2)]
    doc = make_doc(records)

    headers, rows = report.table_rows(records, "memory")
    assert headers[headers.index("kernels") + 1] == "energy" and headers[-2] == "rel. error"
    assert [row[headers.index("energy")] for row in rows] == ["3 mJ", "2 mJ"]
    assert "| energy" in report.markdown(doc, None)

    report.write_csv(doc, tmp_path)
    with open(tmp_path / "results.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert list(table[0])[-1] == "energy_mj" and [r["energy_mj"] for r in table] == ["3", "2"]

    assert schema.validate(doc) == []
    del records[0]["energy_mj"]
    records[1]["energy_mj"] = "2 mJ"
    problems = schema.validate(doc)
    assert "record 0: missing 'energy_mj'" in problems and "record 1: energy_mj='2 mJ' is a str" in problems

    records[1]["energy_mj"] = 2
    (row,) = summary.largest_shapes_table(summary.merge([doc]))
    assert row[-2:] == ["2 mJ", "2.00x (eager)"]
    assert "| tk energy" in summary.markdown([doc])

    older = make_doc([make_record("eager", 1.0), make_record("tk", 0.5)])  # written before the field was declared
    for r in older["records"]:
        del r["energy_mj"]
        r["op"] = "older"
    new_row, old_row = summary.largest_shapes_table(summary.merge([older, doc]))
    assert old_row[0] == "older" and old_row[-2] == "" and new_row[-2] == "2 mJ"
