"""docs/debugging.md runs as written: each Python block, in order, prints what the page says it prints
(tests/workbench/run_doc.py runs them in a process of their own, the debugger fed the page's commands)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = "docs/debugging.md"


@pytest.fixture(scope="module")
def blocks():
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONBREAKPOINT="pdb.set_trace")
    done = subprocess.run([sys.executable, str(REPO / "tests" / "workbench" / "run_doc.py"), PAGE], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def in_order(expected: list[str], output: str) -> list[str]:
    """The expected lines not found, each as part of an output line after the previous one's."""
    lines, at, missing = output.splitlines(), 0, []
    for want in expected:
        found = next((i for i in range(at, len(lines)) if want in lines[i]), None)
        if found is None:
            missing.append(want)
        else:
            at = found + 1
    return missing


def test_every_block_runs(blocks):
    assert len(blocks) == 6, [b["name"] for b in blocks]  # a block that raised stops the page: fewer here
    for b in blocks:
        assert b["error"] is None, f"{b['name']} raised:\n{b['error']}"


def test_every_block_prints_what_the_page_shows(blocks):
    for b in blocks:
        assert not in_order(b["expected"], b["output"]), f"{b['name']}: not printed {in_order(b['expected'], b['output'])}\n{b['output']}"


def test_the_walk_through_finds_the_bug_and_the_fix(blocks):
    """The planted off-by-one shows in the last program only, and the fixed kernel is right at every edge."""
    first, printed, stopped, fixed = blocks[:4]
    assert "wrong at [199]" in first["output"]
    assert printed["output"].count("[pid (3, 0, 0)]") == 2 and "[pid (0" not in printed["output"]  # program 3 alone
    assert stopped["commands"] and "dtype=int32)" in stopped["output"]  # the debugger ran the page's commands
    assert "right for every n" in fixed["output"]


def test_the_debugger_stops_inside_tk_s_own_kernel(blocks):
    last = blocks[-1]
    assert "gelu_forward_kernel()" in last["output"] and "-> offsets = block_offsets(BLOCK_SIZE)" in last["output"]
