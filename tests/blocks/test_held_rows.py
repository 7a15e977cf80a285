"""The held-rows protocol's host side (ops/blocks/held_rows.py): setups, grids, the fill overlap rule, the fill kernel."""

import re
from types import SimpleNamespace

import pytest
import torch
from ptx_checks import build_for_hopper

from ops.blocks import held_rows
from ops.runtime import H100, INTERPRETER, DeviceFacts
from ops.runtime import direct


def test_a_setup_takes_rows_by_segments_and_column_multiple():
    setup = held_rows.HeldSetup(512, 1, 160, 12, max_segments=128, col_multiple=16)
    assert setup.takes(128 * 512, 16) and not setup.takes(128 * 512 + 1, 16)  # 129 segments
    assert not setup.takes(4096, 8)  # a row length of no 16-element multiple
    assert held_rows.HeldSetup(2048, 4, 96, 5).takes(10**7, 1)  # no bound: as many as the grid holds


def test_a_setup_fills_what_an_h100_runs_at_once():
    """12 one-warp programs of 160 registers an SM on an H100 (not 14: warps are placed in fours, see
    DeviceFacts.resident_programs_per_sm), 8 of 4 warps at 128 registers."""
    assert held_rows.HeldSetup(512, 1, 160, 12).programs(H100) == 12 * 132
    assert held_rows.HeldSetup(512, 1, 144, 14).programs(H100) == 12 * 132
    assert held_rows.HeldSetup(4096, 4, 128, 8).programs(H100) == 4 * 132  # 4 programs of 4 warps at 128 fit
    shared = held_rows.HeldSetup(8192, 8, 64, 4, shared=2 * 8192 * 2)
    assert shared.programs(H100) == 4 * 132 and shared.programs(DeviceFacts("cuda", 132, (9, 0), shared_per_sm=65536)) == 132


def test_rows_fit_the_grid_in_even_rounds():
    assert held_rows.fit_rows(1024, 8, 396) == (8, 49)  # 21 rounds of 49 rows
    assert held_rows.fit_rows(5, 10, 528) == (10, 5)  # fewer rows than the grid holds
    assert held_rows.fit_rows(8, 397, 396) is None  # a row's segments do not all fit


@pytest.fixture
def eager():
    previous = getattr(direct._direct, "on", False)
    direct._direct.on = True
    yield
    direct._direct.on = previous


def test_held_rows_kernels_overlap_their_fill_in_eager_calls_on_hopper_outside_graph_capture(eager, monkeypatch):
    """The rule: an eager launch (not traced for Inductor) on Hopper or newer, with a Triton that
    has grid dependency control, while no CUDA graph is being captured; never on CPU."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert held_rows.may_overlap_fill(H100) is (held_rows.gdc_wait is not None)
    if held_rows.gdc_wait is None:
        return
    assert not held_rows.may_overlap_fill(INTERPRETER)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not held_rows.may_overlap_fill(H100)  # a graph's kernels follow each other closely already
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert not held_rows.may_overlap_fill(DeviceFacts("cuda", 108, (8, 0)))  # before Hopper: no dependent launch

    def no_device_query():
        raise AssertionError("a traced call queried the device")

    direct._direct.on = False
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", no_device_query)
    assert not held_rows.may_overlap_fill(H100)  # traced for Inductor: the plain kernel


def test_the_scratch_fill_lets_the_next_kernel_start():
    """Built for sm_90 (no GPU needed): the fill, launched before a kernel that overlaps it,
    lets that kernel start at once (it signals its dependents before its first store)."""
    from triton.compiler import ASTSource

    for overlapped in (False, True):
        signature = {"words_ptr": "*i64", "n": "i32", "BLOCK": "constexpr", "OVERLAPPED": "constexpr"}
        source = ASTSource(held_rows.unpublish_kernel, signature, {"BLOCK": 1024, "OVERLAPPED": overlapped})
        ptx = build_for_hopper(source, SimpleNamespace(warps=4, registers=255)).asm["ptx"]
        starts = [m.start() for m in re.finditer(r"griddepcontrol\.launch_dependents", ptx)]
        assert len(starts) == overlapped and all(at < ptx.index("st.global") for at in starts)


def test_words_block_gives_every_thread_one_copy():
    assert held_rows.words_block(4, 8) == 128 and held_rows.words_block(1, 100) == 128
