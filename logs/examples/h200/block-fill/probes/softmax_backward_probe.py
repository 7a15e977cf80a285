"""Probe 4: softmax backward, rows that fit a block: the block kernel against one reloading pass (the looped
kernel with one chunk of the whole block: dot, then the row read again), by warps; held setups; Liger."""
import dataclasses, json
import torch, triton
from ops.softmax import op as S
from ops.softmax.plan import BACKWARD, TUNING, HeldSetup, HeldDesign, LAGGED, LoopedPlan, choose_plan
from ops.softmax.launch import run as _run
from ops.runtime.direct import run_direct

def run(p, t):
    return run_direct(_run, (p, t), {})

def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3

import liger_kernel.ops.softmax as L
from liger_kernel.ops.utils import calculate_settings

held_tuning = dataclasses.replace(TUNING, max_block=1024)
held2k = dataclasses.replace(held_tuning, backward_16bit=HeldDesign(LAGGED, HeldSetup(2048, 2, 128, 8)),
                             backward_float32=HeldDesign(LAGGED, HeldSetup(1024, 2, 96, 10)))
bf16 = [(4095, 5120), (4095, 7168), (4095, 8192), (4095, 9216), (4095, 11008), (4095, 13824), (4095, 14336),
        (4095, 18432), (4095, 20480), (4095, 28672), (4095, 32000), (4096, 16384), (2048, 32768), (8191, 11008),
        (8191, 4608), (16384, 3072)]
f32 = [(4095, 9216), (4095, 12288), (4096, 16384), (4095, 18432), (4095, 24576), (8191, 14336)]
for dtype, shapes in ((torch.bfloat16, bf16), (torch.float32, f32)):
    for rows, cols in shapes:
        dy = torch.randn(rows, cols, device="cuda", dtype=dtype)
        y = torch.softmax(torch.randn(rows, cols, device="cuda"), -1).to(dtype)
        dx = torch.empty_like(y)
        src = torch.empty(3 * rows * cols * dy.element_size() // 2, device="cuda", dtype=torch.uint8); dst = torch.empty_like(src)
        meta = S.describe(BACKWARD, (dy, y, dx), cols, 1)
        plan = choose_plan(meta)
        block = triton.next_power_of_2(cols)
        cands = {"plan": plan, "held4k": choose_plan(meta, held_tuning), "held2k": choose_plan(meta, held2k)}
        for w in (4, 8, 16, 32):
            if block // (32 * w) <= 64:
                cands[f"reload_w{w}"] = LoopedPlan(BACKWARD, plan.rows, block, w)
        cands["looped4096_w8"] = LoopedPlan(BACKWARD, plan.rows, 4096, 8)
        want = (y.double() * (dy.double() - (dy.double() * y.double()).sum(-1, keepdim=True)))
        errs = {}
        for n, p in cands.items():
            dx.zero_(); run(p, (dy, y, dx)); torch.cuda.synchronize()
            errs[n] = float((dx.double() - want).abs().max())
        res = {}
        for rnd in range(3):
            res.setdefault("copy", []).append(bench(lambda: dst.copy_(src)))
            for n, p in cands.items():
                res.setdefault(n, []).append(bench(lambda: run(p, (dy, y, dx))))
            bs, nw = calculate_settings(cols)
            res.setdefault("liger", []).append(bench(lambda: L._softmax_backward(dy, y, bs, nw, False)))
        c = min(res["copy"])
        print(json.dumps({"shape": f"{rows}x{cols}", "dtype": str(dtype)[6:], "plan_warps": getattr(plan, "warps", None),
                          "worst_err": f"{max(errs.values()):.1e}", "plan_err": f"{errs['plan']:.1e}",
                          **{k: [round(min(v), 1), round(100 * c / min(v))] for k, v in res.items() if k != "copy"}}), flush=True)
