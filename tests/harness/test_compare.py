"""The comparison harness end to end, on the CPU, on tiny sizes."""

import csv
import dataclasses
import json
import math
import os
import time
from pathlib import Path

import pytest
import torch

import ops
from compare import cli, kernels, report, runner, schema, timing
from compare.variants import all_variants, select
from ops.spec import OpSpec

FAST = ["--device", "cpu", "--rep-ms", "2", "--rounds", "1", "--quiet", "--no-capture"]  # CPU on any machine: GPU runs are in test_compare_gpu.py


def run(tmp_path, *argv) -> int:
    return cli.main([*argv, "--out", str(tmp_path), *FAST])


def load(root: Path, op: str) -> dict:
    return json.loads((root / op / "results.json").read_text())


def records(doc, **match):
    return [r for r in doc["records"] if all(r[k] == v for k, v in match.items())]


def check_files_consistent(root: Path, op: str) -> dict:
    """JSON valid, CSV the same records, markdown naming every row, PNG a PNG."""
    folder = root / op
    assert folder.is_symlink() and folder.resolve().parent.parent == (root / "runs").resolve()
    doc = load(root, op)
    assert schema.validate(doc) == []
    assert doc["complete"] is True and doc["op"] == op
    with open(folder / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(doc["records"]) > 0
    assert list(rows[0]) == list(schema.RECORD_FIELDS)
    for row, rec in zip(rows, doc["records"]):
        assert row["variant"] == rec["variant"] and row["status"] == rec["status"]
        assert row["shape"] == "x".join(map(str, rec["shape"]))
        for key in ("median_ms", "first_call_ms", "rel_error", "gbps"):
            if rec[key] is None:
                assert row[key] == ""
            else:
                assert float(row[key]) == pytest.approx(rec[key], rel=1e-12)
    md = (folder / "report.md").read_text()
    for rec in doc["records"]:
        if rec["status"] != "skipped":
            assert f"| {rec['variant']}" in md
            assert rec["shape_label"] in md
    assert "## Measured limits" in md and "copy bandwidth" in md
    png = (folder / "throughput.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert "![throughput](throughput.png)" in md
    return doc


# --------------------------------------------------------------------------
# Every registered op, end to end (eager, compositions and tk: no compile).
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def all_ops_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("logs")
    assert run(root, "--op", "all", "--variants", "eager,unfused,tk,peer", "--quick") == 0
    return root


@pytest.mark.parametrize("op", sorted(ops.SPECS))
def test_every_op_end_to_end(all_ops_run, op):
    doc = check_files_consistent(all_ops_run, op)
    spec = ops.SPECS[op]
    shape = list(spec.shapes["cpu"][0])
    eager = records(doc, variant="eager")[0]
    tk = records(doc, variant="tk")[0]
    (dtype,) = cli.default_dtypes(spec, torch.device("cpu"))  # float32 where the op takes it
    assert eager["shape"] == tk["shape"] == shape and eager["dtype"] == str(dtype).replace("torch.", "")
    assert eager["status"] == tk["status"] == "ok"
    assert 0 <= tk["rel_error"] <= spec.tolerance[dtype]
    # Interpreted tk: timed, but no throughput or speed-up and never "best".
    assert tk["interpreted"] and tk["median_ms"] > 0 and tk["gbps"] is None and tk["speedup_vs_eager"] is None
    assert not tk["best"] and sum(r["best"] for r in doc["records"]) == 1  # one best, never the interpreted tk
    assert eager["gbps"] == pytest.approx(eager["bytes"] / (eager["median_ms"] * 1e-3) / 1e9)
    assert eager["speedup_vs_eager"] == pytest.approx(1.0)
    assert eager["limit_share"] == pytest.approx(
        (eager["tflops"] / doc["limits"]["matmul"]["float32"]["tflops"])
        if spec.bound == "compute"
        else eager["gbps"] / doc["limits"]["copy"]["gbps"]
    )
    # the tk op, opaque on CPU: one op a call (a training step, as linear_cross_entropy's, no more than eager's)
    assert tk["kernel_unit"] == "ops" and (tk["kernels"] == 1 or 1 < tk["kernels"] <= eager["kernels"])
    assert eager["first_call_ms"] > 0 and eager["p20_ms"] <= eager["median_ms"] <= eager["p80_ms"]
    for name in spec.unfused:
        assert records(doc, variant=name)[0]["status"] == "ok"
    for name in spec.peers:  # on the CPU, installed or not: skipped, listed with the reason, not in the table
        assert any(s["variant"] == name for s in doc["skipped"])


def test_a_run_of_several_ops_has_a_summary(all_ops_run):
    """The one page over every op (compare/summary.py): each op and dtype in its
    table; on the CPU tk is interpreted, so it has no time to compare."""
    page = (all_ops_run / "latest" / "summary.md").read_text()
    assert f"{len(ops.SPECS)} ops from {len(ops.SPECS)} reports" in page
    for op in ops.SPECS:
        assert f"| {op} " in page
    worst, largest = page.split("## The worst case of each op and dtype")[1].split("## The largest shape of each op and dtype")
    assert worst.count("no time for tk or no other variant") == largest.count("no time for tk or no other variant") == len(ops.SPECS)
    assert "## Variants that failed or were wrong\n\nNone." in page


def test_latest_points_at_the_complete_run(all_ops_run):
    latest = all_ops_run / "latest"
    assert latest.is_symlink()
    for op in ops.SPECS:
        assert (latest / op / "results.json").is_file()
        assert (all_ops_run / op).resolve().parent == latest.resolve()


# --------------------------------------------------------------------------
# torch.compile, once, on one tiny shape: fusion shows in the counts.
# --------------------------------------------------------------------------


def test_compile_variants_and_fusion(tmp_path):
    assert run(tmp_path, "--op", "gelu", "--shapes", "1000", "--variants", "eager,unfused,compile,tk") == 0
    doc = check_files_consistent(tmp_path, "gelu")
    by = {r["variant"]: r for r in doc["records"]}
    assert set(by) == {"eager", "eager-unfused", "compile", "compile-unfused", "tk"}
    assert all(r["status"] == "ok" for r in by.values())
    assert by["eager-unfused"]["kernels"] >= 4  # mul, pow, add, tanh ... one op each
    assert by["compile-unfused"]["kernels"] == 1 and by["compile"]["kernels"] == 1
    assert any("cpp_fused" in n for n in by["compile-unfused"]["kernel_names"])
    # The first call compiles: far slower than a steady-state call, and reported apart.
    assert by["compile"]["first_call_ms"] > 20 * by["compile"]["median_ms"]
    assert by["compile"]["speedup_vs_compile"] == pytest.approx(1.0)
    assert by["eager"]["speedup_vs_compile"] == pytest.approx(by["compile"]["median_ms"] / by["eager"]["median_ms"])


# --------------------------------------------------------------------------
# Failures: a small spec built here, never touching ops/.
# --------------------------------------------------------------------------


class Boom(RuntimeError):
    pass


def _raises(x):
    raise Boom("kernel exploded")


def _crashing_peer():
    return _raises


def _missing_peer():
    raise ImportError("No module named 'nonexistent_lib'")


def _inputs(shape, dtype, device):
    if shape[0] == 13:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
    if shape[0] == 99:
        raise KeyboardInterrupt
    return (torch.linspace(-3, 3, shape[0], dtype=dtype, device=device),)


class FlakyAfterFirst:
    """Works for the first call and the profiler, fails once timing starts."""

    def __init__(self):
        self.calls = 0

    def __call__(self, x):
        self.calls += 1
        if self.calls > 3:
            raise Boom("failed on call 4")
        return torch.sigmoid(x)


def fake_spec(name="fake"):
    return OpSpec(
        name=name,
        tk=torch.sigmoid,
        reference=torch.sigmoid,
        make_inputs=_inputs,
        bytes_moved=lambda shape, dtype: 2 * shape[0] * 4,
        flops=lambda shape, dtype: 4 * shape[0],
        tolerance={torch.float32: 1e-5},
        shapes={"cpu": [(64,), (13,), (256,)], "cuda": [(64,)]},
        describe=lambda shape: f"n={shape[0]}",
        dtypes=(torch.float32,),
        unfused={"eager-raises": _raises, "eager-wrong": lambda x: torch.sigmoid(x) * 1.01, "eager-flaky": FlakyAfterFirst()},
        peers={"missing": _missing_peer, "crashy": _crashing_peer},
        peer_devices=("cpu", "cuda"),
    )


@pytest.fixture
def fake_op(monkeypatch):
    spec = fake_spec()
    monkeypatch.setitem(ops.SPECS, spec.name, spec)
    return spec


def test_failures_are_rows_and_the_run_goes_on(tmp_path, fake_op, capsys):
    assert run(tmp_path, "--op", "fake", "--variants", "eager,unfused,tk,peer") == 0
    doc = check_files_consistent(tmp_path, "fake")
    n64 = {r["variant"]: r for r in records(doc, shape=[64])}
    assert n64["eager"]["status"] == "ok" and n64["tk"]["status"] == "ok"
    raised = n64["eager-raises"]
    assert raised["status"] == "failed" and raised["median_ms"] is None
    assert "first call" in raised["error"] and "Boom: kernel exploded" in raised["error"]
    wrong = n64["eager-wrong"]
    assert wrong["status"] == "wrong" and wrong["rel_error"] == pytest.approx(0.01, rel=1e-3)
    assert wrong["median_ms"] > 0 and wrong["gbps"] > 0 and not wrong["best"]  # timed, flagged
    assert "tolerance" in wrong["error"]
    flaky = n64["eager-flaky"]
    assert flaky["status"] == "failed" and flaky["error"].startswith("timing: Boom")
    assert n64["crashy"]["status"] == "failed" and "kernel exploded" in n64["crashy"]["error"]
    assert n64["missing"]["status"] == "skipped" and "nonexistent_lib" in n64["missing"]["error"]
    assert doc["skipped"] == [{"variant": "missing", "reason": n64["missing"]["error"]}]
    # The shape whose inputs could not be made: every variant failed, saying why.
    n13 = records(doc, shape=[13])
    assert n13 and all(r["status"] in ("failed", "skipped") for r in n13)
    assert all("OutOfMemoryError" in r["error"] for r in n13 if r["variant"] != "missing")
    # ...and the sweep went on to the next shape.
    assert records(doc, shape=[256], variant="eager")[0]["status"] == "ok"
    md = (tmp_path / "fake" / "report.md").read_text()
    assert "WRONG" in md and "FAILED" in md and "## Failures and wrong results" in md
    assert "peer `missing` skipped" in md
    table = report.terminal_tables(doc)
    assert "eager-wrong" in table and "(!)" in table and "missing" not in table


def test_a_peer_is_skipped_on_a_device_it_does_not_run_on(tmp_path, monkeypatch):
    spec = dataclasses.replace(fake_spec(), unfused={}, peers={"gpu-lib": lambda: torch.sigmoid}, peer_devices=("cuda",))
    monkeypatch.setitem(ops.SPECS, spec.name, spec)
    assert run(tmp_path, "--op", "fake", "--variants", "eager,peer", "--shapes", "64") == 0
    doc = check_files_consistent(tmp_path, "fake")
    peer = records(doc, variant="gpu-lib")[0]
    assert peer["status"] == "skipped" and peer["error"] == "runs on cuda only, not on cpu"
    assert doc["skipped"] == [{"variant": "gpu-lib", "reason": "runs on cuda only, not on cpu"}]


def test_interrupted_run_keeps_the_previous_report(tmp_path, monkeypatch):
    good = fake_spec()
    monkeypatch.setitem(ops.SPECS, "fake", good)
    assert run(tmp_path, "--op", "fake", "--variants", "eager", "--shapes", "64") == 0
    before_op = os.readlink(tmp_path / "fake")
    before_latest = os.readlink(tmp_path / "latest")
    # Second run: the second shape's inputs raise KeyboardInterrupt (Ctrl-C).
    assert run(tmp_path, "--op", "fake", "--variants", "eager", "--shapes", "64,99") == 130
    assert os.readlink(tmp_path / "fake") == before_op
    assert os.readlink(tmp_path / "latest") == before_latest
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2
    partial = json.loads((runs[-1] / "fake" / "results.json").read_text())
    assert partial["complete"] is False and [r["shape"] for r in partial["records"]] == [[64]]
    assert "Incomplete" in (runs[-1] / "fake" / "report.md").read_text()
    assert load(tmp_path, "fake")["complete"] is True


# --------------------------------------------------------------------------
# Clear errors for bad options.
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--op", "nosuchop"], ["unknown op 'nosuchop'", "gelu", "softmax", "matmul", "all"]),
        (["--op", "gelu", "--dtypes", "float8"], ["unknown dtype 'float8'", "float32", "bfloat16"]),
        (["--op", "gelu", "--variants", "eager,turbo"], ["unknown variant(s) turbo", "eager-unfused", "tk"]),
        (["--op", "softmax", "--shapes", "64"], ["needs 2 dim(s)", "4096x128"]),
        (["--op", "gelu", "--shapes", "12a"], ["bad shape '12a'"]),
        (["--op", "all", "--shapes", "64"], ["--shapes needs a single op"]),
    ],
)
def test_usage_errors(tmp_path, capsys, argv, expected):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*argv, "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    for text in expected:
        assert text in err
    assert not (tmp_path / "runs").exists()  # nothing ran


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
@pytest.mark.parametrize("main", ["harness", "overhead"])
def test_device_cuda_without_cuda_is_a_usage_error(tmp_path, capsys, main):
    from compare import overhead

    with pytest.raises(SystemExit) as exit_info:
        if main == "harness":
            cli.main(["--op", "gelu", "--device", "cuda", "--out", str(tmp_path)])
        else:
            overhead.main(["--op", "gelu", "--device", "cuda"])
    assert exit_info.value.code == 2
    assert "--device cuda: no CUDA device is available" in capsys.readouterr().err


def test_dtype_aliases_and_defaults():
    spec = ops.SPECS["gelu"]
    assert cli.parse_dtypes("bf16,fp32", spec) == [torch.bfloat16, torch.float32]
    assert cli.default_dtypes(spec, torch.device("cpu")) == [torch.float32]
    assert cli.default_dtypes(spec, torch.device("cuda")) == list(spec.dtypes)
    assert cli.parse_shapes("4096x128, 64x1000", ops.SPECS["softmax"]) == [(4096, 128), (64, 1000)]


def test_shapes_take_the_words_an_op_uses_where_it_uses_them():
    """matmul's `linear` (b = W.t(), as a model's projection runs it) in its fourth place, nowhere else."""
    matmul = ops.SPECS["matmul"]
    assert cli.parse_shapes("8191x50257x768xlinear,64x48x80", matmul) == [(8191, 50257, 768, "linear"), (64, 48, 80)]
    for bad, says in [("8191x50257xlinearx768", "bad shape"), ("1x2x3x4", "needs 3 dim"), ("64x48", "needs 3 dim"),
                      ("64x48x80xlinearxlinear", "bad shape"), ("0x48x80xlinear", "dims must be positive")]:  # fmt: skip
        with pytest.raises(cli.UsageError, match=says):
            cli.parse_shapes(bad, matmul)
    with pytest.raises(cli.UsageError, match=r"like \d+x\d+x\d+ or \d+x\d+x\d+xlinear$"):  # one of each form
        cli.parse_shapes("64x48", matmul)
    with pytest.raises(cli.UsageError, match="bad shape"):
        cli.parse_shapes("4096xlinear", ops.SPECS["softmax"])  # softmax has no words


# --------------------------------------------------------------------------
# Pieces.
# --------------------------------------------------------------------------


def test_variants_come_from_the_spec_only():
    names = [v.name for v in all_variants(ops.SPECS["gelu"], max_autotune=True)]
    assert names == ["eager", "eager-unfused", "compile", "compile-unfused", "compile-max-autotune",
                     "compile-max-autotune-unfused", "tk", "cuda"]  # fmt: skip
    spec = fake_spec()
    kinds = {v.name: v.kind for v in all_variants(spec)}
    assert kinds["missing"] == kinds["crashy"] == "peer" and "compile-max-autotune" not in kinds
    assert [v.name for v in select(all_variants(spec), ["compile", "tk"])] == [
        "compile", "compile-raises", "compile-wrong", "compile-flaky", "tk"]  # fmt: skip


def test_a_tk_plan_variant_is_checked_and_interpreted_as_tk(tmp_path):
    """matmul's tk-row-major (tk's kernels in row-major program order), on a shape of 3 x 2 tiles cut at every edge:
    checked against float64 as every variant, and on a CPU interpreted as tk is (timed; no throughput; never best).
    The kind tk does not select it."""
    assert run(tmp_path, "--op", "matmul", "--variants", "eager,tk,tk-plan", "--shapes", "130x66x100") == 0
    doc = check_files_consistent(tmp_path, "matmul")
    row_major = records(doc, variant="tk-row-major")[0]
    assert row_major["kind"] == "tk-plan" and row_major["status"] == "ok"
    assert 0 < row_major["rel_error"] <= ops.SPECS["matmul"].tolerance[torch.float32]
    assert row_major["interpreted"] and row_major["median_ms"] > 0 and row_major["tflops"] is None and not row_major["best"]
    assert [v.name for v in select(all_variants(ops.SPECS["matmul"]), ["tk"])] == ["tk"]


def test_relative_error():
    ref = [torch.tensor([3.0, 4.0], dtype=torch.float64)]
    assert runner.errors(torch.tensor([3.0, 4.0]), ref) == (0.0, 0.0)
    rel, max_abs = runner.errors(torch.tensor([3.0, 4.5]), ref)
    assert rel == pytest.approx(0.1) and max_abs == pytest.approx(0.5)
    assert runner.errors(torch.tensor([3.0, float("nan")]), ref)[0] == math.inf
    with pytest.raises(ValueError, match="shape"):
        runner.errors(torch.tensor([3.0]), ref)


def test_samples_quantiles():
    s = timing.Samples()
    s.add([5.0, 1.0, 3.0, 2.0, 4.0])
    assert s.median == 3.0 and s.quantile(0.2) == pytest.approx(1.8) and s.quantile(0.8) == pytest.approx(4.2)
    assert timing.Samples().median is None


def test_rotating_copies_fill_twice_the_cache_and_keep_the_layout():
    base = torch.arange(64 * 10, dtype=torch.float32)
    view = base.view(64, 10)[:, 1:9].t()  # a strided view with an offset: 8x64, storage of 2560 bytes
    copies = timing.rotating_copies((view, 3), l2_bytes=6000)
    assert len(copies) == 5  # ceil(2 * 6000 / 2560)
    assert copies[0][0] is view  # the original set first, as it is
    storages = {c[0].untyped_storage().data_ptr() for c in copies}
    assert len(storages) == 5  # each copy reads its own memory
    for tensor, number in copies[1:]:
        assert number == 3 and torch.equal(tensor, view)
        assert tensor.stride() == view.stride() and tensor.storage_offset() == view.storage_offset()
    assert len(timing.rotating_copies((view,), l2_bytes=10**9, max_copies=7)) == 7  # capped
    assert len(timing.rotating_copies((view,), l2_bytes=100)) == 1  # inputs larger than the cache: no copy


def test_rotating_copies_keep_inputs_that_share_a_storage_shared():
    x = torch.arange(100, dtype=torch.float32)
    other = torch.ones(50)
    copies = timing.rotating_copies((x, x, x[10:20], other), l2_bytes=1200)
    assert len(copies) == 4  # ceil(2 * 1200 / (400 + 200)): the shared storage counted once
    for a, b, c, d in copies[1:]:
        assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() == c.untyped_storage().data_ptr()
        assert a.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        assert d.untyped_storage().data_ptr() not in (a.untyped_storage().data_ptr(), other.untyped_storage().data_ptr())
        assert torch.equal(c, x[10:20]) and c.storage_offset() == 10 and torch.equal(d, other)
        a.add_(1)  # one buffer: a write through one view shows in the others
        assert torch.equal(b, a) and torch.equal(c, a[10:20])


def test_report_gives_the_cuda_graph_speedup_over_eager():
    def record(variant, median, graph, status="ok"):
        fields = dict.fromkeys(["p20_ms", "p80_ms", "first_call_ms", "error", "gbps", "tflops", "limit_share",
                                "speedup_vs_eager", "speedup_vs_compile", "kernels", "rel_error", "kernel_unit"])  # fmt: skip
        return {**fields, "variant": variant, "status": status, "median_ms": median, "cudagraph_ms": graph, "best": False,
                "interpreted": False}

    failed = {**record("peer", None, None, "failed"), "error": "build: ImportError"}
    rows = [record("eager", 0.010, 0.0071), record("tk", 0.050, 0.0081), failed]
    headers, table = report.table_rows(rows, "compute")
    graph = headers.index("CUDA graph (vs eager)")
    assert [row[graph] for row in table] == ["7.1 µs (1.00x)", "8.1 µs (0.88x)", ""]
    headers, _ = report.table_rows([record("eager", 0.010, None)], "compute")
    assert not any("CUDA graph" in h for h in headers)  # no graph time, no column


def test_cpu_op_count_ignores_bookkeeping():
    x = torch.randn(100)
    prof = kernels.profile_call(lambda t: (t * 2).reshape(10, 10).t().contiguous().sum(), (x,), torch.device("cpu"))
    assert prof.unit == "ops"
    assert prof.names == ["aten::mul", "aten::clone", "aten::sum"]


def test_schema_validation_catches_problems():
    good = {k: None for k in schema.TOP_FIELDS} | {"schema": schema.SCHEMA, "schema_version": 1, "records": []}
    assert schema.validate(good) == []
    rec = runner.base_record(fake_spec(), all_variants(fake_spec())[0], torch.float32, (64,),
                              runner.Settings(torch.device("cpu"), 1.0, 1))  # fmt: skip
    rec["error"] = "inputs: Boom"
    assert schema.validate(good | {"records": [rec]}) == []
    bad = dict(rec, status="great", kernels="3")
    del bad["median_ms"]
    problems = schema.validate(good | {"records": [bad], "schema_version": 2})
    assert any("schema_version" in p or "v2" in p for p in problems)
    assert any("missing 'median_ms'" in p for p in problems)
    assert any("status 'great'" in p for p in problems)
    assert any("kernels='3'" in p for p in problems)
    assert json.loads(json.dumps(report._clean({"x": [math.inf, 1.0]}))) == {"x": [None, 1.0]}


def test_tolerance_never_below_the_rounding_of_the_exact_answer(tmp_path, monkeypatch):
    """float16 softmax of long rows: outputs near 4e-6 are subnormal, and their
    rounding alone passes the spec's tolerance.  The harness raises the
    tolerance to twice that rounding, and no more: 1.01x is still wrong."""
    softmax = lambda x: torch.softmax(x, dim=-1)  # noqa: E731
    spec = dataclasses.replace(
        fake_spec(),
        tk=softmax,
        reference=softmax,
        make_inputs=lambda shape, dtype, device: (torch.randn(shape, device=device).to(dtype),),
        tolerance={torch.float16: 2e-3},
        dtypes=(torch.float16,),
        unfused={"eager-wrong": lambda x: softmax(x) * 1.01},
        peers={},
    )
    monkeypatch.setitem(ops.SPECS, "fake", spec)
    assert run(tmp_path, "--op", "fake", "--variants", "eager,unfused,tk", "--shapes", "262144", "--dtypes", "float16") == 0
    doc = load(tmp_path, "fake")
    assert schema.validate(doc) == []
    by = {r["variant"]: r for r in doc["records"]}
    rounding = by["eager"]["rounding_error"]
    assert rounding > 2e-3  # the spec's tolerance alone would mark the exact answer wrong
    assert by["eager"]["tolerance"] == pytest.approx(2 * rounding)
    assert by["eager"]["status"] == "ok" and by["tk"]["status"] == "ok"
    assert by["eager-wrong"]["status"] == "wrong"


def test_time_against_peak_memory_is_drawn_where_peak_memory_was_measured(all_ops_run, tmp_path):
    doc = load(all_ops_run, "linear_cross_entropy")
    assert not any(r["peak_bytes"] for r in doc["records"])  # a CPU run: no peak memory, so no memory.png
    assert "memory_png" not in report.write_all(doc, tmp_path) and not (tmp_path / "memory.png").exists()
    for n, r in enumerate(doc["records"]):  # as a GPU run has them
        r["peak_bytes"] = None if r["status"] == "skipped" else (n + 1) * 1_000_000
    files = report.write_all(doc, tmp_path)
    assert files["memory_png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![time against peak memory](memory.png)" in (tmp_path / "report.md").read_text()


def test_a_plot_not_drawn_leaves_no_earlier_runs_plot_in_the_folder(all_ops_run, tmp_path, monkeypatch):
    """The pages of a folder are this run's: a throughput plot that fails to draw leaves no earlier
    run's throughput.png behind for report.md or report.html to show."""
    from compare import html, plot

    doc = load(all_ops_run, "gelu")
    report.write_all(doc, tmp_path)
    assert (tmp_path / "throughput.png").is_file()

    def fails(doc, path):
        raise ValueError("no axis")

    monkeypatch.setattr(plot, "throughput", fails)
    files = report.write_all(doc, tmp_path)
    assert "png" not in files and not (tmp_path / "throughput.png").exists()
    assert "plot throughput.png not drawn: ValueError: no axis" in doc["notes"]
    assert "data:image/png" not in html.write(doc, tmp_path).read_text()


def test_plot_axis_keeps_shapes_of_equal_size_apart():
    from compare.plot import _x_axis

    rec = lambda label, size: {"shape_label": label, "bytes": size}  # noqa: E731
    distinct = [rec("n=2^12", 16384), rec("n=2^20", 1 << 21)]
    assert _x_axis(distinct, "bytes") == ({"n=2^12": 16384, "n=2^20": 1 << 21}, True)
    same = [rec("4096x16384", 268), rec("64x1048576", 268), rec("4096x16384", 268)]
    assert _x_axis(same, "bytes") == ({"4096x16384": 0, "64x1048576": 1}, False)


# ---------------------------------------------------------------------------
# python -m compare.overhead: host time per call.
# ---------------------------------------------------------------------------


def test_overhead_reports_plain_and_training_calls(capsys):
    from compare import overhead

    assert overhead.main(["--op", "gelu,gelu_backward", "--calls", "100", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "eager +backward µs" in lines[1] and "tk / eager +backward" in lines[1]
    gelu = next(line.split() for line in lines if line.startswith("gelu "))
    assert len(gelu) == 11 and all(float(v) > 0 for v in gelu[3:6] + gelu[7:10])
    assert gelu[6] == gelu[10] == "Python"  # on the CPU the native lane is not in front of tk's ops
    backward_op = next(line.split() for line in lines if line.startswith("gelu_backward "))
    assert len(backward_op) == 7  # tk's gelu_backward has no backward of its own: no training columns


def test_overhead_leaves_the_training_columns_of_a_backward_op_empty():
    """aten's layer norm backward has no derivative either; asking it for one raises, which the
    report used to show as a failed backward.  tk's op comes first and has none: both are skipped."""
    from compare import overhead

    spec = ops.get_spec("layer_norm_backward")
    row = overhead.measure(spec, torch.device("cpu"), torch.float32, calls=1)
    assert row["tk µs"] > 0 and row["eager µs"] > 0
    assert row["eager +backward µs"] is None and row["tk +backward µs"] is None and "note" not in row


def test_overhead_training_call_runs_the_backward():
    from compare.overhead import with_backward

    seen = []
    x = torch.randn(5)

    def fn(t):
        y = t * 3
        y.register_hook(lambda g: seen.append(g.clone()))
        return y

    step = with_backward(fn, (x,))
    step()
    assert len(seen) == 2 and torch.equal(seen[1], torch.ones(5))  # the first backward checks it has one
    assert with_backward(lambda t: t.detach(), (x,)) is None  # nothing to differentiate
    assert with_backward(torch.ops.tk.gelu_backward, (x, x, "none")) is None  # no formula: skipped


def test_overhead_reports_a_failing_backward_and_keeps_the_rest(monkeypatch):
    from compare import overhead

    spec = ops.get_spec("gelu")

    def with_broken_backward(fn, args):
        if fn is spec.tk:
            raise RuntimeError("a broken formula")
        return None

    monkeypatch.setattr(overhead, "with_backward", with_broken_backward)
    row = overhead.measure(spec, torch.device("cpu"), torch.float32, calls=1)
    assert row["tk µs"] > 0 and row["eager +backward µs"] is None
    assert row["note"] == "backward failed: RuntimeError: a broken formula"


def test_cuda_graph_times_are_pooled_over_interleaved_rounds(monkeypatch):
    """Each variant's CUDA-graph figure is the median of its replays over every round, taken in
    turn with the other variants; one that cannot be captured, or fails while replaying, gets
    none and is not tried again, and the others keep theirs."""
    turns = []
    per_round = {"a": [[1.0, 1.0], [5.0, 5.0], [1.2, 1.2]], "b": [[2.0], [2.0], [2.0]]}

    def fake_times(fn, args, rep_ms):
        name = fn()
        turns.append(name)
        if name == "no capture":
            return None
        if name == "fails":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return per_round[name][sum(t == name for t in turns) - 1]

    monkeypatch.setattr(timing, "cudagraph_times", fake_times)
    names = ["a", "no capture", "fails", "b"]
    cases = [runner.Case(variant=None, record={}, fn=lambda name=name: name) for name in names]
    for case, name in zip(cases, names):
        case.variant = dataclasses.make_dataclass("V", ["name"])(name)
    runner._time_graphs(cases, (), runner.Settings(device=torch.device("cpu"), rep_ms=40, rounds=3), lambda *a: None)
    assert turns == ["a", "no capture", "fails", "b", "a", "b", "a", "b"]
    graph = {name: case.record["cudagraph_ms"] for name, case in zip(names, cases)}
    assert graph == {"a": 1.2, "no capture": None, "fails": None, "b": 2.0}  # a: the 5.0 round does not decide


# ---------------------------------------------------------------------------
# The terminal: progress and results only; what a user asks for, or a clear refusal.
# ---------------------------------------------------------------------------


def test_the_profilers_chatter_is_filtered_and_nothing_else():
    """The CPU build of torch 2.13 writes two lines on the C-level stderr per profiler session."""
    text = (b"USDT:2026-11-27 07:42:11 24657:24657 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
            b"a real error\n"
            b"USDT:2026-11-27 07:42:11 24657:24657 SyncActivityProfilerHandler.cpp:59] profiler_stop\n"
            b"STAGE:2024-01-01 00:00:00 1:1 ActivityProfilerController.cpp:314] Completed Stage: Warm Up\n"
            b"USDT: something else\n")  # fmt: skip
    assert kernels.without_profiler_chatter(text) == b"a real error\nUSDT: something else\n"


def test_a_run_keeps_the_profiler_off_the_terminal_and_real_errors_on_it(tmp_path, capfd):
    def loud(x):
        os.write(2, b"a real error\n")  # what a failing library writes on the C-level stderr
        return torch.sigmoid(x)

    prof = kernels.profile_call(loud, (torch.randn(10),), torch.device("cpu"))
    assert prof.names == ["aten::sigmoid"]
    assert run(tmp_path, "--op", "gelu", "--shapes", "1000", "--variants", "eager,tk") == 0
    err = capfd.readouterr().err
    assert err.count("a real error") == 2  # both profiled calls said it, after the session
    assert "profiler_start" not in err and "profiler_stop" not in err


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--op", "square", "--variants", "peer"], "op square has no variant 'peer' (it has: eager, eager-mul"),
        (["--op", "softmax", "--variants", "peer"], "the selected variants of softmax (liger) run on cuda only, not on cpu"),
        (["--op", "add,square", "--variants", "peer"], "nothing to run: op add has no variant 'peer'"),
        (["--op", "gelu,square", "--variants", "turbo"], "unknown variant(s) turbo: no op of gelu,square has them"),
    ],
)
def test_an_empty_selection_is_a_usage_error(tmp_path, capsys, argv, expected):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*argv, "--out", str(tmp_path), *FAST])
    assert exit_info.value.code == 2 and expected in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # nothing ran, nothing was replaced


def test_ops_without_the_selected_variants_are_left_out_of_a_run_of_several(tmp_path, fake_op, capsys):
    assert run(tmp_path, "--op", "gelu,fake", "--variants", "eager-wrong", "--quick") == 0
    assert "left out: op gelu has no variant 'eager-wrong'" in capsys.readouterr().err
    assert not (tmp_path / "gelu").exists() and [r["variant"] for r in load(tmp_path, "fake")["records"]] == ["eager-wrong"]


def test_a_report_where_nothing_ran_replaces_nothing(tmp_path, monkeypatch, capsys):
    """Every selected variant skipped (a peer that is not installed): the report is kept in its run folder,
    the earlier report stays the one logs/<op> names, and the run says so and exits 1."""
    monkeypatch.setitem(ops.SPECS, "fake", fake_spec())
    assert run(tmp_path, "--op", "fake", "--variants", "eager", "--shapes", "64") == 0
    before = os.readlink(tmp_path / "fake"), os.readlink(tmp_path / "latest")
    assert run(tmp_path, "--op", "fake", "--variants", "missing", "--shapes", "64") == 1
    err = capsys.readouterr().err
    assert "error: no variant of fake ran (missing: unavailable (No module named 'nonexistent_lib'))" in err
    assert f"{tmp_path / 'fake'} still names the previous report" in err
    assert (os.readlink(tmp_path / "fake"), os.readlink(tmp_path / "latest")) == before
    newest = sorted((tmp_path / "runs").iterdir())[-1]
    assert json.loads((newest / "fake" / "results.json").read_text())["records"][0]["status"] == "skipped"


def test_quick_does_what_its_help_says():
    """--quick: the first and last shape on a GPU, the first alone on a CPU (the interpreter), one dtype."""
    (quick,) = [a for a in cli.parser()._actions if "--quick" in a.option_strings]
    assert "the first and last shape on a GPU, the first shape alone on a CPU" in quick.help
    args = cli.parser().parse_args(["--op", "gelu", "--quick"])
    spec = ops.SPECS["gelu"]
    (cpu,) = cli.make_sweeps(args, torch.device("cpu"))
    (gpu,) = cli.make_sweeps(args, torch.device("cuda"))  # planned only: nothing touches a GPU
    every = cli.default_shapes(spec, torch.device("cuda"))  # the op's sweep, then its real shapes
    assert cpu.shapes == spec.shapes["cpu"][:1] and gpu.shapes == [every[0], every[-1]]
    assert len(cpu.dtypes) == len(gpu.dtypes) == 1


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--op", "nope"], "unknown op 'nope'; known ops: add, copy,"),
        (["--op", "gelu", "--dtype", "fp8"], "unknown dtype 'fp8' for op gelu; valid dtypes: float32, float16"),
        (["--op", "gelu", "--calls", "0"], "--calls must be at least 1"),
    ],
)
def test_overhead_usage_errors_are_the_main_clis(capsys, argv, expected):
    from compare import overhead

    with pytest.raises(SystemExit) as exit_info:
        overhead.main([*argv, "--device", "cpu"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and expected in err and "Traceback" not in err


def test_overhead_takes_the_aliases_documents_its_options_and_defaults_to_float32_on_cpu(capsys):
    from compare import overhead

    assert overhead.main(["--op", "gelu", "--dtype", "fp32,bf16", "--calls", "100", "--device", "cpu"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("gelu ")]
    assert [row[2] for row in rows] == ["float32", "bfloat16"]
    assert all(a.help for a in overhead.parser()._actions)  # every option says what it does
    assert overhead.default_dtype(ops.SPECS["gelu"], torch.device("cpu")) == torch.float32
    assert overhead.default_dtype(ops.SPECS["gelu"], torch.device("cuda")) == torch.float16
    assert overhead.default_dtype(ops.SPECS["rgb_to_grayscale"], torch.device("cuda")) == torch.uint8


class SlowFirstCall:
    """Takes ``seconds`` on its first call, as a Triton build and autotune does."""

    def __init__(self, seconds):
        self.seconds, self.calls = seconds, 0

    def __call__(self, x):
        self.calls += 1
        if self.calls == 1:
            time.sleep(self.seconds)
        return torch.sigmoid(x)


def test_a_long_first_call_is_announced_and_timed(tmp_path, monkeypatch, capsys):
    from compare import progress

    monkeypatch.setattr(progress, "LONG_STEP_S", 0.3)
    spec = dataclasses.replace(fake_spec(), tk=SlowFirstCall(0.8), unfused={}, peers={})
    monkeypatch.setitem(ops.SPECS, "fake", spec)
    argv = ["--op", "fake", "--variants", "eager,tk", "--shapes", "64", "--device", "cpu", "--rep-ms", "2", "--rounds", "1"]
    assert cli.main([*argv, "--no-capture", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "fake float32 n=64 | tk: first call: still running after 0 s (Triton compiling the kernels" in err
    took = next(line for line in err.splitlines() if "fake float32 n=64 | tk: first call: took" in line)
    assert 0.8 <= float(took.split("took ")[1].split(" s")[0]) < 5
    assert "eager: first call" not in err  # a quick first call says nothing


def test_a_peer_that_builds_for_long_is_announced(tmp_path, monkeypatch, capsys):
    """A peer's loader may compile an extension (the CUDA GELU: nvcc, once): the progress says so, not just 'building'."""
    from compare import progress

    def slow_loader():
        time.sleep(0.8)
        return torch.sigmoid

    monkeypatch.setattr(progress, "LONG_STEP_S", 0.3)
    spec = dataclasses.replace(fake_spec(), unfused={}, peers={"built": slow_loader}, peer_devices=("cpu",))
    monkeypatch.setitem(ops.SPECS, "fake", spec)
    argv = ["--op", "fake", "--variants", "eager,built", "--shapes", "64", "--device", "cpu", "--rep-ms", "2", "--rounds", "1"]
    assert cli.main([*argv, "--no-capture", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "fake float32 n=64 | built: building: still running after 0 s (a peer's import, or its extension" in err
    assert "fake float32 n=64 | built: building: took" in err


def test_autotune_events_are_collected_and_the_listener_put_back():
    """Triton 3.9 tells a listener what its autotuner did; the first call's closing line says it."""
    import triton

    from compare import runner

    if not hasattr(getattr(triton, "knobs", None), "autotuning") or not hasattr(triton.knobs.autotuning, "listener"):
        pytest.skip("this Triton has no autotuning listener")
    before = triton.knobs.autotuning.listener
    with timing.autotune_events() as events:
        triton.knobs.autotuning.listener(fn=SlowFirstCall, key=(64,), best_config=None, configs_timings={1: 1.0, 2: 2.0},
                                         duration=12.5, cache_hit=False)  # fmt: skip
        triton.knobs.autotuning.listener(fn=SlowFirstCall, key=(128,), best_config=None, configs_timings={1: 1.0},
                                         duration=None, cache_hit=True)  # fmt: skip
    assert triton.knobs.autotuning.listener is before
    assert runner._autotuned(events) == ["autotuned SlowFirstCall over 2 configs in 12.5 s",
                                         "SlowFirstCall: autotune choice read from disk"]  # fmt: skip


def test_the_default_gpu_sweep_runs_the_ops_own_shapes_then_its_real_ones():
    """--shapes takes a set: the op's sweep, its calls in real models (ops/spec.py), or both (the default on a
    GPU; the CPU runs the op's small CPU shapes)."""
    spec = ops.get_spec("softmax")
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    both = cli.default_shapes(spec, cuda)
    assert both[: len(spec.shapes["cuda"])] == spec.shapes["cuda"] and both[len(spec.shapes["cuda"]) :] == spec.shapes["real"]
    assert cli.default_shapes(spec, cuda, "real") == spec.shapes["real"]
    assert cli.default_shapes(spec, cuda, "sweep") == spec.shapes["cuda"]
    assert cli.default_shapes(spec, cpu) == spec.shapes["cpu"]
    assert (4096, 50257) in spec.shapes["real"]  # GPT-2's vocabulary, an odd row length
    every_op_with_real_shapes = [n for n, s in ops.SPECS.items() if s.shapes.get("real")]
    assert {"softmax", "layer_norm", "rms_norm", "cross_entropy", "matmul", "gelu", "swiglu"} <= set(every_op_with_real_shapes)


def test_a_run_without_a_gpu_ends_by_saying_where_the_gpu_figures_are(tmp_path, capsys):
    assert cli.main(["--op", "gelu", "--quick", "--variants", "eager,tk", "--no-capture", "--device", "cpu",
                     "--out", str(tmp_path)]) == 0  # fmt: skip
    err = capsys.readouterr()
    said = (err.out + err.err).strip().splitlines()[-1]
    assert said == cli.GPU_FIGURES and "logs/examples/h100/README.md" in said
    assert (Path(__file__).resolve().parents[2] / "logs/examples/h100/README.md").exists()


def test_a_report_says_what_it_compares_where_the_name_does_not():
    """gelu is F.gelu's default, the erf form; gelu_tanh the approximation: each report says which."""
    from compare import report

    doc = {"op": "gelu", "call": ops.SPECS["gelu"].call, "records": [], "bound": "memory", "settings": {}}
    assert ops.SPECS["gelu"].call.startswith('tk.gelu(x, "none") against F.gelu(x, approximate="none")')
    text = report.terminal_tables({**doc, "settings": {"device": "cpu", "timing_method": "wall clock"}, "limits": {}})
    assert text.splitlines()[0] == f"gelu: {ops.SPECS['gelu'].call}"
    assert 'approximate="tanh"' in ops.SPECS["gelu_tanh"].call
