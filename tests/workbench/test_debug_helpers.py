"""ops/blocks/debug.py: print_if and breakpoint_if act in the chosen programs only, under Triton's interpreter;
check_inputs_ready refuses what a kernel cannot read, naming the argument."""

import pdb

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from ops.blocks import debug
from ops.blocks.debug import breakpoint_if, check_inputs_ready, print_if, to_numpy
from ops.runtime import launcher


@triton.jit
def _report_kernel(x_ptr, BLOCK: tl.constexpr, PID: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets)
    print_if("first", tl.min(offsets), "sum", tl.sum(x), pid=PID)
    breakpoint_if(pid=PID)


def _run(pid, grid=(4, 2)):
    x = torch.arange(4 * 8, dtype=torch.float32)
    launcher(_report_kernel, x)[grid](x, BLOCK=8, PID=pid)


@pytest.mark.parametrize(
    "pid, programs",
    [(0, [(0, 0), (0, 1)]), ((2, 1), [(2, 1)]), ((range(1, 3), None), [(1, 0), (1, 1), (2, 0), (2, 1)]),
     ((None, 0), [(0, 0), (1, 0), (2, 0), (3, 0)]), (({3}, 1), [(3, 1)]), (7, [])],
)  # fmt: skip
def test_print_and_breakpoint_act_in_the_chosen_programs_only(pid, programs, capsys, monkeypatch):
    stopped = []
    monkeypatch.setattr(pdb.Pdb, "set_trace", lambda self, frame=None: stopped.append((debug.program_ids()[:2], frame)))
    _run(pid)
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[pid")]
    assert [tuple(map(int, line[6:].split(")")[0].split(", ")[:2])) for line in printed] == programs
    assert [ids for ids, _ in stopped] == programs
    assert all(frame.f_code.co_name == "_report_kernel" for _, frame in stopped)  # the kernel's own frame
    for (p0, _), line in zip(programs, printed):
        first = 8 * p0
        assert line.endswith(f"first: {first} sum {np.array2string(np.float32(sum(range(first, first + 8))))}")


SEEN = []  # what _keep_kernel's program held (an interpreted kernel sees its module's globals)


@triton.jit
def _keep_kernel(x_ptr, BLOCK: tl.constexpr):
    SEEN.append(to_numpy(tl.load(x_ptr + tl.arange(0, BLOCK))))


def test_to_numpy_shows_bfloat16_blocks_as_their_values():
    x = torch.tensor([1.5, -2.25, 65504.0, 3.0], dtype=torch.bfloat16)
    SEEN.clear()
    launcher(_keep_kernel, x)[(1,)](x, BLOCK=4)
    np.testing.assert_array_equal(SEEN[0], x.float().numpy())


def test_outside_a_kernel_the_program_ids_are_refused(monkeypatch):
    monkeypatch.setattr(debug._interpreter_builder(), "grid_idx", None)
    with pytest.raises(RuntimeError, match="no kernel is running in Triton's interpreter"):
        print_if("x", 1)


def test_inputs_ready():
    x = torch.zeros(4, 6)
    check_inputs_ready("k", x=x, y=torch.empty_like(x))
    check_inputs_ready("k", contiguous=False, x=x.t())
    with pytest.raises(TypeError, match=r"k: y is a list, not a torch.Tensor"):
        check_inputs_ready("k", x=x, y=[1, 2])
    with pytest.raises(ValueError, match=r"k: x is not contiguous \(shape \(6, 4\), strides \(1, 6\)\).*x.contiguous\(\)"):
        check_inputs_ready("k", x=x.t())
    with pytest.raises(ValueError, match=r"k: w is on meta; a Triton kernel runs on cuda"):
        check_inputs_ready("k", w=torch.empty(3, device="meta"))
