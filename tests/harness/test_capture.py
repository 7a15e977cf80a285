"""Capture of Inductor's output code beside tk's kernels (CPU end to end, GPU text from fixtures)."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ops
from compare import capture, cli, formats, record, stages
from compare.variants import all_variants, select

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
REPO = Path(__file__).resolve().parents[2]
FAST = ["--device", "cpu", "--rep-ms", "2", "--rounds", "1", "--quiet"]  # CPU on any machine, a GPU one too


def run(root, *argv) -> int:
    return cli.main([*argv, "--out", str(root), *FAST])


# --------------------------------------------------------------------------
# The parser, on real GPU output code (tests/fixtures/gpu/, see its README).
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fixture, name, kind, signature",
    [
        ("pointwise_gelu.py", "triton_poi_fused_gelu_0", "pointwise", "def triton_poi_fused_gelu_0(in_ptr0, out_ptr0, xnumel"),
        ("reduction_softmax.py", "triton_red_fused__softmax_exp_prepare_softmax_online_sub_0", "reduction",
         "def triton_red_fused__softmax_exp_prepare_softmax_online_sub_0(in_ptr0, out_ptr2, xnumel, r0_numel"),
        ("template_matmul.py", "triton_tem_fused_mm_0", "template", "def triton_tem_fused_mm_0(arg_A, arg_B, out_ptr0)"),
        ("triton_op_gelu.py", "gelu_forward_kernel", "hand-written", "def gelu_forward_kernel(x_ptr, y_ptr, n_elements"),
    ],
)  # fmt: skip
def test_parser_on_gpu_output_code(fixture, name, kind, signature):
    code = (FIXTURES / fixture).read_text()
    kernels = capture.parse_kernels(code)
    assert [k.name for k in kernels] == [name]
    k = kernels[0]
    assert k.kind == kind and k.language == "triton"
    assert signature in k.source and "@triton.jit" in k.source
    assert k.source.lstrip().startswith("import triton")  # the kernel's own module, from its first line
    assert "'''" not in k.source and "async_compile" not in k.source  # nothing of the wrapper around it
    assert k.lines == k.source.count("\n") + 1 > 20
    assert capture.extern_calls(code) == []


def test_user_kernel_keeps_its_name_and_unique_variable():
    (k,) = capture.parse_kernels((FIXTURES / "triton_op_gelu.py").read_text())
    assert (k.name, k.var) == ("gelu_forward_kernel", "gelu_forward_kernel_0")
    assert "APPROXIMATE_TANH" in k.source


def test_parser_on_cpu_and_extern_calls():
    code = (
        "cpp_fused_add_0 = async_compile.cpp_pybinding(['const float*', 'float*'], r'''\n"
        '#include <torch/csrc/inductor/cpp_prefix.h>\nextern "C" void kernel(const float* in_ptr0, float* out_ptr0)\n{\n}\n'
        "''')\n\n"
        "def call(args):\n    extern_kernels.mm(arg0_1, arg1_1, out=buf0)\n    extern_kernels.addmm(a, b, c, out=buf1)\n"
    )
    (k,) = capture.parse_kernels(code)
    assert (k.name, k.kind, k.language) == ("cpp_fused_add_0", "cpp", "cpp")
    assert k.source.startswith("#include") and 'extern "C"' in k.source
    assert capture.extern_calls(code) == ["mm", "addmm"]


def test_gpu_fixture_provenance():
    probe = json.loads((FIXTURES / "probe.json").read_text())
    assert probe["gpu"].startswith("NVIDIA") and set(probe["cases"]) == {
        "pointwise_gelu", "reduction_softmax", "template_matmul", "triton_op_gelu"}  # fmt: skip


def test_the_fixture_writer_starts_from_any_folder(tmp_path):
    """tests/fixtures/write_gpu_fixtures.py (what wrote the files above) is a script outside the
    installed packages: it finds this checkout's compare and ops wherever it is started from."""
    script = REPO / "tests" / "fixtures" / "write_gpu_fixtures.py"
    code = (
        "import runpy, sys\n"
        "sys.argv = [sys.argv[1], '--help']\n"
        "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code\n"
        "import compare\nprint('compare from', compare.__file__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert Path(done.stdout.split("compare from ")[-1].strip()).is_relative_to(REPO)
    assert "usage: python tests/fixtures/write_gpu_fixtures.py" in done.stdout


# --------------------------------------------------------------------------
# The artifact handler.
# --------------------------------------------------------------------------


def test_output_code_logs_restores_the_loggers(capsys):
    loggers = capture._artifact_loggers()
    assert loggers
    before = [(lg.level, lg.propagate, list(lg.handlers)) for lg in loggers]
    with capture.output_code_logs() as collector:
        loggers[0].debug("Output code: \n%s", "x = 1\n")
        loggers[0].debug("Output code written to: %s", "/nowhere/m.py")
    assert collector.codes == ["x = 1\n"] and collector.paths == ["/nowhere/m.py"]
    assert [(lg.level, lg.propagate, list(lg.handlers)) for lg in loggers] == before
    assert "Output code" not in capsys.readouterr().err


def test_module_read_from_its_file_when_the_code_is_not_logged(tmp_path):
    module = tmp_path / "cached.py"
    module.write_text("# cached module\n")
    collector = capture._Collector()
    collector.emit(logging.makeLogRecord({"msg": "Output code written to: %s", "args": (str(module),)}))
    assert capture.modules_from(collector) == [("# cached module\n", "cached module file", str(module))]


# --------------------------------------------------------------------------
# End to end on the CPU: every op, warm caches, standalone modules.
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    root = tmp_path_factory.mktemp("logs")
    assert run(root, "--op", "all", "--quick", "--variants", "eager,compile,tk") == 0
    return root


def _kernel_files(op_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(op_dir)): p.read_text() for p in sorted((op_dir / "kernels").rglob("*")) if p.is_file() and p.name != "index.json"}


@pytest.mark.parametrize("op", sorted(ops.SPECS))
def test_capture_every_op_on_cpu(captured, op):
    op_dir = captured / op
    index = json.loads((op_dir / "kernels" / "index.json").read_text())
    spec = ops.SPECS[op]
    shape_label = spec.describe(spec.shapes["cpu"][0])
    # "compile" selects every default-mode compiled variant: of the reference and of each composition.
    assert sorted(e["variant"] for e in index["generated"]) == sorted(v.name for v in select(all_variants(spec), ["compile"]))
    entry = next(e for e in index["generated"] if e["variant"] == "compile")
    (dtype,) = cli.default_dtypes(spec, torch.device("cpu"))  # float32 where the op takes it
    assert (entry["dtype"], entry["shape_label"]) == (str(dtype).replace("torch.", ""), shape_label)
    assert entry["error"] is None and entry["modules"][0]["source"] in ("log", "cached module file")
    folder = op_dir / entry["folder"]
    code = (folder / "output_code.py").read_text()
    assert "def call(" in code and "__main__" in code
    assert entry["kernels"] or entry["extern"]  # a fused C++ kernel, or a library call (mm)
    for k in entry["kernels"]:
        assert k["kind"] == "cpp" and (folder / k["file"]).read_text().startswith("#include")
        assert k["lines"] == (folder / k["file"]).read_text().count("\n") + 1
        assert k["us_per_call"] is not None and k["us_per_call"] > 0  # the profiler's time, matched by name
    # The hand-written side: every @triton.jit of the op's module, on the same page.
    assert index["handwritten"]
    for h in index["handwritten"]:
        src = (op_dir / h["file"]).read_text()
        assert f"def {h['name']}(" in src and ("@triton.jit" in src or "@gluon.jit" in src)
    md = (op_dir / "index.md").read_text()
    for h in index["handwritten"]:
        assert h["name"] in md
    for k in entry["kernels"]:
        assert k["name"] in md and k["file"] in md
    for name in entry["extern"]:
        assert f"extern_kernels.{name}" in md


def test_index_and_report_give_the_same_median_and_label_the_profilers_time(captured):
    """index.md's per-kernel µs come from the profiler's two calls (on a CPU far above a small op's time: 7432
    µs beside a median of 83.6 µs); they are labelled as such, and each kernel's row carries the variant's
    median exactly as report.md gives it."""
    op_dir = captured / "gelu"
    index, md = (op_dir / "index.md").read_text(), (op_dir / "report.md").read_text()
    assert "profiler µs per call" in index and "median (report.md)" in index and "not a timing" in index
    doc = json.loads((op_dir / "results.json").read_text())
    for e in json.loads((op_dir / "kernels" / "index.json").read_text())["generated"]:
        r = next(r for r in doc["records"] if (r["variant"], r["dtype"], r["shape_label"]) == (e["variant"], e["dtype"], e["shape_label"]))
        median = record.marked(formats.fmt_time(r["median_ms"]), r, record.NOISY)
        report_row = next(line for line in md.splitlines() if line.startswith(f"| {e['variant']} "))
        assert f"| {median} " in report_row
        for k in e["kernels"]:
            index_row = next(line for line in index.splitlines() if line.startswith(f"| {k['name']} ") and f"| {e['variant']} " in line)
            assert f"| {median} " in index_row


def test_stored_module_runs_standalone(captured):
    index = json.loads((captured / "gelu" / "kernels" / "index.json").read_text())
    module = captured / "gelu" / index["generated"][0]["folder"] / "output_code.py"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, str(module)], capture_output=True, text=True, timeout=240, env=env, cwd=module.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip()  # Inductor's benchmark prints its time


def test_warm_cache_captures_as_much(captured, tmp_path):
    """The second run of the same sweep (FX graph cache warm) stores the same kernels.  (The stages beside them
    name the process's compiled function, __compiled_fn_<n>_<uuid>: tests/workbench/test_stages.py.)"""
    assert run(tmp_path, "--op", "gelu", "--quick", "--variants", "eager,compile,tk") == 0
    first, second = _kernel_files(captured / "gelu"), _kernel_files(tmp_path / "gelu")
    assert first.keys() == second.keys() and any(name.endswith(".cpp") for name in first)
    stage_files = {file for file, _ in stages.STAGES.values()}
    for name in first:
        if name.endswith((".cpp", ".py")) and "output_code" not in name and Path(name).name not in stage_files:
            assert first[name] == second[name], name


def test_no_capture_flag(tmp_path):
    assert run(tmp_path, "--op", "gelu", "--shapes", "1000", "--variants", "eager,tk", "--no-capture") == 0
    assert not (tmp_path / "gelu" / "kernels").exists() and not (tmp_path / "gelu" / "index.md").exists()


def test_two_concurrent_runs_do_not_mix(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "compare", "--op", "gelu", "--shapes", "1000", "--variants", "eager,tk", "--out", str(tmp_path), *FAST]
    procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err.decode()[-2000:]
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2
    pids = set()
    for run_dir in runs:
        doc = json.loads((run_dir / "gelu" / "results.json").read_text())
        assert doc["complete"] and len(doc["records"]) == 2
        pids.add(run_dir.name.rsplit("-", 1)[1])
    assert len(pids) == 2
    assert (tmp_path / "gelu").resolve().parent in {r.resolve() for r in runs}
    assert (tmp_path / "latest").resolve() in {r.resolve() for r in runs}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
