"""The harness under the faults users hit: each gives a clear message, the other
variants still report, and no earlier report or capture is touched.

Every test starts from a copy of one earlier, complete run (with its captured
output code) and checks, after the faulty run, that each of its files has the
same bytes and that ``logs/<op>`` and ``logs/latest`` still name it unless the
new run completed.  The faulty variants belong to a small spec built here
(``fault_spec``), never to ``ops/``.

Covered elsewhere, and listed in docs/reliability.md: a variant that raises,
a peer that is not installed and Ctrl-C inside a sweep
(tests/test_compare.py), two runs at once into one folder
(tests/test_capture.py).
"""

import errno
import hashlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import ops
from compare import cli, report
from ops.spec import OpSpec

REPO = Path(__file__).resolve().parents[2]
FAST = ["--rep-ms", "2", "--rounds", "1", "--dtypes", "float32"]
OP = "faulty"


def _inputs(shape, dtype, device):
    return (torch.linspace(-3, 3, shape[0], dtype=dtype, device=device),)


def _sigmoid(x):
    return torch.sigmoid(x)


def fault_spec(unfused=None, peers=None, name=OP, shapes=((64,), (128,))):
    """sigmoid, compared with the compositions and peers a test hands it.  (tk is a
    function of this module: the capture looks for hand-written kernels in tk's module.)"""
    return OpSpec(
        name=name,
        tk=_sigmoid,
        reference=torch.sigmoid,
        make_inputs=_inputs,
        bytes_moved=lambda shape, dtype: 8 * shape[0],
        flops=lambda shape, dtype: 4 * shape[0],
        tolerance={torch.float32: 1e-5},
        shapes={"cpu": list(shapes), "cuda": list(shapes)},
        describe=lambda shape: f"n={shape[0]}",
        dtypes=(torch.float32,),
        unfused=unfused or {},
        peers=peers or {},
        peer_devices=("cpu", "cuda"),
    )


def run(root, *argv, quiet=True, capture=False, device="cpu") -> int:
    """One harness run; on the CPU unless asked (the faults are the harness's, not the device's)."""
    flags = [*FAST, "--device", device, *(["--quiet"] if quiet else []), *([] if capture else ["--no-capture"])]
    return cli.main([*argv, "--out", str(root), *flags])


def records(root_or_dir: Path, **match) -> dict:
    doc = json.loads((root_or_dir / "results.json").read_text())
    return {(r["variant"], r["shape"][0]): r for r in doc["records"] if all(r[k] == v for k, v in match.items())}


# ---------------------------------------------------------------------------
# The earlier run, and what must survive of it.
# ---------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, str]:
    """Every file's hash and every link's target under ``root`` (links not followed)."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "-> " + os.readlink(path)
            elif path.is_file():
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def earlier(tmp_path_factory):
    """One complete run of the fault spec, with its capture (torch.compile of sigmoid)."""
    root = tmp_path_factory.mktemp("earlier") / "logs"
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(ops.SPECS, OP, fault_spec())
        assert run(root, "--op", OP, "--variants", "eager,compile,tk", "--shapes", "64", capture=True) == 0
    files = snapshot(root)
    assert any(k.endswith("kernels/index.json") for k in files) and any(k.endswith("output_code.py") for k in files)
    return root


class Logs:
    """A copy of the earlier run to break things in."""

    def __init__(self, root: Path):
        self.root = root
        self.before = snapshot(root)
        self.runs_before = set(os.listdir(root / "runs"))

    def new_runs(self) -> list[Path]:
        return [self.root / "runs" / r for r in sorted(set(os.listdir(self.root / "runs")) - self.runs_before)]

    def assert_earlier_intact(self, links_moved=()):
        """Every earlier file as it was; the links as they were (except `links_moved`); no stray temporary file."""
        after = snapshot(self.root)
        for rel, digest in self.before.items():
            if rel in links_moved:
                continue
            assert after.get(rel) == digest, f"{rel} changed: {digest} -> {after.get(rel)}"
        earlier_runs = {rel.split("/")[1] for rel in self.before if rel.startswith("runs/") and rel.count("/") >= 1}
        for rel in after:
            if rel.startswith("runs/") and rel.split("/")[1] in earlier_runs:
                assert rel in self.before, f"{rel} appeared inside the earlier run"
        stray = [rel for rel in after if Path(rel).name.endswith(".tmp")]
        assert not stray, f"temporary files left: {stray}"
        if links_moved:  # a complete run: its links name it now
            (new_run,) = self.new_runs()
            for link in links_moved:
                assert (self.root / link).resolve().is_relative_to(new_run.resolve()), link


@pytest.fixture
def logs(earlier, tmp_path):
    root = tmp_path / "logs"
    shutil.copytree(earlier, root, symlinks=True)  # relative links: still valid in the copy
    return Logs(root)


@pytest.fixture
def spec(monkeypatch):
    """Install a fault spec: spec(unfused=..., peers=...)."""

    def install(**kwargs):
        made = fault_spec(**kwargs)
        monkeypatch.setitem(ops.SPECS, made.name, made)
        return made

    return install


# ---------------------------------------------------------------------------
# Variants that misbehave: a row each, the others unaffected.
# ---------------------------------------------------------------------------


def test_variant_returning_the_wrong_shape_or_count(logs, spec):
    spec(unfused={
        "eager-short": lambda x: torch.sigmoid(x)[:-1],
        "eager-none": lambda x: None,
        "eager-pair": lambda x: (torch.sigmoid(x), x),
    })  # fmt: skip
    assert run(logs.root, "--op", OP, "--variants", "eager,unfused,tk", "--shapes", "64") == 0
    by = records(logs.root / OP)
    assert by["eager-short", 64]["status"] == "failed"
    assert by["eager-short", 64]["error"] == "check: ValueError: output shape (63,) differs from the reference's (64,)"
    assert by["eager-none", 64]["error"] == "check: ValueError: returned 0 tensor(s), the reference 1"
    assert by["eager-pair", 64]["error"] == "check: ValueError: returned 2 tensor(s), the reference 1"
    assert by["eager", 64]["status"] == by["tk", 64]["status"] == "ok"
    assert "`eager-short` float32 n=64: failed: check: ValueError: output shape" in (logs.root / OP / "report.md").read_text()
    logs.assert_earlier_intact(links_moved={OP, "latest"})  # a complete run: the links move on


def _oom_at(n):
    def variant(x):
        if x.numel() == n:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 GiB (simulated)")
        return torch.sigmoid(x)

    return variant


def test_variant_out_of_memory_at_the_largest_size(logs, spec):
    spec(unfused={"eager-hungry": _oom_at(128)})
    assert run(logs.root, "--op", OP, "--variants", "eager,unfused,tk", "--shapes", "64,128") == 0
    by = records(logs.root / OP)
    assert by["eager-hungry", 64]["status"] == "ok"
    hungry = by["eager-hungry", 128]
    assert hungry["status"] == "failed" and hungry["median_ms"] is None
    assert hungry["error"].startswith("first call: OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 GiB")
    assert all(by[v, 128]["status"] == "ok" and by[v, 128]["median_ms"] > 0 for v in ("eager", "tk"))
    logs.assert_earlier_intact(links_moved={OP, "latest"})


@pytest.mark.gpu
def test_variant_really_out_of_gpu_memory_at_the_largest_size(tmp_path, spec):
    """A composition that materializes 8192 copies of its input: 128 MB at n=4096,
    512 GiB at n=2**24, more than any GPU has.  The allocator's real error becomes
    the row; the memory is given back; the other variants run at that size."""

    def hungry(x):
        return torch.sigmoid(x.unsqueeze(0).expand(8192, -1).contiguous())[0]

    spec(unfused={"eager-hungry": hungry}, shapes=((4096,), (1 << 24,)))
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    assert run(tmp_path, "--op", OP, "--variants", "eager,unfused,tk", "--shapes", f"4096,{1 << 24}", device="cuda") == 0
    by = records(tmp_path / OP)
    assert by["eager-hungry", 4096]["status"] == "ok"
    big = by["eager-hungry", 1 << 24]
    assert big["status"] == "failed" and "OutOfMemoryError" in big["error"] and "Tried to allocate" in big["error"]
    assert by["eager", 1 << 24]["status"] == by["tk", 1 << 24]["status"] == "ok"
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= before + (64 << 20)  # nothing of the failed attempt is held


@pytest.mark.gpu
def test_variant_that_cannot_be_captured_in_a_cuda_graph(tmp_path, spec):
    """A variant that reads a value back to the host (.item()) cannot be captured
    in a CUDA graph: its graph cell stays empty, while its median and the other
    variants' graph times stand."""

    def host_sync(x):
        scale = x.abs().max().item()  # a device-to-host copy: graph capture refuses it
        return torch.sigmoid(x * scale) if scale == 1 else torch.sigmoid(x)

    spec(unfused={"eager-sync": host_sync}, shapes=((4096,),))
    assert run(tmp_path, "--op", OP, "--variants", "eager,unfused,tk", "--shapes", "4096", device="cuda") == 0
    by = records(tmp_path / OP)
    sync = by["eager-sync", 4096]
    assert sync["status"] == "ok" and sync["median_ms"] > 0 and sync["cudagraph_ms"] is None
    assert by["eager", 4096]["cudagraph_ms"] > 0 and by["tk", 4096]["cudagraph_ms"] > 0
    table = [line.split("|")[1:-1] for line in (tmp_path / OP / "report.md").read_text().splitlines()
             if line.startswith("| variant") or line.startswith("| eager")]  # fmt: skip
    column = [cell.strip() for cell in table[0]].index("CUDA graph (vs eager)")
    cells = {row[0].strip().rstrip(" *"): row[column].strip() for row in table[1:]}
    # eager's cell is its graph time against itself, marked "~" where its timed calls spread (other tests
    # running beside it on the GPU spread a 2-µs replay)
    assert cells["eager-sync"] == "" and re.fullmatch(r"\S+ [nµm]?s( ~)? \(1\.00x( ~)?\)", cells["eager"]), cells


def test_compile_that_fails(logs, spec, monkeypatch):
    """Inductor crashing inside torch.compile: the compiled variants fail with
    Dynamo's message, the eager ones and tk report, the capture index is written."""
    import torch._inductor.compile_fx as compile_fx

    def crash(*args, **kwargs):
        raise RuntimeError("inductor crashed (simulated)")

    spec()
    monkeypatch.setattr(compile_fx, "compile_fx", crash)
    assert run(logs.root, "--op", OP, "--variants", "eager,compile,tk", "--shapes", "64", capture=True) == 0
    by = records(logs.root / OP)
    failed = by["compile", 64]
    assert failed["status"] == "failed" and failed["error"].startswith("first call: BackendCompilerFailed")
    assert "inductor crashed (simulated)" in failed["error"]
    assert by["eager", 64]["status"] == by["tk", 64]["status"] == "ok"
    # The capture index is still written; it claims no kernels for the failed compile.
    index = json.loads((logs.root / OP / "kernels" / "index.json").read_text())
    assert all(e["error"] and not e["kernels"] for e in index["generated"] if e["variant"] == "compile")
    logs.assert_earlier_intact(links_moved={OP, "latest"})


def test_peer_library_broken_or_missing(logs, spec):
    """Not installed: skipped.  Installed but broken (a missing shared library, an
    incompatible version): a failed row saying so."""

    def missing():
        raise ImportError("No module named 'peerlib'")

    def broken():
        raise OSError("libpeer.so.2: cannot open shared object file: No such file or directory")

    def too_old():
        raise AttributeError("module 'peerlib' has no attribute 'fused_sigmoid'")

    spec(peers={"missing": missing, "broken": broken, "too-old": too_old})
    assert run(logs.root, "--op", OP, "--variants", "eager,tk,peer", "--shapes", "64") == 0
    by = records(logs.root / OP)
    assert by["missing", 64]["status"] == "skipped" and "peerlib" in by["missing", 64]["error"]
    assert by["broken", 64]["status"] == "failed"
    assert by["broken", 64]["error"] == "build: OSError: libpeer.so.2: cannot open shared object file: No such file or directory"
    assert by["too-old", 64]["error"].startswith("build: AttributeError: module 'peerlib' has no attribute")
    assert by["eager", 64]["status"] == by["tk", 64]["status"] == "ok"


def test_variant_that_writes_into_its_input(logs, spec):
    """A variant that changes its input in place fails; the variants after it get
    the original input back (before, tk was then measured on 2x and came out wrong)."""
    spec(unfused={"eager-in-place": lambda x: torch.sigmoid(x.mul_(2))})
    assert run(logs.root, "--op", OP, "--variants", "eager,unfused,tk", "--shapes", "64,128") == 0
    by = records(logs.root / OP)
    for n in (64, 128):
        assert by["eager-in-place", n]["status"] == "failed"
        assert by["eager-in-place", n]["error"] == "check: the variant changed its inputs in place (restored for the other variants)"
        assert by["tk", n]["status"] == "ok" and by["tk", n]["rel_error"] < 1e-6


# ---------------------------------------------------------------------------
# The disk: read-only, full, links that cannot be updated.
# ---------------------------------------------------------------------------


def _under(path, root: Path) -> bool:
    return str(path).startswith(str(root))


def test_read_only_logs_folder(logs, spec, monkeypatch, capsys):
    """Nothing can be created under logs/: a one-line error before anything runs."""
    spec()
    real_mkdir = os.mkdir

    def read_only(path, *args, **kwargs):
        if _under(path, logs.root):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", read_only)
    assert run(logs.root, "--op", OP, "--variants", "eager,tk", "--shapes", "64") == 1
    err = capsys.readouterr().err
    assert f"error: cannot create a run folder under {logs.root}/: [Errno 30] Read-only file system" in err
    assert "Traceback" not in err
    assert not logs.new_runs()
    logs.assert_earlier_intact()


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_logs_folder_for_real(logs, spec, capsys):
    spec()
    (logs.root / "runs").chmod(0o555)
    try:
        assert run(logs.root, "--op", OP, "--variants", "eager,tk", "--shapes", "64") == 1
    finally:
        (logs.root / "runs").chmod(0o755)
    assert "error: cannot create a run folder under" in capsys.readouterr().err
    assert not logs.new_runs()
    logs.assert_earlier_intact()


def _disk_full(monkeypatch, full: Callable):
    """Writes of report files for which full(path) raise ENOSPC, as a full disk does."""
    real_write_text, real_open = pathlib.Path.write_text, open

    def error(path):
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    def write_text(self, *args, **kwargs):
        if full(self):
            raise error(self)
        return real_write_text(self, *args, **kwargs)

    def open_(file, mode="r", *args, **kwargs):
        if any(m in mode for m in "wax") and full(file):
            raise error(file)
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", write_text)
    monkeypatch.setattr(report, "open", open_, raising=False)  # write_csv's open


def test_disk_full_while_writing_the_report(logs, spec, monkeypatch, capsys):
    """The disk fills during the run: the sweep finishes, its tables reach the
    terminal, the error says what was not written, the earlier report stays
    the current one.  Another op whose report fits is written and linked."""
    spec()
    monkeypatch.setitem(ops.SPECS, "fits", fault_spec(name="fits"))
    _disk_full(monkeypatch, lambda path: f"/{OP}/" in str(path) and _under(path, logs.root))
    assert run(logs.root, "--op", f"{OP},fits", "--variants", "eager,tk", quiet=False) == 1
    err = capsys.readouterr().err
    assert f"warning: partial results not saved: [Errno 28] No space left on device: '{logs.root}" in err
    assert f"error: the report of {OP} could not be written to" in err and "[Errno 28] No space left on device" in err
    assert f"{logs.root / OP} still names the previous report" in err
    assert f"error: not written: {OP}; {logs.root}/latest is unchanged" in err
    assert "Traceback" not in err
    # The results reached the terminal: the table of every variant.
    table = err.split(f"{OP} | float32 | n=64")[1]
    assert "\neager " in table and "\ntk " in table
    (new_run,) = logs.new_runs()
    assert not (new_run / OP / "results.json").exists()
    assert records(logs.root / "fits")["tk", 64]["status"] == "ok"  # the other op was written...
    assert (logs.root / "fits").resolve().parent == new_run.resolve()  # ...and linked
    logs.assert_earlier_intact()


def test_summary_that_cannot_be_written(logs, spec, monkeypatch, capsys):
    """A run of several ops whose summary.md cannot be written: an error names
    it, and the op reports are still written and linked (the page is extra)."""
    spec()
    monkeypatch.setitem(ops.SPECS, "fits", fault_spec(name="fits"))
    real_write_text = Path.write_text

    def write_text(self, *args, **kwargs):
        if self.name == "summary.md":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    assert run(logs.root, "--op", f"{OP},fits", "--variants", "eager,tk") == 0
    err = capsys.readouterr().err
    assert "error: cannot write " in err and "summary.md: [Errno 28] No space left on device" in err
    (new_run,) = logs.new_runs()
    assert not (new_run / "summary.md").exists()
    for op in (OP, "fits"):
        assert records(logs.root / op)["tk", 64]["status"] == "ok"
        assert (logs.root / op).resolve().parent == new_run.resolve()
    assert (logs.root / "latest").resolve() == new_run.resolve()


def test_link_that_cannot_be_updated(logs, spec, monkeypatch, capsys):
    """The report is written but logs/<op> cannot be repointed: an error, the old
    link intact, no stray temporary link."""
    spec()
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        if Path(dst).name in (OP, "latest") and _under(dst, logs.root):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(dst))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    assert run(logs.root, "--op", OP, "--variants", "eager,tk", "--shapes", "64") == 1
    err = capsys.readouterr().err
    assert f"error: cannot point {logs.root / OP} at" in err and "[Errno 13] Permission denied" in err
    (new_run,) = logs.new_runs()
    assert records(new_run / OP)["tk", 64]["status"] == "ok"  # the report itself is there
    logs.assert_earlier_intact()


# ---------------------------------------------------------------------------
# Interrupted by a signal: Ctrl-C (SIGINT) and a job's time limit (SIGTERM).
# ---------------------------------------------------------------------------

SCRIPT = """
import pathlib, signal, sys, time
sys.path[:0] = [{repo!r}, {tests!r}]
signal.signal(signal.SIGINT, signal.default_int_handler)  # even if the parent ignores Ctrl-C
import torch, ops
from compare import cli
from test_harness_faults import fault_spec

marker = pathlib.Path(sys.argv[1])

def slow(x):
    if x.numel() == 128:  # the second shape: the first one's records are already saved
        marker.write_text("running")
        time.sleep(300)
    return torch.sigmoid(x)

ops.SPECS["{op}"] = fault_spec(unfused={{"eager-slow": slow}})
sys.exit(cli.main(sys.argv[2:]))
"""


def test_interrupted_by_a_signal(earlier, tmp_path):
    """Both signals, in two processes at once: exit code 130, the partial report in
    the run's own folder, the links and every earlier file untouched."""
    script = tmp_path / "slow_run.py"
    script.write_text(SCRIPT.format(repo=str(REPO), tests=str(Path(__file__).resolve().parent), op=OP))
    started = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        root = tmp_path / sig.name / "logs"
        shutil.copytree(earlier, root, symlinks=True)
        logs, marker = Logs(root), tmp_path / f"{sig.name}.running"
        argv = [sys.executable, str(script), str(marker), "--op", OP, "--variants", "eager,unfused,tk",
                "--shapes", "64,128", "--out", str(root), "--device", "cpu", "--no-capture", "--quiet", *FAST]  # fmt: skip
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        started[sig] = (proc, logs, marker)
    for sig, (proc, logs, marker) in started.items():
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the run never reached its second shape"
            time.sleep(0.2)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err[-3000:]
        assert f"interrupted: partial report in {logs.root}/runs/" in err
        (new_run,) = logs.new_runs()
        partial = json.loads((new_run / OP / "results.json").read_text())
        assert partial["complete"] is False
        assert sorted((r["variant"], r["shape"][0]) for r in partial["records"]) == [
            ("eager", 64), ("eager-slow", 64), ("tk", 64)]  # fmt: skip
        assert "Incomplete" in (new_run / OP / "report.md").read_text()
        logs.assert_earlier_intact()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_while_the_pages_are_written_waits_for_them(logs, spec, monkeypatch, capsys, sig):
    """Ctrl-C (or a job's time limit) while the last pages are written: every page is written whole, with
    ``complete: true`` when every case ran; then the run stops (130) without moving a link, and says so."""
    from compare import plot

    spec()
    draw = plot.throughput

    def interrupted_while_drawing(doc, path):
        os.kill(os.getpid(), sig)  # the signal arrives while the plot is drawn
        return draw(doc, path)

    monkeypatch.setattr(plot, "throughput", interrupted_while_drawing)
    assert run(logs.root, "--op", OP, "--variants", "eager,tk", "--shapes", "64,128") == 130
    (new_run,) = logs.new_runs()
    doc = json.loads((new_run / OP / "results.json").read_text())
    assert doc["complete"] is True and len(doc["records"]) == 4
    for name in ("results.csv", "throughput.png", "report.md", "report.html"):
        assert (new_run / OP / name).is_file(), name
    assert "Incomplete" not in (new_run / OP / "report.md").read_text()
    err = capsys.readouterr().err
    assert f"interrupted: the report of {OP} in {new_run / OP} is complete (every case ran)" in err
    assert "latest and the op links are unchanged" in err
    logs.assert_earlier_intact()
