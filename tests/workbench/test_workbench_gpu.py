"""The workbench on a CUDA device (-m gpu): tk's launches and their compiled levels as they ran, --profile's
device-time tables, report.html's per-kernel times, and Nsight Compute where ncu is installed."""

import json
import re

import pytest
import torch

from compare import cli, ncu

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def softmax_gpu(tmp_path_factory):
    root = tmp_path_factory.mktemp("logs")
    argv = ["--op", "softmax", "--dtypes", "bfloat16", "--shapes", "4096x1024,1024x65536", "--rep-ms", "10",
            "--rounds", "1", "--profile", "--quiet"]  # fmt: skip
    assert cli.main([*argv, "--out", str(root)]) == 0
    return root / "softmax"


def test_tk_launches_and_their_levels_as_they_ran(softmax_gpu):
    index = json.loads((softmax_gpu / "kernels" / "index.json").read_text())
    doc = json.loads((softmax_gpu / "results.json").read_text())
    assert doc["settings"]["ir"] is True  # on by default on a GPU
    assert [case["shape_label"] for case in index["tk"]] == ["4096x1024", "1024x65536"]
    for case in index["tk"]:
        assert case["launches"] and case["planned"] is None and case["error"] is None
        tk = next(r for r in doc["records"] if r["variant"] == "tk" and r["shape_label"] == case["shape_label"])
        for launch in case["launches"]:
            assert launch["target"].startswith("sm_") and launch["ir"], launch
            (row,) = launch["ir"]
            assert row["info"]["n_regs"] > 0 and {"ttgir", "llir", "ptx", "json"} <= {f.rsplit(".", 1)[1] for f in row["files"]}
            # The kernel the profiler timed is one the watcher saw launch.
            assert any(name == launch["kernel"] or name.startswith(launch["kernel"]) for name in tk["kernel_names"]), tk


def test_profile_tables_by_device_time(softmax_gpu):
    files = sorted((softmax_gpu / "profile").rglob("key_averages.json"))
    assert files
    for path in files:
        about = json.loads(path.read_text())
        assert about["sorted_by"] == "self_device_time_total" and about["rows"]
        if about["variant"] == "tk":
            assert about["rows"][0]["self_device_us"] > 0  # a kernel's device time leads the table
        trace = json.loads((path.parent / "trace.json").read_text())
        assert any(e.get("cat") == "kernel" for e in trace["traceEvents"])


def test_each_profile_says_what_one_call_held_at_its_peak(softmax_gpu):
    """memory.md: tk's softmax of 1024 x 65536 bf16 holds its output (128 MB) at its peak, allocated in tk's
    code; the allocator's history beside it."""
    page = (softmax_gpu / "profile" / "tk" / "bfloat16" / "1024x65536" / "memory.md").read_text()
    peak = float(page.split("Peak above the memory held before the call: ")[1].split(" MB")[0].replace(",", ""))
    assert 1024 * 65536 * 2 / 1e6 <= peak < 1.5 * 1024 * 65536 * 2 / 1e6, page
    assert "(torch)" not in page.split("| allocated at |")[1].splitlines()[2], page  # the output: charged to tk's code
    assert (softmax_gpu / "profile" / "tk" / "bfloat16" / "1024x65536" / "memory.pickle").stat().st_size > 0
    assert "[memory at the peak](profile/tk/bfloat16/1024x65536/memory.md)" in (softmax_gpu / "report.md").read_text()


def test_report_html_gives_each_kernel_its_device_time(softmax_gpu):
    page = (softmax_gpu / "report.html").read_text()
    tk_sides = re.findall(r'<div class="side tk">(.*?)</div><div class="side gen">', page, re.S)
    assert len(tk_sides) == 2
    for side in tk_sides:
        assert '<span class="bar"' in side and "interpreted" not in side  # µs per call, measured


@pytest.mark.skipif(ncu.ncu_path() is None, reason="no ncu (Nsight Compute) on PATH")
def test_ncu_summary_per_kernel(tmp_path):
    argv = ["--op", "softmax", "--dtypes", "bfloat16", "--shapes", "4096x4096", "--variants", "eager,compile,tk",
            "--rep-ms", "5", "--rounds", "1", "--ncu", "--quiet", "--out", str(tmp_path)]  # fmt: skip
    assert cli.main(argv) == 0
    summary = json.loads((tmp_path / "softmax" / "ncu" / "summary.json").read_text())
    assert not summary["errors"], summary["errors"]
    variants = {r["variant"] for r in summary["rows"]}
    assert {"eager", "compile", "tk"} <= variants  # the kind "compile" also names softmax's compile-unfused
    for r in summary["rows"]:
        assert r["time"] > 0 and r["registers"] > 0 and 0 < r["occupancy"] <= 100 and r["DRAM"] > 0, r
    assert (tmp_path / "softmax" / "ncu" / "tk.ncu-rep").is_file()
    assert "Nsight Compute" in (tmp_path / "softmax" / "report.html").read_text()
    assert torch.cuda.is_available()
