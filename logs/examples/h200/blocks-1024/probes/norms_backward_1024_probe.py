"""Probe: the norms' short-row backward at 768-1024 columns (blocks of 1024): the plan's tile against two an SM
and four an SM; eager's native_layer_norm_backward in the same process.  CUDA-graph medians (µs), three rounds."""
import dataclasses, json, sys, os
sys.path.insert(0, os.getcwd())
import torch, triton, triton.testing
from ops.norms import layer_norm as LN, rms_norm as RN
from ops.norms.plan import TUNING, TileException, choose_backward_plan, describe_backward, backward_tile
from ops.runtime.direct import run_direct

def graph_us(fn):
    with torch.cuda.stream(torch.cuda.Stream()):
        return 1000 * triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median")

R = dataclasses.replace
base = TUNING.backward_exceptions
V = {"plan": TUNING,
     "t2048x2": R(TUNING, backward_exceptions=base + (TileException(2, 1024, tile=2048, programs_per_sm=2),)),
     "t4096x2": R(TUNING, backward_exceptions=base + (TileException(2, 1024, tile=4096, programs_per_sm=2),)),
     "t2048x4": R(TUNING, backward_exceptions=base + (TileException(2, 1024, tile=2048, programs_per_sm=4),)),
     "t1024x4": R(TUNING, backward_exceptions=base + (TileException(2, 1024, tile=1024, programs_per_sm=4),)),
     "t4096x1": R(TUNING, backward_exceptions=base + (TileException(2, 1024, tile=4096, programs_per_sm=1),))}
shapes = [(4095, 768), (8191, 768), (1000, 768), (16383, 768), (4095, 1024), (8191, 1024), (2047, 1024), (4095, 640)]
for op in ("layer_norm", "rms_norm"):
    for rows, cols in shapes:
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16); dy = torch.randn_like(x)
        w = torch.randn(cols, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(w)
        centered = op == "layer_norm"
        if centered:
            bwd = lambda t: run_direct(LN.backward, (dy, x, [cols], w, 1e-5, True, True), {"tuning": t})
            _, mean, rstd = torch.ops.aten.native_layer_norm(x, [cols], w, b, 1e-5)
            eager = lambda: torch.ops.aten.native_layer_norm_backward(dy, x, [cols], mean, rstd, w, b, [True, True, True])
        else:
            bwd = lambda t: run_direct(RN.backward, (dy, x, w, 1e-6, True), {"tuning": t})
            eager = None
        ref = [r.double() for r in bwd(TUNING)[:1]]
        line = {"op": op, "shape": f"{rows}x{cols}", "tiles": {}, "err": {}}
        for n, t in V.items():
            line["tiles"][n] = backward_tile(describe_backward(centered, dy, x, cols), t)
            line["err"][n] = float((bwd(t)[0].double() - ref[0]).abs().max())
        times = {}
        for rnd in range(3):
            for n, t in V.items():
                times.setdefault(n, []).append(graph_us(lambda: bwd(t)))
            if eager is not None:
                times.setdefault("eager", []).append(graph_us(eager))
        line["us"] = {k: round(sorted(v)[1], 2) for k, v in times.items()}
        print(json.dumps(line), flush=True)
