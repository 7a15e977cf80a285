"""Figures that are not facts are marked as such, on every page alike: noisy times, unstable limits,
shares above 100%, and peak memory where it can be measured (compare/record.py's flags)."""

import json

import pytest
import torch

from compare import cli, limits, record, report, runner, summary, timing

MB = 1_000_000


def rec(variant, median, p20=None, p80=None, samples=100, *, kind=None, status="ok", nbytes=512 * MB):
    return record.new_record(
        op="fake", dtype="float32", shape=[64], shape_label="n=64", variant=variant, kind=kind or variant,
        status=status, interpreted=False, device="cuda", bytes=nbytes, flops=10**9, median_ms=median,
        p20_ms=median if p20 is None else p20, p80_ms=median if p80 is None else p80, samples=samples,
    )  # fmt: skip


def test_the_rule_of_a_stable_time():
    assert timing.is_stable(1.0, 1.25, 5) and not timing.is_stable(1.0, 1.26, 5)  # p80/p20 at most 1.25...
    assert not timing.is_stable(1.0, 1.0, 4)  # ...over 5 calls or more
    assert not timing.is_stable(None, None, 0)


def test_derive_flags_what_is_not_stable():
    eager = rec("eager", 1.0, 0.5, 3.0)  # p80/p20 = 6: the 2-core CPU of the issue
    compiled = rec("compile", 1.0, kind="compile")
    tk = rec("tk", 0.1)
    runner.derive([eager, compiled, tk], "memory", limit=3000.0, limit_stable=False)
    assert eager["flags"] == [record.NOISY, record.UNSTABLE_LIMIT]
    assert record.NOISY not in tk["flags"] and record.NOISY_EAGER in tk["flags"]
    assert record.NOISY_COMPILE not in tk["flags"] and record.UNSTABLE_LIMIT in tk["flags"]
    assert tk["limit_share"] == pytest.approx(512e6 / 0.1e-3 / 1e9 / 3000) and tk["limit_share"] > 1
    assert record.ABOVE_LIMIT in tk["flags"]
    runner.derive(fresh := [rec("eager", 1.0), rec("tk", 1.0)], "memory", limit=1e9)
    assert all(r["flags"] == [] for r in fresh)  # stable figures, a share below 100%: nothing to say


def test_every_table_marks_them_and_says_why(tmp_path):
    eager, tk = rec("eager", 1.0, 0.5, 3.0), rec("tk", 0.1)
    runner.derive([eager, tk], "memory", limit=3000.0)
    headers, rows = report.table_rows([eager, tk], "memory")
    cell = dict(zip(headers, rows[1]))
    assert cell["vs eager"] == "10.00x ~" and cell["median"] == "100 µs"  # tk's own time is stable
    assert cell["% of copy"] == "171% (cache)"
    assert dict(zip(headers, rows[0]))["median"] == "1 ms ~"
    doc = {"records": [eager, tk], "settings": {"device": "cuda", "timing_method": "do_bench"}}
    legend = report.legend(doc)
    assert "~ not a stable figure: the timed calls spread (p80/p20 above 1.25" in legend
    assert "(cache) above 100% of the measured limit: the call's data were resident in cache" in legend
    (row,) = summary.largest_shapes_table({("fake", "float32"): [eager, tk]})
    assert "171% (cache)" in row and "10.00x ~ (eager)" in row  # the summary reads the same marks


def test_each_limit_keeps_the_spread_of_its_repetitions():
    copy = limits.copy_bandwidth(torch.device("cpu"), rep_ms=5)
    assert copy["samples"] >= timing.MIN_SAMPLES and copy["p20_ms"] <= copy["ms"] <= copy["p80_ms"]
    assert copy["stable"] == timing.is_stable(copy["p20_ms"], copy["p80_ms"], copy["samples"])
    assert limits.limit_stable({"copy": {**copy, "stable": False}}, "memory", torch.float32) is False
    assert limits.limit_stable({"copy": {"gbps": 1.0}}, "memory", torch.float32) is True  # an older report's


def test_peak_memory_is_the_allocators_peak_above_the_inputs(monkeypatch):
    """On CUDA: the caching allocator's peak over one call, less what was allocated before it (the inputs)."""
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 1000)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 5096)
    assert timing.peak_bytes(lambda x: calls.append("call"), (1,), torch.device("cuda")) == 4096
    assert calls == ["sync", "reset", "call", "sync"]
    assert timing.peak_bytes(lambda x: x, (1,), torch.device("cpu")) is None  # no allocator that keeps a peak


def test_a_cpu_report_says_why_it_has_no_peak_memory(tmp_path):
    argv = ["--op", "gelu", "--shapes", "1000", "--variants", "eager,tk", "--device", "cpu", "--rep-ms", "2"]
    assert cli.main([*argv, "--rounds", "1", "--quiet", "--no-capture", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "gelu" / "results.json").read_text())
    assert all("peak_bytes" in r and r["peak_bytes"] is None for r in doc["records"])
    assert "No peak memory: the CPU allocator keeps no peak" in (tmp_path / "gelu" / "report.md").read_text()
    with open(tmp_path / "gelu" / "results.csv") as f:
        assert "peak_bytes" in f.readline().split(",")


def test_peak_memory_in_the_tables_where_it_was_measured():
    eager, tk = rec("eager", 1.0), rec("tk", 0.5)
    tk["peak_bytes"], eager["peak_bytes"] = 67_108_864, 201_326_592
    headers, rows = report.table_rows([eager, tk], "memory")
    assert [row[headers.index("peak memory")] for row in rows] == ["201 MB", "67.1 MB"]
    assert "tk peak memory" in record.titles(record.LARGEST)
    (row,) = summary.largest_shapes_table({("fake", "float32"): [eager, tk]})
    assert "67.1 MB" in row
