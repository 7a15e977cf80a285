"""The test suite's own machinery (tests/conftest.py)."""

import fcntl

import pytest
import torch
from conftest import BIG_MEMORY_BYTES


@pytest.mark.big_memory
def test_big_memory_tests_hold_a_lock_that_other_workers_wait_on(tmp_path_factory):
    lock = tmp_path_factory.getbasetemp().parent / "big_memory.lock"
    with open(lock, "a") as other:  # another open file: what a second xdist worker would hold
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


@pytest.mark.gpu
@pytest.mark.big_memory
def test_big_memory_tests_start_with_the_memory_they_need():
    """The fixture waits for BIG_MEMORY_BYTES free before a big test (other
    workers give their cached blocks back after each GPU test)."""
    assert torch.cuda.mem_get_info()[0] >= BIG_MEMORY_BYTES
