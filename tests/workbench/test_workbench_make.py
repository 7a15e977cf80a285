"""make ir and make profile: the command each plans (make -n), and TOOL checked before anything runs."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-n", "-C", str(REPO), "USE_SYSTEM=1", *args], capture_output=True, text=True)


def test_make_ir():
    done = make("ir", "OP=softmax", "DTYPES=bf16", "SHAPES=4096x1024", "OUT=/tmp/x")
    assert done.returncode == 0, done.stderr
    assert "-m compare.ir --op softmax --out /tmp/x --dtypes bf16 --shapes 4096x1024" in " ".join(done.stdout.split())


@pytest.mark.parametrize("tool, flag", [("torch", "--profile"), ("ncu", "--ncu")])
def test_make_profile_takes_one_shape_unless_told(tool, flag):
    done = make("profile", "OP=softmax", f"TOOL={tool}")
    planned = " ".join(done.stdout.split())
    assert done.returncode == 0 and f"-m compare --op softmax --out logs --quick {flag}" in planned, done.stderr
    done = make("profile", "OP=softmax", f"TOOL={tool}", "SHAPES=4096x1024")
    planned = " ".join(done.stdout.split())
    assert f"--shapes 4096x1024 {flag}" in planned and "--quick" not in planned


def test_an_unknown_tool_is_refused():
    done = make("profile", "OP=softmax", "TOOL=nsys")
    assert done.returncode != 0 and "TOOL=nsys: make profile takes TOOL=torch" in done.stderr
