"""The Make targets refuse a misspelled or unknown setting instead of running the default sweep."""

import shutil
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")


def make(*args: str) -> subprocess.CompletedProcess:
    """`make -n` (print, run nothing) with USE_SYSTEM=1, so that no set-up is planned."""
    return subprocess.run(["make", "-n", "-C", str(REPO), "USE_SYSTEM=1", *args], capture_output=True, text=True)


@pytest.mark.parametrize(
    "setting, suggestion",
    [("op=softmax", "OP"), ("DTYPE=bf16", "DTYPES"), ("SHAPE=1024", "SHAPES"), ("variant=tk", "VARIANTS"),
     ("SIZES=1024", "one of the settings")],
)  # fmt: skip
def test_an_unknown_setting_is_refused_with_the_valid_ones(setting, suggestion):
    done = make("compare", setting)
    assert done.returncode != 0 and "--op" not in done.stdout  # nothing was planned
    assert f"unknown setting {setting}" in done.stderr and suggestion in done.stderr
    assert "OP OUT DTYPES SHAPES VARIANTS QUICK MAX_AUTOTUNE" in done.stderr


@pytest.mark.parametrize("value", ["1", "true", "yes", "on", "TRUE"])
def test_the_obvious_spellings_of_yes_are_accepted(value):
    done = make("compare", "OP=softmax", f"QUICK={value}", f"MAX_AUTOTUNE={value}", f"CONFIGS={value}")
    assert done.returncode == 0, done.stderr
    for flag in ("--op softmax", "--quick", "--max-autotune", "--configs"):
        assert flag in done.stdout


@pytest.mark.parametrize("value", ["0", "false", "no", "off", ""])
def test_the_obvious_spellings_of_no_are_accepted(value):
    done = make("compare", f"QUICK={value}", f"CONFIGS={value}")
    assert done.returncode == 0, done.stderr
    assert "--quick" not in done.stdout and "--configs" not in done.stdout


def test_a_setting_that_is_neither_yes_nor_no_is_refused():
    done = make("compare", "QUICK=maybe")
    assert done.returncode != 0 and "QUICK=maybe is not a yes or a no" in done.stderr


def test_an_environment_variable_of_the_same_name_that_is_no_yes_or_no_is_off_not_an_error():
    """CONFIGS or QUICK exported for something else must not stop every target."""
    env = {**os.environ, "CONFIGS": "/etc/some.conf", "QUICK": "later"}
    done = subprocess.run(["make", "-n", "-C", str(REPO), "USE_SYSTEM=1", "compare"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert "--configs" not in done.stdout and "--quick" not in done.stdout


def test_every_setting_of_the_compare_target_reaches_the_harness():
    done = make("compare", "OP=gelu,softmax", "DTYPES=bf16", "SHAPES=4096", "VARIANTS=eager,tk", "OUT=/tmp/x", "ARGS=--no-capture")
    assert done.returncode == 0, done.stderr
    for flag in ("--op gelu,softmax", "--dtypes bf16", "--shapes 4096", "--variants eager,tk", "--out /tmp/x", "--no-capture"):
        assert flag in done.stdout
