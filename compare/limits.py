"""The device's own limits, measured in the run that uses them.

* copy bandwidth: bytes read + bytes written by one large device-to-device
  ``Tensor.copy_``, the most a memory-bound kernel can hope for;
* dense matmul throughput for each dtype: ``torch.matmul`` on square
  matrices (cuBLAS on a GPU), the most a compute-bound kernel can hope for.

Both are timed with the same method and repetition time as the variants, so
that clocks and power capping treat them alike.  Each keeps the spread of
its own repetitions (``p20_ms``, ``p80_ms``, ``samples``) and whether it is
``stable`` by the rule every time is judged by (``timing.is_stable``): a
share of a limit that is not stable is marked on every page (on a CPU each
is repeated ``timing.MIN_SAMPLES`` times at least, so that the rule can judge it).
"""

from __future__ import annotations

import torch

from . import timing

CUDA_COPY_BYTES = 1 << 30  # 1 GiB each way: far past any L2
CPU_COPY_BYTES = 64 << 20
CUDA_MATMUL_N = {torch.float16: 8192, torch.bfloat16: 8192, torch.float32: 4096, torch.float64: 2048}
CPU_MATMUL_N = 512


def _timed(times: list[float]) -> dict:
    """The median of a limit's repetitions, their spread, and whether it is stable."""
    s = timing.Samples()
    s.add(times)
    spread = {"p20_ms": s.quantile(0.2), "p80_ms": s.quantile(0.8), "samples": len(s.ms)}
    return {"ms": s.median, **spread, "stable": s.stable}


def copy_bandwidth(device: torch.device, rep_ms: float) -> dict:
    nbytes = CUDA_COPY_BYTES if device.type == "cuda" else CPU_COPY_BYTES
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        while 2 * nbytes > free // 2 and nbytes > (64 << 20):
            nbytes //= 2
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    timed = _timed(timing.bench(lambda: dst.copy_(src), (), device, rep_ms, min_reps=timing.MIN_SAMPLES))
    return {"gbps": 2 * nbytes / (timed["ms"] * 1e-3) / 1e9, "bytes": nbytes, **timed}


def matmul_throughput(device: torch.device, dtype: torch.dtype, rep_ms: float) -> dict:
    n = CUDA_MATMUL_N.get(dtype, 4096) if device.type == "cuda" else CPU_MATMUL_N
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    torch.matmul(a, b)
    timed = _timed(timing.bench(torch.matmul, (a, b), device, rep_ms, min_reps=timing.MIN_SAMPLES))
    del a, b
    out = {"tflops": 2 * n**3 / (timed["ms"] * 1e-3) / 1e12, "n": n, **timed}
    if dtype == torch.float32 and device.type == "cuda":
        out["allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
    return out


def measure(device: torch.device, dtypes, rep_ms: float, progress=None) -> dict:
    """Copy bandwidth and matmul throughput per dtype; a failure is recorded, not raised."""
    result = {"method": timing.method(device), "copy": None, "matmul": {}, "errors": []}
    if progress:
        progress.status("limits: copy bandwidth")
    try:
        result["copy"] = copy_bandwidth(device, rep_ms)
    except Exception as e:  # noqa: BLE001 - a report without a limit is still a report
        result["errors"].append(f"copy bandwidth: {type(e).__name__}: {e}")
    for dtype in dtypes:
        if not dtype.is_floating_point:
            continue  # no matmul rate for integer dtypes; their ops are judged against copy bandwidth
        name = dtype_name(dtype)
        if progress:
            progress.status(f"limits: {name} matmul throughput")
        try:
            result["matmul"][name] = matmul_throughput(device, dtype, rep_ms)
        except Exception as e:  # noqa: BLE001
            result["errors"].append(f"{name} matmul: {type(e).__name__}: {e}")
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def limit_for(limits: dict, bound: str, dtype: torch.dtype) -> tuple[float | None, str]:
    """(the limit a row is judged against, its unit): GB/s for memory, TFLOP/s for compute."""
    m = _limit(limits, bound, dtype)
    if bound == "compute":
        return (m["tflops"] if m else None), "TFLOP/s"
    return (m["gbps"] if m else None), "GB/s"


def limit_stable(limits: dict, bound: str, dtype: torch.dtype) -> bool:
    """Whether that limit's own repetitions were stable (a limit measured before this was kept: assumed so)."""
    m = _limit(limits, bound, dtype)
    return bool(m) and m.get("stable", True)


def _limit(limits: dict, bound: str, dtype: torch.dtype) -> dict | None:
    if bound == "compute":
        return limits.get("matmul", {}).get(dtype_name(dtype))
    return limits.get("copy")
