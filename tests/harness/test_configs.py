"""--configs on the CPU: each configuration of tk's kernel checked, timed (the interpreter's times, labelled so),
tabled and plotted; a configuration that fails is a row and the others go on; an op without configurations is
a usage error naming those with one."""

import dataclasses
import json

import pytest
import torch
import triton

import ops
from compare import cli, schema
from ops.matmul.kernels import CONFIGS
from ops.matmul.launch import run
from ops.matmul.plan import choose_plan, describe
from ops.matmul.spec import config_label, with_config
from ops.runtime import run_direct

FAST = ["--device", "cpu", "--rep-ms", "1", "--rounds", "1", "--quiet", "--no-capture", "--variants", "tk"]
SHAPE = (20, 36, 50)  # one tile of every candidate, cut in M, N and K
PNG = b"\x89PNG\r\n\x1a\n"


def run_configs(root, op="matmul", *argv) -> dict:
    shape = "x".join(map(str, SHAPE))
    assert cli.main(["--op", op, "--configs", "--shapes", shape, "--out", str(root), *FAST, *argv]) == 0
    return json.loads((root / op / "results.json").read_text())


def test_every_candidate_is_checked_and_timed_as_the_interpreters(tmp_path):
    doc = run_configs(tmp_path)
    assert schema.validate(doc) == [] and doc["settings"]["configs"] is True
    found = doc["configs"]
    assert [r["variant"] for r in found] == [config_label(c) for c in CONFIGS]  # the autotuner's, in its order
    tolerance = ops.SPECS["matmul"].tolerance[torch.float32]
    for r in found:
        assert (r["status"], r["kind"], r["shape"], r["dtype"]) == ("ok", "tk", list(SHAPE), "float32"), r["error"]
        assert 0 < r["rel_error"] <= tolerance  # against the float64 answer
        # The interpreter's wall clock: timed, but no throughput, and no configuration is "best" by it.
        assert r["interpreted"] and r["median_ms"] > 0 and r["tflops"] is None and not r["best"]
    assert [r["variant"] for r in doc["records"]] == ["tk"]  # the comparison ran as without the flag
    folder = tmp_path / "matmul"
    md = (folder / "report.md").read_text()
    section = md.split("## Kernel configurations (--configs)")[1]
    assert "Triton's interpreter" in section and "no performance figure" in section
    assert "![configurations](configs.png)" in section
    for r in found:
        assert f"| {r['variant']} " in section
    assert (folder / "configs.png").read_bytes()[:8] == PNG
    assert "Kernel configurations (--configs)" in (folder / "report.html").read_text()


def _with_a_broken_config(a, b):
    """Two of matmul's candidates and one its kernel cannot build: BLOCK_K = 48 is no power of two (as a GPU's
    shared memory refuses a config with too many stages)."""
    plan = choose_plan(describe(a, b))
    broken = triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 48}, num_warps=4, num_stages=2)
    calls = {}
    for config in (CONFIGS[-1], broken, CONFIGS[-2]):
        fixed = with_config(plan, config)
        calls[config_label(config)] = lambda a, b, fixed=fixed: run_direct(run, (fixed, a, b), {})
    return calls


def test_a_configuration_that_fails_is_a_row_and_the_others_go_on(tmp_path, monkeypatch):
    spec = dataclasses.replace(ops.SPECS["matmul"], configs=_with_a_broken_config)
    monkeypatch.setitem(ops.SPECS, "matmul", spec)
    doc = run_configs(tmp_path)
    assert schema.validate(doc) == []
    status = {r["variant"]: r["status"] for r in doc["configs"]}
    assert status == {"32x64x64 w4 s4": "ok", "16x16x48 w4 s2": "failed", "64x64x64 w4 s4": "ok"}
    failed = next(r for r in doc["configs"] if r["status"] == "failed")
    assert failed["error"].startswith("first call:") and failed["median_ms"] is None
    md = (tmp_path / "matmul" / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| 16x16x48 w4 s2 "))
    assert "FAILED" in row and "power of 2" in row  # the kernel's own error, in the configurations table
    assert "`16x16x48 w4 s2` float32 M20xN36xK50: failed: first call" in md
    assert (tmp_path / "matmul" / "configs.png").read_bytes()[:8] == PNG


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--op", "gelu"], "--configs: gelu has no configurable kernel (ops with one: matmul)"),
        (["--op", "gelu,softmax,matmul"], "--configs: gelu, softmax have no configurable kernel"),
        (["--op", "matmul", "--device", "cpu", "--gpus", "2"], "--configs runs in one process: leave out --gpus"),
    ],
)
def test_configs_of_an_op_without_them_is_a_usage_error(tmp_path, capsys, argv, expected):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*argv, "--configs", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # nothing ran
