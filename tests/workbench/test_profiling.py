"""--profile (torch.profiler traces, key_averages, NVTX ranges) and --ncu (Nsight Compute): what runs without a GPU.

ncu is not installed here: its summary is tested on sample output written in the CSV layouts ncu documents
(tests/workbench/data: the raw page with its row of units, and the details page) and on a raw page ncu wrote
on an H100 (ncu_raw_h100.csv), its command lines as built,
and --ncu is refused with the reason where it cannot run.  The profiling itself runs on a GPU machine
(make profile OP=softmax TOOL=ncu)."""

import json
from pathlib import Path

import pytest
import torch

import ops
from compare import cli, ncu, profiling

DATA = Path(__file__).parent / "data"


def test_raw_page_summary():
    kernels = ncu.parse_csv((DATA / "ncu_raw.csv").read_text())
    assert [k["Kernel Name"] for k in kernels] == ["softmax_forward_kernel", "softmax_normalize_segments_kernel"]
    first, second = ncu.summarize(kernels, "tk")
    assert first["variant"] == "tk" and first["time"] == pytest.approx(11.328)  # 11,328 ns
    assert first["DRAM"] == pytest.approx(2961.545362788)  # GB/s
    assert first["DRAM %"] == 88.53 and first["occupancy"] == 87.12 and first["theoretical"] == 100
    assert first["registers"] == 32 and first["spill loads"] == 0 and first["grid"] == 1024 and first["block"] == 128
    assert second["registers"] == 168 and second["spill loads"] == 1024 and second["spill stores"] == 2048


def test_a_raw_page_from_nsight_compute_on_an_h100():
    """Real output (ncu's raw page of tk's matmul at 4096^3 bfloat16, H100), whose base units are spelled `ns` and
    `byte/s`: read as seconds, the time came out at 2.1e11 µs."""
    (kernel,) = ncu.parse_csv((DATA / "ncu_raw_h100.csv").read_text())
    (row,) = ncu.summarize([kernel], "tk")
    assert row["kernel"] == "matmul_tma_kernel" and row["time"] == pytest.approx(214.368)  # 214,368 ns
    assert row["DRAM"] == pytest.approx(1003.277, rel=1e-6)  # GB/s
    assert (row["registers"], row["grid"], row["block"], row["spill loads"]) == (161, 132, 256, 0)
    assert row["SM %"] == 88.35 and row["occupancy"] == 12.5


def test_details_page_summary():
    (kernel,) = ncu.parse_csv((DATA / "ncu_details.csv").read_text())
    (row,) = ncu.summarize([kernel], "compile")
    assert row["kernel"] == "triton_red_fused__softmax_0" and row["time"] == pytest.approx(12.42)  # µs
    assert row["DRAM"] == pytest.approx(2850.0) and row["registers"] == 40 and row["occupancy"] == 71.3
    assert row["spill stores"] == pytest.approx(1500.0) and row["theoretical"] is None  # n/a
    assert row["SM %"] is None  # not collected: an empty cell, not a zero


@pytest.mark.parametrize("text, unit, value", [("1,024", "", 1024.0), ("12.5", "usecond", 12.5e-6), ("3", "Gbyte/second", 3e9),
                                               ("2", "Kbyte", 2000.0), ("n/a", "%", None), ("87.1", "%", 87.1),
                                               ("206,900", "ns", 2.069e-4), ("5", "byte/s", 5.0), ("1.5", "us", 1.5e-6),
                                               ("7", "cycle/s", 7.0)])  # fmt: skip
def test_units(text, unit, value):
    assert ncu.number(text, unit) == (pytest.approx(value) if value is not None else None)


def test_the_command_lines(tmp_path):
    child = ncu.child_argv("softmax", "tk", "bfloat16", (4096, 1024))
    case = json.loads(child[-1])
    assert child[1:4] == ["-m", "compare.ncu", "--child"] and case == {"op": "softmax", "variant": "tk",
                                                                       "dtype": "bfloat16", "shape": [4096, 1024]}  # fmt: skip
    command = ncu.profile_command("/opt/ncu", tmp_path / "tk.ncu-rep", child)
    assert command[0] == "/opt/ncu" and command[-len(child):] == child
    at = command.index("--nvtx-include")
    assert "--nvtx" in command and command[at + 1] == "tk-ncu/"  # the push/pop range the child opens
    assert set(command[command.index("--metrics") + 1].split(",")) == set(ncu.METRICS)
    assert command[command.index("--export") + 1] == str(tmp_path / "tk.ncu-rep") and "--force-overwrite" in command
    assert ncu.import_command("/opt/ncu", tmp_path / "tk.ncu-rep")[1:] == [
        "--import", str(tmp_path / "tk.ncu-rep"), "--csv", "--page", "raw", "--print-units", "base"]  # fmt: skip


def test_ncu_is_refused_where_it_cannot_run(monkeypatch, capsys):
    assert "the device is cpu" in ncu.unavailable(torch.device("cpu"))
    monkeypatch.setattr(ncu, "ncu_path", lambda: None)
    assert "not on PATH" in ncu.unavailable(torch.device("cuda"))
    assert "leave out --gpus" in ncu.unavailable(torch.device("cuda"), gpus=2)
    with pytest.raises(SystemExit):
        cli.main(["--op", "gelu", "--device", "cpu", "--ncu", "--quiet"])
    assert "--ncu: Nsight Compute profiles GPU kernels; the device is cpu" in capsys.readouterr().err


def test_the_summary_page(tmp_path):
    rows = ncu.summarize(ncu.parse_csv((DATA / "ncu_raw.csv").read_text()), "tk")
    result = {"op": "softmax", "dtype": "bfloat16", "shape_label": "4096x1024", "rows": rows,
              "errors": [{"variant": "liger", "error": "RuntimeError: not installed"}]}  # fmt: skip
    md = ncu.markdown(result)
    assert "| tk        | softmax_forward_kernel" in md and "| occupancy (%)" in md and "2,962" in md
    assert "**liger**: RuntimeError: not installed" in md


def test_nvtx_ranges_wrap_cuda_regions_only(monkeypatch):
    opened = []

    class Range:
        def __init__(self, name):
            opened.append(name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            opened.append("closed")

    monkeypatch.setattr(torch.cuda.nvtx, "range", Range)
    with profiling.timed_region("tk bfloat16 4096x1024", torch.device("cuda")):
        pass
    with profiling.timed_region("tk float32 n=1000", torch.device("cpu")):
        pass
    assert opened == ["tk bfloat16 4096x1024", "closed"]


def test_a_trace_and_its_table(tmp_path):
    x = torch.randn(1000)
    folder = profiling.trace_variant(lambda t: (t.exp() + 1).sum(), (x,), torch.device("cpu"), tmp_path / "profile",
                                     "eager", "float32", "n=1000", calls=3)  # fmt: skip
    trace = json.loads((folder / "trace.json").read_text())
    assert any(e.get("name") == "aten::exp" for e in trace["traceEvents"])
    (about,) = profiling.read_profiles(tmp_path)
    assert about["trace"] == "profile/eager/float32/n=1000/trace.json" and about["calls"] == 3
    by_name = {r["name"]: r for r in about["rows"]}
    assert by_name["aten::exp"]["calls"] == 1 and by_name["aten::exp"]["self_cpu_us"] > 0
    assert "aten::exp" in (folder / "key_averages.txt").read_text()


def test_a_trace_on_a_cpu_has_no_memory_history(tmp_path):
    folder = profiling.trace_variant(lambda t: t * 2, (torch.ones(8),), torch.device("cpu"), tmp_path / "profile",
                                     "eager", "float32", "n=8", calls=1)  # fmt: skip
    assert not (folder / "memory.md").exists() and "memory" not in profiling.read_profiles(tmp_path)[0]


def _event(action, addr, size=0, *files):
    return {"action": action, "addr": addr, "size": size,
            "frames": [{"filename": f, "line": 7, "name": "fn"} for f in files]}  # fmt: skip


def test_the_peak_of_an_allocator_history_and_who_held_it():
    """The peak counts allocations until their free is requested (as max_memory_allocated does), never the
    memory held before; each is charged to the innermost frame outside torch and the harness."""
    torch_file, ours = torch.__file__, str(Path(profiling.__file__))
    trace = [
        _event("alloc", 1, 100, torch_file, "/m/ops/lce.py"),  # tk's chunk buffer
        _event("alloc", 2, 50, torch_file, ours, "/m/models/llama.py"),
        _event("alloc", 3, 30, torch_file),  # torch's own (a workspace): the peak, 180
        _event("free_requested", 1),  # no longer counted, though its free completes later (another stream)
        _event("alloc", 4, 60, "<frozen runpy>", "/m/ops/lce.py"),  # 140
        _event("free_completed", 1),
        _event("free_requested", 99),  # allocated before the history began: ignored
        _event("segment_alloc", 5, 1000),
    ]
    peak, held = profiling.at_peak(trace)
    assert peak == 180 and [(h.size, h.where) for h in held] == [(100, "lce.py:7 fn"), (50, "llama.py:7 fn"), (30, "(torch)")]
    later = trace[:4] + [_event("alloc", 4, 140, "/m/ops/lce.py")]  # a larger peak after the first free
    assert [(h.size, h.where) for h in profiling.at_peak(later)[1]] == [(140, "lce.py:7 fn"), (50, "llama.py:7 fn"), (30, "(torch)")]
    page = profiling.peak_markdown("tk, bfloat16 4x2048: one call", (peak, held), top=2)
    assert "0.0 MB in 3 allocations" in page and "| `lce.py:7 fn` | 1 | 0.0 |" in page and "| (the rest) | 1 |" in page
    assert "Incomplete" not in page and "Incomplete" in profiling.peak_markdown("t", (peak, held), cut=True)
    assert profiling.at_peak([]) == (0, [])


def test_profile_case_runs_each_variant_and_reports_progress(tmp_path, monkeypatch):
    """profile_case end to end with ncu's two commands stood in for (a report written, the sample raw CSV
    read back): a summary row per variant's kernel, and a status line per variant on the run's Progress
    (the GPU run once called the Progress object itself and stopped there)."""
    import io
    import types

    from compare.progress import Progress

    def fake_run(command, timeout):
        if "--import" in command:
            return types.SimpleNamespace(returncode=0, stdout=(DATA / "ncu_raw.csv").read_text(), stderr="")
        Path(command[command.index("--export") + 1]).write_bytes(b"report")
        return types.SimpleNamespace(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(ncu, "ncu_path", lambda: "/opt/ncu")
    monkeypatch.setattr(ncu, "_run", fake_run)
    spec = ops.get_spec("softmax")
    variants = [types.SimpleNamespace(name=name, kind=name, peer_devices=()) for name in ("eager", "tk")]
    sweep = types.SimpleNamespace(spec=spec, variants=variants, cases=lambda: [(torch.bfloat16, (64, 1000))])
    stream = io.StringIO()
    result = ncu.profile_case(sweep, tmp_path, Progress(stream))
    assert not result["errors"], result["errors"]
    assert {row["variant"] for row in result["rows"]} == {"eager", "tk"}
    assert "ncu: eager (bfloat16" in stream.getvalue() and "ncu: tk (bfloat16" in stream.getvalue()
    assert json.loads((tmp_path / "ncu" / "summary.json").read_text())["rows"] == result["rows"]
