"""Probe: the norms' short-row backward at blocks of 2048, 4096 and 8192 columns (bf16) and float32 at 1024: the plan
against tiles of other sizes and programs an SM.  CUDA-graph medians (µs), two rounds; eager layer norm beside."""
import dataclasses, json, sys, os
sys.path.insert(0, os.getcwd())
import torch, triton, triton.testing
from ops.norms import layer_norm as LN, rms_norm as RN
from ops.norms.plan import TUNING, TileException, describe_backward, backward_tile, choose_backward_plan
from ops.runtime.direct import run_direct

def graph_us(fn):
    with torch.cuda.stream(torch.cuda.Stream()):
        return 1000 * triton.testing.do_bench_cudagraph(fn, rep=25, return_mode="median")

def with_exception(size, block, tile, per_sm):
    others = tuple(e for e in TUNING.backward_exceptions if (e.element_size, e.block_n) != (size, block))
    return dataclasses.replace(TUNING, backward_exceptions=(TileException(size, block, tile=tile, programs_per_sm=per_sm),) + others)

CASES = {  # (rows, cols, dtype): variants (tile, per_sm)
    (1000, 1280, torch.bfloat16): [(2048, 4), (4096, 4)],
    (8191, 1600, torch.bfloat16): [(2048, 4), (4096, 4)],
    (4095, 2048, torch.bfloat16): [(2048, 4), (4096, 4)],
    (4095, 2560, torch.bfloat16): [(4096, 4), (8192, 2)],
    (8191, 4096, torch.bfloat16): [(4096, 4), (8192, 2)],
    (4095, 5120, torch.bfloat16): [(8192, 2), (8192, 4)],
    (1000, 8192, torch.bfloat16): [(8192, 2), (8192, 4)],
    (4095, 768, torch.float32): [(1024, 4), (2048, 4), (2048, 2)],
    (8191, 1024, torch.float32): [(1024, 4), (2048, 4), (2048, 2)],
}
for op in ("layer_norm", "rms_norm"):
    for (rows, cols, dtype), tiles in CASES.items():
        x = torch.randn(rows, cols, device="cuda", dtype=dtype); dy = torch.randn_like(x)
        w = torch.randn(cols, device="cuda", dtype=dtype); b = torch.randn_like(w)
        centered = op == "layer_norm"
        if centered:
            bwd = lambda t: run_direct(LN.backward, (dy, x, [cols], w, 1e-5, True, True), {"tuning": t})
            _, mean, rstd = torch.ops.aten.native_layer_norm(x, [cols], w, b, 1e-5)
            eager = lambda: torch.ops.aten.native_layer_norm_backward(dy, x, [cols], mean, rstd, w, b, [True, True, True])
        else:
            bwd = lambda t: run_direct(RN.backward, (dy, x, w, 1e-6, True), {"tuning": t})
            eager = None
        block = 1 << (cols - 1).bit_length()
        V = {"plan": TUNING}
        V.update({f"t{t}x{p}": with_exception(x.element_size(), block, t, p) for t, p in tiles})
        ref = bwd(TUNING)[0].double()
        meta = describe_backward(centered, dy, x, cols)
        line = {"op": op, "shape": f"{rows}x{cols}", "dtype": str(dtype)[6:], "design": choose_backward_plan(meta).design,
                "plan_tile": backward_tile(meta), "err": max(float((bwd(t)[0].double() - ref).abs().max()) for t in V.values())}
        times = {}
        for rnd in range(2):
            for n, t in V.items():
                times.setdefault(n, []).append(graph_us(lambda: bwd(t)))
            if eager is not None:
                times.setdefault("eager", []).append(graph_us(eager))
        line["us"] = {k: round(min(v), 2) for k, v in times.items()}
        print(json.dumps(line), flush=True)
