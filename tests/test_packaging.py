"""A wheel of the project holds everything the package needs at run time, and works installed."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("ops", "compare", "examples")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the sources: a build folder left in the checkout would feed stale files to the wheel."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in PACKAGES:
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    build = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(out), str(source)]
    done = subprocess.run(build, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    (found,) = out.glob("tk-*.whl")
    return found


def test_the_wheel_holds_every_module_and_the_native_source(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in PACKAGES:
        for path in (REPO / package).rglob("*"):
            if path.suffix in (".py", ".cpp") and "__pycache__" not in path.parts:
                assert path.relative_to(REPO).as_posix() in names, f"{path.relative_to(REPO)} is missing from {wheel.name}"


def test_the_installed_wheel_registers_and_runs_the_ops(wheel, tmp_path):
    """Installed outside the source tree (nothing of the checkout on sys.path): import ops, run a kernel."""
    target = tmp_path / "site"
    install = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=300)
    script = (
        "import torch, ops; from compare import cli\n"
        "assert ops.__file__.startswith(%r), ops.__file__\n"
        "x = torch.randn(3, 40)\n"
        "torch.testing.assert_close(torch.ops.tk.softmax(x, -1), torch.softmax(x, -1))\n"
        "print(len(ops.SPECS))\n"
    ) % str(target)
    env = {**os.environ, "PYTHONPATH": str(target)}
    done = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, %r); exec(%r)" % (str(target), script)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) >= 10
