"""Probe: the 1024-column exceptions at few rows: the plan (exceptions in) against the rule (the 1024-column
exceptions out), CUDA-graph medians (µs) of three rounds; PyTorch's native layer norm backward beside."""
import dataclasses, json, sys, os
sys.path.insert(0, os.getcwd())
import torch, triton, triton.testing
from ops.norms import layer_norm as LN, rms_norm as RN
from ops.norms.plan import TUNING, describe_backward, backward_tile
from ops.runtime.direct import run_direct

def graph_us(fn):
    with torch.cuda.stream(torch.cuda.Stream()):
        return 1000 * triton.testing.do_bench_cudagraph(fn, rep=25, return_mode="median")

RULE = dataclasses.replace(TUNING, backward_exceptions=tuple(e for e in TUNING.backward_exceptions if e.block_n != 1024))
for op in ("layer_norm", "rms_norm"):
    for rows, cols, dtype in [(1000, 768, torch.float32), (1500, 768, torch.float32), (2047, 896, torch.float32),
                              (3000, 1024, torch.float32), (4095, 768, torch.float32), (1000, 768, torch.bfloat16),
                              (1500, 1024, torch.bfloat16), (512, 768, torch.bfloat16), (512, 768, torch.float32)]:
        x = torch.randn(rows, cols, device="cuda", dtype=dtype); dy = torch.randn_like(x)
        w = torch.randn(cols, device="cuda", dtype=dtype); b = torch.randn_like(w)
        if op == "layer_norm":
            bwd = lambda t: run_direct(LN.backward, (dy, x, [cols], w, 1e-5, True, True), {"tuning": t})
            _, mean, rstd = torch.ops.aten.native_layer_norm(x, [cols], w, b, 1e-5)
            eager = lambda: torch.ops.aten.native_layer_norm_backward(dy, x, [cols], mean, rstd, w, b, [True, True, True])
        else:
            bwd = lambda t: run_direct(RN.backward, (dy, x, w, 1e-6, True), {"tuning": t})
            eager = None
        meta = describe_backward(op == "layer_norm", dy, x, cols)
        line = {"op": op, "shape": f"{rows}x{cols}", "dtype": str(dtype)[6:], "tiles": [backward_tile(meta, TUNING), backward_tile(meta, RULE)]}
        times = {}
        for rnd in range(3):
            times.setdefault("plan", []).append(graph_us(lambda: bwd(TUNING)))
            times.setdefault("rule", []).append(graph_us(lambda: bwd(RULE)))
            if eager is not None:
                times.setdefault("eager", []).append(graph_us(eager))
        line["us"] = {k: round(sorted(v)[1], 2) for k, v in times.items()}
        print(json.dumps(line), flush=True)
