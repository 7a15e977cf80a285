"""Helpers shared by the op tests: float64 references and error measures."""

import pytest
import torch
import torch.nn.functional as F

# Each test runs on the CPU (Triton's interpreter) and, marked `gpu`, on CUDA.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]

# Max relative norm error against a float64 reference, per storage dtype.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float64: 1e-12}


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||, in float64; NaN never passes a tolerance check."""
    out, ref = out.double(), ref.double().to(out.device)
    if out.shape != ref.shape:
        raise AssertionError(f"shape {tuple(out.shape)} != reference shape {tuple(ref.shape)}")
    if out.numel() == 0:
        return 0.0
    return ((out - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, scale: float = 1.0):
    assert out.dtype == dtype, f"output dtype {out.dtype}, expected {dtype}"
    err = rel_error(out, ref)
    assert err <= TOLERANCE[dtype] * scale, f"relative error {err:.3e} > {TOLERANCE[dtype] * scale:.1e} ({dtype})"


def leaf64(t: torch.Tensor) -> torch.Tensor:
    """A fresh float64 leaf with t's values, for PyTorch's reference gradients."""
    return t.detach().to(torch.float64, copy=True).requires_grad_()


def pytorch_gelu(t: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """F.gelu in t's dtype: where PyTorch puts NaN and infinities, and its rounding.

    On CPU, torch 2.13's vectorized kernel (AVX-512; float32, and the half
    types, which compute in float32) gives NaN for gelu(+inf) and inf for
    gelu(3e38), where its float64 kernel, its one-element path and CUDA
    give x.  There the float64 result, rounded to t's dtype, stands in."""
    if approximate == "none" and t.device.type == "cpu" and t.dtype != torch.float64:
        return F.gelu(t.double(), approximate="none").to(t.dtype)
    return F.gelu(t, approximate=approximate)


def strided_versions(x: torch.Tensor):
    """The same values seen through layouts a user can hand an op."""
    yield "contiguous", x
    if x.dim() == 0:
        return
    if x.dim() >= 2:
        yield "transposed", x.transpose(0, -1).contiguous().transpose(0, -1)
    big = torch.empty(*x.shape[:-1], 2 * x.shape[-1] + 1, dtype=x.dtype, device=x.device)
    big[..., 1::2] = x
    yield "every-other-column", big[..., 1::2]


def error_cases(cases):
    """Parametrize a test over (name, call, error type, message pattern) rows."""
    return pytest.mark.parametrize("case", cases, ids=[c[0] for c in cases])


def assert_raises_clearly(case):
    """The call raises the row's error type, with a message matching its pattern."""
    _, call, error, message = case
    with pytest.raises(error, match=message):
        call()
