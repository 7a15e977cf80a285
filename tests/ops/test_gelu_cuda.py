"""The CUDA C++ GELU (ops/tour/gelu_cuda.py), built where nvcc is.

On any machine: where it cannot run (no CUDA device, no nvcc, a build that
failed) its loader raises ImportError with the reason.  On a GPU with nvcc
(marked `gpu`): its results against float64.
"""

import pytest
import torch
import torch.nn.functional as F
from reference import DTYPES, assert_close

from ops.tour import gelu_cuda


@pytest.fixture
def fresh_build():
    """built() keeps its outcome for the process: each test starts without one and leaves none."""
    gelu_cuda.built.cache_clear()
    yield
    gelu_cuda.built.cache_clear()


def _failed_build():
    raise RuntimeError("Error building extension 'tk_gelu_cuda': nvcc fatal : Unsupported gpu architecture")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_a_cuda_device_it_is_unavailable_and_says_so(monkeypatch, fresh_build):
    monkeypatch.setattr(gelu_cuda, "build", lambda: pytest.fail("built without a CUDA device"))
    assert gelu_cuda.missing().startswith("no CUDA device")
    with pytest.raises(ImportError, match="^no CUDA device"):
        gelu_cuda.load("none")


def test_without_nvcc_it_says_where_it_looked(tmp_path):
    assert "CUDA_HOME is not set" in gelu_cuda.nvcc_missing(None)
    assert gelu_cuda.nvcc_missing(str(tmp_path)) == f"no nvcc in CUDA_HOME's bin, {tmp_path / 'bin'}"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").touch()
    assert gelu_cuda.nvcc_missing(str(tmp_path)) is None


def test_a_failed_build_is_unavailable_with_its_error_and_not_retried(monkeypatch, fresh_build):
    calls = []
    monkeypatch.setattr(gelu_cuda, "missing", lambda: None)
    monkeypatch.setattr(gelu_cuda, "build", lambda: calls.append(1) or _failed_build())
    for approximate in ("none", "tanh"):  # one build serves both forms: it is not tried twice
        with pytest.raises(ImportError, match="build failed: RuntimeError: .*Unsupported gpu architecture"):
            gelu_cuda.load(approximate)
    assert calls == [1]


# ------------------------------------------------------------- on a GPU with nvcc


@pytest.fixture(scope="module")
def cuda_gelu():
    """Both forms, built once for the module; skipped where the machine lacks what the build needs."""
    lacking = gelu_cuda.missing()
    if lacking is not None:
        pytest.skip(f"the CUDA GELU cannot be built here: {lacking}")
    return {approximate: gelu_cuda.load(approximate) for approximate in ("none", "tanh")}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_cuda_gelu_matches_float64(cuda_gelu, dtype, approximate):
    for n in (1, 1000, 1000003):  # odd sizes: the last block hangs past the end
        x = 3 * torch.randn(n, device="cuda", dtype=dtype)
        y = cuda_gelu[approximate](x)
        assert y.shape == x.shape
        assert_close(y, F.gelu(x.double(), approximate=approximate), dtype)


@pytest.mark.gpu
def test_cuda_gelu_of_an_empty_tensor_and_of_a_strided_view(cuda_gelu):
    empty = torch.empty(0, 7, device="cuda", dtype=torch.bfloat16)
    assert cuda_gelu["none"](empty).shape == (0, 7)
    x = torch.randn(64, 33, device="cuda").t()  # read through .contiguous(): values, not memory order
    assert_close(cuda_gelu["tanh"](x), F.gelu(x.double(), approximate="tanh"), torch.float32)


@pytest.mark.gpu
@pytest.mark.big_memory
def test_cuda_gelu_past_2_to_the_31_elements(cuda_gelu):
    """int64 indices: as an int the index of the elements past 2**31 turns negative."""
    n = (1 << 31) + 4099
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = cuda_gelu["none"](x)
    for start in [0, (1 << 31) - 2048, n - (1 << 20)]:  # before, across and after the 2**31 boundary
        window = slice(start, start + (1 << 20))
        assert_close(y[window], F.gelu(x[window].double()), torch.bfloat16)
