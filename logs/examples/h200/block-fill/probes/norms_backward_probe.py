"""Probe: the norms on rows that fill their power-of-two block partly (5120 of 8192, 2560 of 4096, ...):
the plan against other designs forced by the tuning; % of a copy of the same bytes (x, dy read, dx written)."""
import dataclasses, json
import torch, triton
from ops.norms import layer_norm as LN, rms_norm as RN
from ops.norms.plan import TUNING, TileException, choose_backward_plan, choose_forward_plan, describe_backward, describe_forward
from ops.runtime import ByKind
from ops.runtime.direct import run_direct

def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=80, return_mode="median") * 1e3

R = dataclasses.replace
variants_b = {
    "plan": TUNING,
    "long": R(TUNING, max_block_backward=ByKind(cuda=2048, cpu=1 << 16)),
    "2persm": R(TUNING, backward_exceptions=TUNING.backward_exceptions + (TileException(2, 8192, tile=8192, programs_per_sm=2), TileException(2, 4096, tile=4096, programs_per_sm=2))),
    "4persm": R(TUNING, backward_exceptions=TUNING.backward_exceptions + (TileException(2, 8192, tile=4096, programs_per_sm=4), TileException(2, 4096, tile=4096, programs_per_sm=4))),
}
variants_f = {"plan": TUNING, "long": R(TUNING, max_block=ByKind(cuda=2048, cpu=1 << 16))}
for op, mod in (("layer_norm", LN), ("rms_norm", RN)):
    for rows, cols in [(4095, 5120), (4095, 2560), (8191, 3072), (8191, 1600), (1000, 5120), (8191, 4096), (4095, 6144)]:
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn_like(x)
        w = torch.randn(cols, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(w)
        src = torch.empty(rows * cols * 2 * 3 // 2, device="cuda", dtype=torch.uint8); dst = torch.empty_like(src)
        centered = op == "layer_norm"
        if centered:
            fwd = lambda t: run_direct(LN.forward, (x, [cols], w, b, 1e-5), {"tuning": t})
            bwd = lambda t: run_direct(LN.backward, (dy, x, [cols], w, 1e-5, True, True), {"tuning": t})
        else:
            fwd = lambda t: run_direct(RN.forward, (x, w, 1e-6), {"tuning": t})
            bwd = lambda t: run_direct(RN.backward, (dy, x, w, 1e-6, True), {"tuning": t})
        ref = bwd(TUNING)[0].double()
        res, designs, errs = {}, {}, {}
        for n, t in variants_b.items():
            designs["b_" + n] = choose_backward_plan(describe_backward(centered, dy, x, cols), t).design
            errs["b_" + n] = float((bwd(t)[0].double() - ref).abs().max())
        for n, t in variants_f.items():
            designs["f_" + n] = choose_forward_plan(describe_forward(centered, x, cols), t).design
        for rnd in range(3):
            res.setdefault("copy3", []).append(bench(lambda: dst.copy_(src)))
            for n, t in variants_b.items():
                res.setdefault("b_" + n, []).append(bench(lambda: bwd(t)))
            for n, t in variants_f.items():
                res.setdefault("f_" + n, []).append(bench(lambda: fwd(t)))
        c3 = min(res.pop("copy3"))
        out = {k: [round(min(v), 1), round(100 * c3 * (2 / 3 if k.startswith("f_") else 1) / min(v))] for k, v in res.items()}
        print(json.dumps({"op": op, "shape": f"{rows}x{cols}", "designs": designs, "err": {k: f"{v:.0e}" for k, v in errs.items()}, **out}), flush=True)
