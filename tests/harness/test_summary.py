"""The one page over many ops' reports (compare/summary.py), from records made here."""

import gzip
import json

import pytest

from compare import schema, summary

MB = 1_000_000


def rec(variant, median_ms, *, op="gelu", dtype="bfloat16", shape="n=2^26", nbytes=512 * MB, kind=None, status="ok",
        graph_ms=None, error=None):  # fmt: skip
    """One record as the harness writes it (the fields the summary reads)."""
    kind = kind or ("tk" if variant == "tk" else variant.split("-")[0])
    gbps = nbytes / (median_ms * 1e-3) / 1e9 if median_ms else None
    return {
        "op": op, "dtype": dtype, "shape_label": shape, "variant": variant, "kind": kind, "status": status,
        "error": error, "interpreted": False, "bytes": nbytes, "median_ms": median_ms, "cudagraph_ms": graph_ms,
        "limit_share": gbps / 3000 if gbps else None, "rel_error": 1e-3, "tolerance": 1e-2,
        "speedup_vs_eager": None, "speedup_vs_compile": None,
    }  # fmt: skip


def doc(records, op="gelu", started="2026-01-01T00:00:00Z"):
    return {
        "schema": schema.SCHEMA, "op": op, "complete": True, "started_utc": started, "finished_utc": started, "records": records,
        "environment": {"gpu": "A GPU", "torch": "2.x", "triton": "3.x"}, "limits": {"copy": {"gbps": 3000.0}},
    }  # fmt: skip


def test_tk_against_the_fastest_other_variant():
    case = summary.compare_case([rec("eager", 0.30), rec("compile", 0.25), rec("tk", 0.20), rec("peer", None, status="failed")])
    assert case["best"]["variant"] == "compile"
    assert case["vs_best"] == pytest.approx(0.25 / 0.20)
    assert summary.compare_case([rec("tk", 0.2), rec("eager", None, status="failed")]) is None  # nothing to compare with


def test_tk_under_another_plan_is_no_rival():
    """A tk-plan variant (tk's kernels under another plan, a lesson beside tk) is never what tk is judged against."""
    records = [rec("eager", 0.30, graph_ms=0.2), rec("tk", 0.20, graph_ms=0.1),
               rec("tk-row-major", 0.10, kind="tk-plan", graph_ms=0.05)]  # fmt: skip
    assert summary.compare_case(records)["best"]["variant"] == "eager"
    assert summary.judged_case([{**r, "bytes": MB} for r in records])["best"]["variant"] == "eager"  # by CUDA graph


def test_large_cases_behind_the_fastest_are_listed_and_counted():
    records = [
        rec("eager", 1.00, shape="a"), rec("tk", 1.01, shape="a"),  # 1% behind: level
        rec("eager", 1.00, shape="b"), rec("tk", 1.05, shape="b", graph_ms=0.9),  # 5% behind: listed
        rec("eager", 1.00, shape="c", nbytes=MB), rec("tk", 2.00, shape="c", nbytes=MB),  # small: not a large case
    ]  # fmt: skip
    count, behind = summary.large_cases(summary.merge([doc(records)]))
    assert count == 2
    assert [row[2] for row in behind] == ["b"]
    assert behind[0][5] == "0.95x (eager)"


def test_small_cases_are_judged_by_cuda_graph_time():
    """A small case is compared by CUDA-graph time, against the variant fastest by it (not the fastest
    by median); a case where tk or every other variant has no graph time is not counted."""
    small = {"nbytes": MB}
    records = [
        rec("eager", 0.004, shape="a", graph_ms=0.0020, **small), rec("compile", 0.050, shape="a", graph_ms=0.0015, **small),
        rec("tk", 0.004, shape="a", graph_ms=0.0018, **small),  # faster by median, 0.83x compile by graph: listed
        rec("eager", 0.004, shape="b", graph_ms=0.0020, **small), rec("tk", 0.009, shape="b", graph_ms=0.00202, **small),
        rec("eager", 0.004, shape="c", graph_ms=None, **small), rec("tk", 0.004, shape="c", graph_ms=0.002, **small),
        rec("eager", 0.200, shape="d", graph_ms=0.1), rec("tk", 0.300, shape="d", graph_ms=0.2),  # large: not here
    ]  # fmt: skip
    count, behind = summary.small_cases(summary.merge([doc(records)]))
    assert count == 2  # a and b; c has no other graph time, d is large
    assert behind == [["gelu", "bfloat16", "a", "1", "1.80", "1.50 (compile)", "0.83x"]]
    page = summary.markdown([doc(records)])
    assert "1 of 2 small cases with CUDA-graph times have tk within 2%" in page


def test_the_largest_shape_row():
    records = [rec("eager", 0.10, shape="small", nbytes=64 * MB), rec("tk", 0.05, shape="small", nbytes=64 * MB),
               rec("eager", 1.00, shape="big"), rec("compile", 0.80, shape="big"), rec("tk", 0.40, shape="big")]  # fmt: skip
    (row,) = summary.largest_shapes_table(summary.merge([doc(records)]))
    assert row[:4] == ["gelu", "bfloat16", "big", "512"]
    assert row[4] == f"{100 * 512 * MB / 0.4e-3 / 1e9 / 3000:.0f}%"
    assert row[-1] == "2.00x (compile)"


def test_a_later_report_replaces_an_op_and_dtype():
    first = doc([rec("eager", 1.0), rec("tk", 2.0), rec("eager", 1.0, dtype="float32"), rec("tk", 1.0, dtype="float32")])
    again = doc([rec("eager", 1.0), rec("tk", 0.5)], started="2026-01-02T00:00:00Z")  # bfloat16 run again
    merged = summary.merge([first, again])
    assert [r["median_ms"] for r in merged[("gelu", "bfloat16")]] == [1.0, 0.5]
    assert len(merged[("gelu", "float32")]) == 2


def test_failures_and_wrong_answers_are_grouped_with_their_cases():
    records = [rec("peer", None, status="failed", shape=s, error="first call: RuntimeError: too long\nmore") for s in "abcd"]
    records += [rec("tk", 1.0, status="wrong", shape="a")]
    rows = summary.problems(summary.merge([doc(records)]))
    assert rows[0] == ["gelu", "peer", "failed", "4", "bfloat16 a, bfloat16 b, bfloat16 c ...", "first call: RuntimeError: too long"]
    assert rows[1][:4] == ["gelu", "tk", "wrong", "1"] and "tolerance" in rows[1][5]


def test_the_page_from_run_folders(tmp_path):
    run = tmp_path / "run"
    for op, tk_ms in (("gelu", 0.9), ("square", 1.2)):
        (run / op).mkdir(parents=True)
        records = [rec("eager", 1.0, op=op), rec("tk", tk_ms, op=op)]
        (run / op / "results.json").write_text(json.dumps(doc(records, op=op)))
    out = tmp_path / "summary.md"
    assert summary.main([str(run), "--out", str(out)]) == 0
    page = out.read_text()
    assert "2 ops from 2 reports" in page and "A GPU" in page
    assert "| gelu " in page and "1.11x (eager)" in page
    assert "1 of 2 large cases have tk within 2%" in page and "0.83x (eager)" in page
    assert "## Variants that failed or were wrong\n\nNone." in page
    with pytest.raises(SystemExit):
        summary.main([str(tmp_path / "empty")])


def test_a_folder_that_is_not_a_report_is_refused_by_name(tmp_path, capsys):
    (tmp_path / "op").mkdir()
    (tmp_path / "op" / "results.json").write_text(json.dumps({"records": []}))
    with pytest.raises(SystemExit):
        summary.main([str(tmp_path)])
    assert "results.json is not a report of python -m compare" in capsys.readouterr().err
    (tmp_path / "op" / "results.json").write_text("{not json")
    with pytest.raises(SystemExit):
        summary.main([str(tmp_path)])
    assert "results.json is not valid JSON" in capsys.readouterr().err


def test_a_page_that_cannot_be_written_is_an_error_naming_the_file(tmp_path, capsys):
    (tmp_path / "gelu").mkdir()
    (tmp_path / "gelu" / "results.json").write_text(json.dumps(doc([rec("eager", 1.0), rec("tk", 0.9)])))
    out = tmp_path / "no-such-folder" / "summary.md"
    with pytest.raises(SystemExit) as exit_info:
        summary.main([str(tmp_path), "--out", str(out)])
    assert exit_info.value.code == 1
    assert f"cannot write {out}" in capsys.readouterr().err


def test_a_kept_sweep_of_gzipped_reports_is_refreshed_by_a_later_run(tmp_path):
    kept, run = tmp_path / "kept", tmp_path / "run"
    for op, tk_ms in (("gelu", 0.9), ("square", 1.2)):
        (kept / op).mkdir(parents=True)
        records = [rec("eager", 1.0, op=op), rec("tk", tk_ms, op=op)]
        (kept / op / "results.json.gz").write_bytes(gzip.compress(json.dumps(doc(records, op=op)).encode()))
    (run / "square").mkdir(parents=True)
    fresh = [rec("eager", 1.0, op="square"), rec("tk", 0.5, op="square")]
    (run / "square" / "results.json").write_text(json.dumps(doc(fresh, op="square")))
    page = summary.markdown(summary.find_docs([kept, run]))
    assert "2 ops from 3 reports" in page
    assert "2 of 2 large cases have tk within 2%" in page and "2.00x (eager)" in page
    (kept / "gelu" / "results.json.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match=r"results\.json\.gz is not valid JSON"):
        summary.find_docs([kept])


def test_the_worst_case_of_each_op_and_dtype_comes_first():
    """Per op and dtype: the smallest fastest-other / tk over every shape, by CUDA-graph time under 64 MB
    (where both have one) and by median above, with its shape; and tk's lowest share of the limit at 64 MB
    or more.  The page opens with it."""
    small = {"nbytes": MB}
    records = [
        # 1 MB: tk is faster by median but 0.90x of compile by CUDA-graph time: the worst case.
        rec("eager", 0.010, shape="s", graph_ms=0.0020, **small), rec("compile", 0.020, shape="s", graph_ms=0.0018, **small),
        rec("tk", 0.005, shape="s", graph_ms=0.0020, **small),
        # 512 MB: by median, 0.95x of eager; 4 GB: level.
        rec("eager", 1.00, shape="l", graph_ms=0.5), rec("tk", 1.0526, shape="l", graph_ms=0.1),
        rec("eager", 8.00, shape="xl", nbytes=4096 * MB), rec("tk", 8.00, shape="xl", nbytes=4096 * MB),
        rec("eager", 1.0, dtype="float32"), rec("tk", 0.5, dtype="float32"),
    ]  # fmt: skip
    rows = summary.worst_cases_table(summary.merge([doc(records)]))
    assert rows[0] == ["gelu", "bfloat16", "0.90x (compile)", "s", "CUDA graph", "NO",
                       f"{100 * 512 * MB / 1.0526e-3 / 1e9 / 3000:.0f}%", "l"]  # fmt: skip
    assert rows[1][:6] == ["gelu", "float32", "2.00x (eager)", "n=2^26", "median", "yes"]
    page = summary.markdown([doc(records)])
    assert page.index("## The worst case of each op and dtype") < page.index("## The largest shape of each op and dtype")
    assert "0.90x (compile)" in page.split("## The largest shape")[0]


def test_a_worst_case_from_a_noisy_figure_is_marked():
    tk, eager = rec("tk", 1.2), rec("eager", 1.0)
    tk["flags"] = ["noisy"]
    (row,) = summary.worst_cases_table(summary.merge([doc([eager, tk])]))
    assert row[2] == "0.83x ~ (eager)"
    assert "~ not a stable figure" in summary.markdown([doc([eager, tk])])
