"""Probe of the norms' short-row backward (perf-notes version 63): its row sums as one reduction after the mean
(FUSED_SUMS) and 16-bit layer norm's plain mean (PLAIN), against the code before (separate reductions, the
corrected mean).  CUDA-graph times (µs), three interleaved rounds, median; PyTorch's native layer norm backward in
the same process.  It ran from the repository root on a GPU at the commit that added this file, whose Tuning had
the two switches it sets (backward_fused_sums, backward_plain_max_cols); the next commit removed them, so later
code no longer runs it."""

import dataclasses
import importlib.util
import json
import os
import sys

sys.path.insert(0, os.getcwd())
from ops.norms.plan import TUNING, backward_tile, choose_backward_plan  # noqa: E402

# graph_us and calls: the tile probe's (version 62), loaded from its file.
_TILES = os.path.join(os.path.dirname(__file__), "..", "..", "blocks-1024", "probes", "norms_backward_tiles_probe.py")
_spec = importlib.util.spec_from_file_location("norms_backward_tiles_probe", _TILES)
tiles_probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiles_probe)
graph_us, calls, BF16, F32 = tiles_probe.graph_us, tiles_probe.calls, tiles_probe.BF16, tiles_probe.F32

VARIANTS = {
    "before": dataclasses.replace(TUNING, backward_fused_sums=False, backward_plain_max_cols=0),
    "fused": dataclasses.replace(TUNING, backward_fused_sums=True, backward_plain_max_cols=0),
    "fused_plain": dataclasses.replace(TUNING, backward_fused_sums=True),
}


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
