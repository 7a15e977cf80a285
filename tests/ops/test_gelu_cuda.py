"""The CUDA C++ GELU (ops/tour/gelu_cuda.py): a variant of the gelu reports, built where nvcc is.

On any machine: it is one of gelu's and gelu_tanh's variants, and where it cannot
run (no CUDA device, no nvcc, a build that failed) the harness reports it as
skipped, with the reason, and runs the others.  On a GPU with nvcc (marked
`gpu`): its results against float64.
"""

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from reference import DTYPES, assert_close

import ops
from compare import cli
from compare.variants import all_variants
from ops.tour import gelu_cuda

FAST = ["--device", "cpu", "--shapes", "1000", "--rep-ms", "2", "--rounds", "1", "--quiet", "--no-capture"]


@pytest.fixture
def fresh_build():
    """built() keeps its outcome for the process: each test starts without one and leaves none."""
    gelu_cuda.built.cache_clear()
    yield
    gelu_cuda.built.cache_clear()


def _failed_build():
    raise RuntimeError("Error building extension 'tk_gelu_cuda': nvcc fatal : Unsupported gpu architecture")


@pytest.mark.parametrize("op", ["gelu", "gelu_tanh"])
def test_the_cuda_variant_is_in_both_gelu_reports(op):
    spec = ops.SPECS[op]
    kinds = {v.name: v.kind for v in all_variants(spec)}
    assert kinds["cuda"] == "peer" and spec.peer_devices == ("cuda",)
    assert {"eager", "eager-unfused", "compile", "tk"} <= set(kinds)  # the lesson's other rungs


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_a_cuda_device_it_is_unavailable_and_says_so(monkeypatch, fresh_build):
    monkeypatch.setattr(gelu_cuda, "build", lambda: pytest.fail("built without a CUDA device"))
    assert gelu_cuda.missing().startswith("no CUDA device")
    with pytest.raises(ImportError, match="^no CUDA device"):
        gelu_cuda.load("none")


def test_without_nvcc_it_says_where_it_looked(tmp_path):
    assert "CUDA_HOME is not set" in gelu_cuda.nvcc_missing(None)
    assert gelu_cuda.nvcc_missing(str(tmp_path)) == f"no nvcc in CUDA_HOME's bin, {tmp_path / 'bin'}"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").touch()
    assert gelu_cuda.nvcc_missing(str(tmp_path)) is None


def test_a_failed_build_is_unavailable_with_its_error_and_not_retried(monkeypatch, fresh_build):
    calls = []
    monkeypatch.setattr(gelu_cuda, "missing", lambda: None)
    monkeypatch.setattr(gelu_cuda, "build", lambda: calls.append(1) or _failed_build())
    for approximate in ("none", "tanh"):  # one build serves both forms: it is not tried twice
        with pytest.raises(ImportError, match="build failed: RuntimeError: .*Unsupported gpu architecture"):
            gelu_cuda.load(approximate)
    assert calls == [1]


def _run_gelu(tmp_path, variants: str) -> tuple[dict, str]:
    assert cli.main(["--op", "gelu", "--variants", variants, "--out", str(tmp_path), *FAST]) == 0
    doc = json.loads((tmp_path / "gelu" / "results.json").read_text())
    return {r["variant"]: r for r in doc["records"]}, (tmp_path / "gelu" / "report.md").read_text()


def test_on_the_cpu_the_report_skips_it_and_runs_the_others(tmp_path, capsys):
    by, md = _run_gelu(tmp_path, "eager,eager-unfused,tk,cuda")
    assert by["cuda"]["status"] == "skipped" and by["cuda"]["error"] == "runs on cuda only, not on cpu"
    assert all(by[name]["status"] == "ok" for name in ("eager", "eager-unfused", "tk"))
    assert "peer `cuda` skipped: runs on cuda only, not on cpu" in md
    capsys.readouterr()
    loud = [a for a in FAST if a != "--quiet"]
    assert cli.main(["--op", "gelu", "--variants", "cuda,tk", "--out", str(tmp_path / "loud"), *loud]) == 0
    terminal = capsys.readouterr()
    assert "cuda: skipped, runs on cuda only, not on cpu" in terminal.out + terminal.err  # not left at "building"


@pytest.mark.parametrize("cause", ["no CUDA device", "the CUDA GELU's build failed"])
def test_where_it_cannot_be_built_the_report_says_why_and_runs_the_others(tmp_path, monkeypatch, fresh_build, cause):
    # Let the variant past the harness's device check, so that its loader decides on this CPU.
    monkeypatch.setitem(ops.SPECS, "gelu", dataclasses.replace(ops.SPECS["gelu"], peer_devices=("cpu", "cuda")))
    monkeypatch.setattr(gelu_cuda, "missing", lambda: "no CUDA device" if cause == "no CUDA device" else None)
    monkeypatch.setattr(gelu_cuda, "build", _failed_build)
    by, md = _run_gelu(tmp_path, "eager,tk,cuda")
    cuda = by["cuda"]
    assert cuda["status"] == "skipped" and cuda["error"].startswith(f"unavailable ({cause}")
    assert by["eager"]["status"] == by["tk"]["status"] == "ok"
    assert f"peer `cuda` skipped: {cuda['error']}" in md


# ------------------------------------------------------------- on a GPU with nvcc


@pytest.fixture(scope="module")
def cuda_gelu():
    """Both forms, built once for the module; skipped where the machine lacks what the build needs."""
    lacking = gelu_cuda.missing()
    if lacking is not None:
        pytest.skip(f"the CUDA GELU cannot be built here: {lacking}")
    return {approximate: gelu_cuda.load(approximate) for approximate in ("none", "tanh")}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_cuda_gelu_matches_float64(cuda_gelu, dtype, approximate):
    for n in (1, 1000, 1000003):  # odd sizes: the last block hangs past the end
        x = 3 * torch.randn(n, device="cuda", dtype=dtype)
        y = cuda_gelu[approximate](x)
        assert y.shape == x.shape
        assert_close(y, F.gelu(x.double(), approximate=approximate), dtype)


@pytest.mark.gpu
def test_cuda_gelu_of_an_empty_tensor_and_of_a_strided_view(cuda_gelu):
    empty = torch.empty(0, 7, device="cuda", dtype=torch.bfloat16)
    assert cuda_gelu["none"](empty).shape == (0, 7)
    x = torch.randn(64, 33, device="cuda").t()  # read through .contiguous(): values, not memory order
    assert_close(cuda_gelu["tanh"](x), F.gelu(x.double(), approximate="tanh"), torch.float32)


@pytest.mark.gpu
@pytest.mark.big_memory
def test_cuda_gelu_past_2_to_the_31_elements(cuda_gelu):
    """int64 indices: as an int the index of the elements past 2**31 turns negative."""
    n = (1 << 31) + 4099
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = cuda_gelu["none"](x)
    for start in [0, (1 << 31) - 2048, n - (1 << 20)]:  # before, across and after the 2**31 boundary
        window = slice(start, start + (1 << 20))
        assert_close(y[window], F.gelu(x[window].double()), torch.bfloat16)


def test_a_failed_builds_reason_is_its_error_not_the_command_line():
    """cpp_extension's message opens with nvcc's whole command line; the report keeps the lines that say why."""
    message = (
        "Error building extension 'tk_gelu_cuda': [1/3] /usr/local/cuda/bin/nvcc -DTORCH_EXTENSION_NAME=x "
        + "-isystem /very/long/include/path " * 40
        + "\nFAILED: gelu_cuda.cuda.o\n/tmp/gelu_cuda.cu:3:10: fatal error: c10/cuda/impl/cuda_cmake_macros.h: "
        "No such file or directory\nninja: build stopped: subcommand failed."
    )
    gist = gelu_cuda._gist(message)
    assert "fatal error: c10/cuda/impl/cuda_cmake_macros.h" in gist and "FAILED: gelu_cuda.cuda.o" in gist
    assert "-isystem" not in gist and len(gist) <= 600
