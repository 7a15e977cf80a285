import fcntl
import os
import time

# On a host with several GPUs, TK_TEST_GPUS=N spreads pytest-xdist's workers over the first N of them
# (worker i on GPU i % N): set before anything initializes CUDA.  Tests that need two GPUs then skip.
if os.environ.get("TK_TEST_GPUS") and os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    _worker = int(os.environ["PYTEST_XDIST_WORKER"][2:])
    os.environ["CUDA_VISIBLE_DEVICES"] = str(_worker % int(os.environ["TK_TEST_GPUS"]))

import pytest
import torch

import ops  # noqa: F401  (registers torch.ops.tk.*)
from ops.runtime import native as _native


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _python_bodies_where_patched(request):
    """A test that patches an op's rules or spies on its helpers needs every call
    to run the body: the native lane would replay what an unpatched body did.
    (On a CPU-only machine the lane is not in front of the tk ops at all.)"""
    if "monkeypatch" not in request.fixturenames:
        yield
        return
    with _native.paused():
        yield


@pytest.fixture(autouse=True)
def _gpu_tests_give_back_cached_blocks(request):
    """A GPU test hands its cached blocks back to the device when it ends, so
    that the free memory a big_memory test in another worker waits for comes."""
    yield
    node = request.node
    if node.get_closest_marker("gpu") and not node.get_closest_marker("big_memory") and torch.cuda.is_initialized():
        torch.cuda.empty_cache()  # (a big_memory test gives its memory back itself, before the lock goes)


# The most a big_memory test holds at once (a 2**31-element bfloat16 input,
# its gradient and two results: 16 GiB), with room for the references.
BIG_MEMORY_BYTES = 24 << 30
BIG_MEMORY_WAIT_S = 120


@pytest.fixture(autouse=True)
def _one_big_memory_test_at_a_time(request, tmp_path_factory):
    """Tests marked big_memory hold tens of GB of GPU memory: under
    pytest-xdist, two at once (or one next to other workers' tests) can run
    out of memory.  They take a lock file shared by all workers (the parent
    of each worker's temporary directory), wait (up to BIG_MEMORY_WAIT_S)
    until the device has BIG_MEMORY_BYTES free, and give their memory back
    to the device when done."""
    if request.node.get_closest_marker("big_memory") is None:
        yield
        return
    lock = tmp_path_factory.getbasetemp().parent / "big_memory.lock"
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        if torch.cuda.is_available():
            deadline = time.monotonic() + BIG_MEMORY_WAIT_S
            while torch.cuda.mem_get_info()[0] < BIG_MEMORY_BYTES and time.monotonic() < deadline:
                time.sleep(0.5)
        try:
            yield
        finally:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
