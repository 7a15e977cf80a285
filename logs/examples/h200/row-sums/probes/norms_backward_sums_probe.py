"""Probe of the norms' short-row backward (perf-notes version 63): its row sums as one reduction after the mean
(FUSED_SUMS) and 16-bit layer norm's plain mean (PLAIN), against the code before (separate reductions, the
corrected mean).  CUDA-graph times (µs), three interleaved rounds, median; PyTorch's native layer norm backward in
the same process.  Run from the repository root on a GPU, at the commit that added this file: its Tuning has the
two switches (backward_fused_sums, backward_plain_max_cols) that the next commit removed."""

import dataclasses
import json
import os
import sys

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402
import triton.testing  # noqa: E402

from ops.norms import layer_norm, rms_norm  # noqa: E402
from ops.norms.plan import TUNING, backward_tile, choose_backward_plan, describe_backward  # noqa: E402
from ops.runtime.direct import run_direct  # noqa: E402

BF16, F32 = torch.bfloat16, torch.float32
VARIANTS = {
    "before": dataclasses.replace(TUNING, backward_fused_sums=False, backward_plain_max_cols=0),
    "fused": dataclasses.replace(TUNING, backward_fused_sums=True, backward_plain_max_cols=0),
    "fused_plain": dataclasses.replace(TUNING, backward_fused_sums=True),
}


def graph_us(fn):
    with torch.cuda.stream(torch.cuda.Stream()):
        return 1000 * triton.testing.do_bench_cudagraph(fn, rep=25, return_mode="median")


def calls(op, rows, cols, dtype):
    x = torch.randn(rows, cols, device="cuda", dtype=dtype)
    dy, w, b = torch.randn_like(x), torch.randn(cols, device="cuda", dtype=dtype), torch.randn(cols, device="cuda", dtype=dtype)
    meta = describe_backward(op == "layer_norm", dy, x, cols)
    if op == "rms_norm":
        return lambda t: run_direct(rms_norm.backward, (dy, x, w, 1e-6, True), {"tuning": t}), None, meta
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [cols], w, b, 1e-5)
    eager = lambda: torch.ops.aten.native_layer_norm_backward(dy, x, [cols], mean, rstd, w, b, [True] * 3)  # noqa: E731
    return lambda t: run_direct(layer_norm.backward, (dy, x, [cols], w, 1e-5, True, True), {"tuning": t}), eager, meta


def main():
    shapes = [(4095, 768, BF16), (8191, 1024, BF16), (1000, 1280, BF16), (8191, 1600, BF16), (4095, 2048, BF16),
              (4095, 2560, BF16), (8191, 4096, BF16), (4095, 5120, BF16), (4095, 6144, BF16), (1000, 8192, BF16),
              (8191, 8192, BF16), (512, 768, BF16), (2047, 1001, BF16), (4095, 768, F32), (8191, 1024, F32),
              (4095, 4096, F32)]  # fmt: skip
    for op in ("layer_norm", "rms_norm"):
        for rows, cols, dtype in shapes:
            backward, eager, meta = calls(op, rows, cols, dtype)
            if choose_backward_plan(meta).design != "short_rows":
                continue
            times = {}
            for _ in range(3):
                for name, tuning in VARIANTS.items():
                    times.setdefault(name, []).append(graph_us(lambda: backward(tuning)))
                if eager is not None:
                    times.setdefault("eager", []).append(graph_us(eager))
            us = {k: round(sorted(v)[1], 2) for k, v in times.items()}
            line = {"op": op, "shape": f"{rows}x{cols}", "dtype": str(dtype)[6:], "tile": backward_tile(meta), "us": us,
                    "before_over_new": round(us["before"] / us["fused_plain"], 3)}
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
