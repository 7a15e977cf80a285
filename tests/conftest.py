import fcntl

import pytest
import torch

import ops  # noqa: F401  (registers torch.ops.tk.*)
from ops import _native


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
def _one_big_memory_test_at_a_time(request, tmp_path_factory):
    """Tests marked big_memory hold tens of GB of GPU memory: under
    pytest-xdist, two at once (or one next to a worker's cached blocks) can
    run out of memory.  They take a lock file shared by all workers (the
    parent of each worker's temporary directory) and give their memory back
    to the device when done."""
    if request.node.get_closest_marker("big_memory") is None:
        yield
        return
    lock = tmp_path_factory.getbasetemp().parent / "big_memory.lock"
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        try:
            yield
        finally:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
