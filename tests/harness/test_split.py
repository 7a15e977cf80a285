"""A sweep spread over worker processes (``--gpus N``, compare/split.py), proved on the CPU: two workers.

Each worker is a process of its own (started from this checkout whatever the current folder); the cases
go to whichever is free, and the parent writes one run folder and one summary, the same files a run in
one process writes.  The GPU run is in test_compare_gpu.py.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import ops
from compare import cli, environment, split
from ops.spec import OpSpec

REPO = Path(__file__).resolve().parents[2]
FAST = ["--device", "cpu", "--rep-ms", "2", "--rounds", "1", "--quiet", "--no-capture"]
THREE_OPS = ["--op", "gelu,square,copy", "--quick", "--variants", "eager,unfused,tk"]  # 3 cases for 2 workers


def report(root: Path, op: str) -> dict:
    return json.loads((root / op / "results.json").read_text())


def files(op_dir: Path) -> set[str]:
    return {str(p.relative_to(op_dir)) for p in op_dir.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def one_and_two(tmp_path_factory):
    """The same sweep in one process and over two workers."""
    one, two = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("two")
    assert cli.main([*THREE_OPS, "--out", str(one), *FAST]) == 0
    assert cli.main([*THREE_OPS, "--out", str(two), "--gpus", "2", *FAST]) == 0
    return one, two


def test_two_workers_write_what_one_process_writes(one_and_two):
    one, two = one_and_two
    assert (two / "latest" / "summary.md").is_file()
    for op in ("gelu", "square", "copy"):
        assert files(one / op) == files(two / op) and (two / op).resolve().parent == (two / "latest").resolve()
        a, b = report(one, op), report(two, op)
        assert a.keys() == b.keys() and a["complete"] is b["complete"] is True
        key = lambda r: (r["dtype"], r["shape"], r["variant"], r["status"], r["kernels"])  # noqa: E731
        assert [key(r) for r in a["records"]] == [key(r) for r in b["records"]]  # the same rows, in sweep order
        assert all(r["worker"] is None for r in a["records"]) and b["settings"]["workers"] == 2
    workers = {r["worker"] for op in ("gelu", "square", "copy") for r in report(two, op)["records"]}
    assert workers == {0, 1}  # both took cases
    pinned = report(two, "gelu")["environment"]["workers"]
    assert [w["CUDA_VISIBLE_DEVICES"] for w in pinned] == ["0", "1"]
    for w in pinned:  # NVLink multicast off in every worker
        assert (w["NCCL_NVLS_ENABLE"], w["TORCH_SYMM_MEM_DISABLE_MULTICAST"], w["NVSHMEM_DISABLE_NVLS"]) == ("0", "1", "1")
    if hasattr(os, "sched_getaffinity"):  # each worker ran on its own block of this process's cores
        assert [w["cpu_cores"] for w in pinned] == split.core_blocks(2)
    page = (two / "latest" / "summary.md").read_text()
    assert "3 ops from 3 reports" in page and "## The worst case of each op and dtype" in page


SCRIPT = """
import sys
sys.path[:0] = [{repo!r}, {tests!r}]
import ops
from test_split import dying_spec
ops.SPECS["dying"] = dying_spec()
from compare import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def _inputs(shape, dtype, device):
    if shape[0] == 77:
        os._exit(3)  # the worker process dies, as one does on a crash
    if shape[0] == 99:  # a case that runs until the run is stopped
        Path(os.environ["TK_TEST_MARKER"]).write_text("running")
        time.sleep(300)
    return (torch.linspace(-3, 3, shape[0], dtype=dtype, device=device),)


def dying_spec():
    return OpSpec(
        name="dying", tk=torch.sigmoid, reference=torch.sigmoid, make_inputs=_inputs,
        bytes_moved=lambda shape, dtype: 8 * shape[0], flops=lambda shape, dtype: 4 * shape[0],
        tolerance={torch.float32: 1e-5}, shapes={"cpu": [(64,)], "cuda": [(64,)]},
        describe=lambda shape: f"n={shape[0]}", dtypes=(torch.float32,),
    )  # fmt: skip


def test_a_worker_that_dies_loses_its_case_only(tmp_path, monkeypatch, capsys):
    """The case it was running is reported failed, with the worker's exit status; a fresh worker takes the GPU
    and the other cases run; the op's report is written but not linked, and the run exits 1."""
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT.format(repo=str(REPO), tests=str(Path(__file__).resolve().parent)))
    monkeypatch.setattr(split, "worker_command", lambda: [sys.executable, str(script)])
    monkeypatch.setitem(ops.SPECS, "dying", dying_spec())
    argv = ["--op", "dying", "--shapes", "64,77,128,256", "--variants", "eager,tk", "--gpus", "2"]
    assert cli.main([*argv, "--out", str(tmp_path / "logs"), *FAST]) == 1
    err = capsys.readouterr().err
    (run_dir,) = (tmp_path / "logs" / "runs").iterdir()
    doc = report(run_dir, "dying")
    by = {(r["shape"][0], r["variant"]): r for r in doc["records"]}
    assert [r["shape"][0] for r in doc["records"]] == [64, 64, 77, 77, 128, 128, 256, 256]  # sweep order
    lost = by[77, "tk"]
    assert lost["status"] == "failed" and lost["error"].startswith("worker: worker ")
    assert "exited with code 3 while running this case, which was not run again" in lost["error"]
    assert all(by[n, v]["status"] == "ok" for n in (64, 128, 256) for v in ("eager", "tk"))
    assert "1 case(s) of dying were lost with a worker (dying float32 n=77)" in err
    assert not (tmp_path / "logs" / "dying").exists() and not (tmp_path / "logs" / "latest").exists()
    assert "Traceback" not in err


def test_an_interrupted_split_sweep_keeps_whole_pages_of_what_came_back(tmp_path, monkeypatch, capsys):
    """SIGTERM (a job's time limit) to the parent while a worker is busy: the workers stop, the op's pages are
    written whole for the cases that came back (marked incomplete), no link moves, exit 130."""
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT.format(repo=str(REPO), tests=str(Path(__file__).resolve().parent)))
    marker = tmp_path / "running"
    monkeypatch.setenv("TK_TEST_MARKER", str(marker))
    monkeypatch.setattr(split, "worker_command", lambda: [sys.executable, str(script)])
    monkeypatch.setitem(ops.SPECS, "dying", dying_spec())

    def stop_when_busy():
        while not marker.exists():
            time.sleep(0.1)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_when_busy, daemon=True).start()
    argv = ["--op", "dying", "--shapes", "64,128,99", "--variants", "eager,tk", "--gpus", "2"]
    assert cli.main([*argv, "--out", str(tmp_path / "logs"), *FAST]) == 130
    (run_dir,) = (tmp_path / "logs" / "runs").iterdir()
    doc = report(run_dir, "dying")
    assert doc["complete"] is False and sorted(r["shape"][0] for r in doc["records"]) == [64, 64, 128, 128]
    assert files(run_dir / "dying") == {"results.json", "results.csv", "throughput.png", "report.md", "report.html"}
    assert "Incomplete" in (run_dir / "dying" / "report.md").read_text()
    assert f"interrupted: partial report in {run_dir}" in capsys.readouterr().err
    assert not (tmp_path / "logs" / "dying").exists() and not (tmp_path / "logs" / "latest").exists()


def test_core_blocks_split_the_cores_without_overlap():
    alone = lambda cpu: {cpu}  # noqa: E731 - no hyperthreads
    assert split.core_blocks(2, range(32), alone) == [list(range(16)), list(range(16, 32))]
    assert split.core_blocks(3, [7, 1, 3, 5, 9], alone) == [[1], [3, 5], [7, 9]]  # sorted, contiguous, even
    assert split.core_blocks(4, [2, 6], alone) == [[2], [6], [2], [6]]  # fewer cores than workers: shared in turn
    blocks = split.core_blocks(8, range(30), alone)
    assert sorted(c for b in blocks for c in b) == list(range(30)) and {len(b) for b in blocks} == {3, 4}


def test_a_cores_hyperthreads_go_to_one_worker():
    """Linux numbers a core's second thread apart (CPUs 0-3 the cores, 4-7 their twins): each worker gets
    whole cores, both threads, never the twin of another worker's CPU."""
    twins = lambda cpu: {cpu % 4, cpu % 4 + 4}  # noqa: E731
    assert split.core_blocks(2, range(8), twins) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert split.core_blocks(2, [0, 1, 2, 3], twins) == [[0, 1], [2, 3]]  # twins outside the affinity are not taken
    assert split._twins(10**6) == {10**6}  # no such CPU in sysfs: itself


def test_gpus_setting():
    cpu = torch.device("cpu")
    assert cli.parse_gpus("3", cpu) == ["0", "1", "2"] and cli.parse_gpus("1", cpu) == ["0"]
    for bad, why in (("0", "at least 1"), ("two", "a number of GPUs, or all"), ("all", "needs CUDA devices")):
        with pytest.raises(cli.UsageError, match=why):
            cli.parse_gpus(bad, cpu)
    # nvidia-smi ignores CUDA_VISIBLE_DEVICES: a worker pinned to GPU 3 reads GPU 3's clock, not GPU 0's.
    assert environment.smi_id("3", 0) == "3" and environment.smi_id("2,3", 1) == "3"
    assert environment.smi_id(None, 0) == "0" and environment.smi_id("GPU-8a1b", 0) == "GPU-8a1b"


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_bench_passes_gpus():
    done = subprocess.run(["make", "-n", "-C", str(REPO), "USE_SYSTEM=1", "bench", "GPUS=4"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "-m compare --op all --out logs --gpus 4" in done.stdout
