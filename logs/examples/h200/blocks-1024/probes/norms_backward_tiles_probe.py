"""Probes of the norms' short-row backward tile (perf-notes versions 62 and 62b), run from the repository root on a
GPU: `python logs/examples/h200/blocks-1024/probes/norms_backward_tiles_probe.py {1024,blocks,few_rows}`.

Each prints one JSON line a (op, shape, dtype): CUDA-graph times (µs) of the backward under tunings that differ in
Tuning.backward_exceptions, and PyTorch's native layer norm backward in the same process.
  1024      16-bit rows of 1024-column blocks: tiles of 1-4 rows, one to four programs an SM (three rounds, median);
  blocks    wider 16-bit blocks and float32 at 1024 columns: one row four an SM against the plan (two rounds, min);
  few_rows  the 1024-column exceptions at few rows, the plan against the rule without them (three rounds, median).
The probes of record ran the code of their version (the plan then is the `plan` column)."""

import dataclasses
import json
import os
import sys

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402
import triton.testing  # noqa: E402

from ops.norms import layer_norm, rms_norm  # noqa: E402
from ops.norms.plan import TUNING, TileException, backward_tile, describe_backward  # noqa: E402
from ops.runtime.direct import run_direct  # noqa: E402

BF16, F32 = torch.bfloat16, torch.float32


def graph_us(fn):
    with torch.cuda.stream(torch.cuda.Stream()):
        return 1000 * triton.testing.do_bench_cudagraph(fn, rep=25, return_mode="median")


def with_tile(size, block, tile, per_sm, tuning=TUNING):
    """The tuning with (size, block)'s exception replaced by one of `tile` elements, `per_sm` an SM."""
    others = tuple(e for e in tuning.backward_exceptions if (e.element_size, e.block_n) != (size, block))
    exception = TileException(size, block, tile=tile, programs_per_sm=per_sm)
    return dataclasses.replace(tuning, backward_exceptions=(exception, *others))


def calls(op, rows, cols, dtype):
    """(the backward under a tuning, PyTorch's layer norm backward or None, the call's Meta)."""
    x = torch.randn(rows, cols, device="cuda", dtype=dtype)
    dy, w, b = (
        torch.randn_like(x),
        torch.randn(cols, device="cuda", dtype=dtype),
        torch.randn(cols, device="cuda", dtype=dtype),
    )
    meta = describe_backward(op == "layer_norm", dy, x, cols)
    if op == "rms_norm":
        return lambda t: run_direct(rms_norm.backward, (dy, x, w, 1e-6, True), {"tuning": t}), None, meta
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [cols], w, b, 1e-5)
    eager = lambda: torch.ops.aten.native_layer_norm_backward(dy, x, [cols], mean, rstd, w, b, [True] * 3)  # noqa: E731
    return lambda t: run_direct(layer_norm.backward, (dy, x, [cols], w, 1e-5, True, True), {"tuning": t}), eager, meta


def measure(op, rows, cols, dtype, tunings, rounds, pick):
    backward, eager, meta = calls(op, rows, cols, dtype)
    times = {}
    for _ in range(rounds):
        for name, tuning in tunings.items():
            times.setdefault(name, []).append(graph_us(lambda: backward(tuning)))
        if eager is not None:
            times.setdefault("eager", []).append(graph_us(eager))
    line = {"op": op, "shape": f"{rows}x{cols}", "dtype": str(dtype)[6:], "plan_tile": backward_tile(meta)}
    print(json.dumps({**line, "us": {k: round(pick(v), 2) for k, v in times.items()}}), flush=True)


def median(v):
    return sorted(v)[len(v) // 2]


def probe_1024():
    variants = {"plan": TUNING}
    variants.update(
        {f"t{t}x{p}": with_tile(2, 1024, t, p) for t, p in ((2048, 2), (4096, 2), (2048, 4), (1024, 4), (4096, 1))}
    )
    for op in ("layer_norm", "rms_norm"):
        for rows, cols in [
            (4095, 768),
            (8191, 768),
            (1000, 768),
            (16383, 768),
            (4095, 1024),
            (8191, 1024),
            (2047, 1024),
        ]:
            measure(op, rows, cols, BF16, variants, 3, median)


def probe_blocks():
    cases = {(1000, 1280, BF16): [(2048, 4), (4096, 4)], (8191, 1600, BF16): [(2048, 4), (4096, 4)],
             (4095, 2048, BF16): [(2048, 4), (4096, 4)], (4095, 2560, BF16): [(4096, 4), (8192, 2)],
             (8191, 4096, BF16): [(4096, 4), (8192, 2)], (4095, 5120, BF16): [(8192, 2), (8192, 4)],
             (1000, 8192, BF16): [(8192, 2), (8192, 4)], (4095, 768, F32): [(1024, 4), (2048, 4), (2048, 2)],
             (8191, 1024, F32): [(1024, 4), (2048, 4), (2048, 2)]}  # fmt: skip
    for op in ("layer_norm", "rms_norm"):
        for (rows, cols, dtype), tiles in cases.items():
            block, size = 1 << (cols - 1).bit_length(), dtype.itemsize
            variants = {"plan": TUNING, **{f"t{t}x{p}": with_tile(size, block, t, p) for t, p in tiles}}
            measure(op, rows, cols, dtype, variants, 2, min)


def probe_few_rows():
    rule = dataclasses.replace(
        TUNING, backward_exceptions=tuple(e for e in TUNING.backward_exceptions if e.block_n != 1024)
    )
    shapes = [(1000, 768, F32), (1500, 768, F32), (2047, 896, F32), (3000, 1024, F32), (4095, 768, F32),
              (1000, 768, BF16), (1500, 1024, BF16), (512, 768, BF16), (512, 768, F32)]  # fmt: skip
    for op in ("layer_norm", "rms_norm"):
        for rows, cols, dtype in shapes:
            measure(op, rows, cols, dtype, {"plan": TUNING, "rule": rule}, 3, median)


if __name__ == "__main__":
    {"1024": probe_1024, "blocks": probe_blocks, "few_rows": probe_few_rows}[sys.argv[1]]()
