"""Probe: softmax FORWARD on rows that fill a block partly: the block against one reloading pass (the looped
kernel, one chunk: online max and sum, then the row read again), held, Liger; bf16 and float32; % of a copy."""
import dataclasses, json
import torch, triton
from ops.softmax import op as S
from ops.softmax.plan import FORWARD, TUNING, LoopedPlan, choose_plan
from ops.softmax.launch import run as _run
from ops.runtime.direct import run_direct

def run(p, t):
    return run_direct(_run, (p, t), {})

def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3

import liger_kernel.ops.softmax as L
held_tuning = dataclasses.replace(TUNING, max_block=1024)
shapes = [(4095, 5120), (8191, 4608), (4095, 11008), (4095, 13824), (4095, 20480), (4095, 32000), (4096, 16384)]
for dtype in (torch.bfloat16, torch.float32):
    for rows, cols in shapes:
        x = torch.randn(rows, cols, device="cuda", dtype=dtype)
        y = torch.empty_like(x)
        src = torch.empty(2 * rows * cols * x.element_size() // 2, device="cuda", dtype=torch.uint8); dst = torch.empty_like(src)
        meta = S.describe(FORWARD, (x, y), cols, 1)
        plan = choose_plan(meta)
        block = triton.next_power_of_2(cols)
        cands = {"plan": plan, "held": choose_plan(meta, held_tuning)}
        for w in (8, 16, 32):
            if block // (32 * w) <= 64:
                cands[f"reload_w{w}"] = LoopedPlan(FORWARD, plan.rows, block, w)
        want = torch.softmax(x.double(), -1)
        errs = {}
        for n, p in cands.items():
            y.zero_(); run(p, (x, y)); torch.cuda.synchronize()
            errs[n] = float((y.double() - want).abs().max())
        res = {}
        for rnd in range(3):
            res.setdefault("copy", []).append(bench(lambda: dst.copy_(src)))
            for n, p in cands.items():
                res.setdefault(n, []).append(bench(lambda: run(p, (x, y))))
            res.setdefault("liger", []).append(bench(lambda: L.LigerSoftmaxFunction.apply(x)))
            res.setdefault("eager", []).append(bench(lambda: torch.softmax(x, -1)))
        c = min(res["copy"])
        print(json.dumps({"shape": f"{rows}x{cols}", "dtype": str(dtype)[6:], "plan": type(plan).__name__,
                          "held": type(cands["held"]).__name__, "worst_err": f"{max(errs.values()):.1e}",
                          **{k: [round(min(v), 1), round(100 * c / min(v))] for k, v in res.items() if k != "copy"}}), flush=True)
