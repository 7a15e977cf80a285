"""Write real GPU output code for the capture tests: ``python -m compare.gpu_fixtures DIR``.

On a CUDA machine, compiles four graphs and stores the output_code artifact
of each, as the harness captures it, in DIR:

    pointwise_gelu.py         torch.compile of the tanh GELU: a triton_poi kernel
    reduction_softmax.py      torch.compile of softmax: triton_per / triton_red kernels
    template_matmul.py        max-autotune-no-cudagraphs matmul: a triton_tem template kernel
    triton_op_gelu.py         torch.compile of tk.gelu: the hand-written kernel inside the graph
    probe.json                versions, the kernels parsed from each, and whether their
                              ttir/ttgir/ptx could be reached

Copy the .py files to tests/fixtures/gpu/ (the tests read them from there).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def _compile_and_capture(fn, args, **compile_kwargs):
    from .capture import modules_from, output_code_logs

    torch._dynamo.reset()
    compiled = torch.compile(fn, dynamic=False, **compile_kwargs)
    with output_code_logs() as collector:
        compiled(*args)
    torch.cuda.synchronize()
    return modules_from(collector)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compare.gpu_fixtures")
    parser.add_argument("out", help="folder to write the fixtures into")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    import triton

    import ops
    from .capture import extern_calls, inductor_compiled, parse_kernels

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = "cuda"
    cases = {
        "pointwise_gelu": (ops.SPECS["gelu"].reference, (torch.randn(1 << 20, device=dev, dtype=torch.bfloat16),), {}),
        "reduction_softmax": (ops.SPECS["softmax"].reference, (torch.randn(4096, 4096, device=dev, dtype=torch.float16),), {}),
        "template_matmul": (
            torch.matmul,
            (torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16), torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16)),
            {"mode": "max-autotune-no-cudagraphs"},
        ),
        "triton_op_gelu": (ops.SPECS["gelu"].tk, (torch.randn(1 << 20, device=dev, dtype=torch.bfloat16),), {}),
    }
    probe = {"torch": torch.__version__, "triton": triton.__version__, "gpu": torch.cuda.get_device_name(), "cases": {}}
    for name, (fn, inputs, kwargs) in cases.items():
        info = probe["cases"][name] = {}
        try:
            modules = _compile_and_capture(fn, inputs, **kwargs)
        except Exception as e:  # noqa: BLE001 - write what the other cases give
            info["error"] = f"{type(e).__name__}: {e}"
            continue
        info["modules"] = len(modules)
        for i, (code, how, path) in enumerate(modules):
            suffix = "" if i == 0 else f"_{i}"
            (out / f"{name}{suffix}.py").write_text(code)
            kernels = parse_kernels(code)
            info[f"module{suffix}"] = {
                "source": how,
                "extern": extern_calls(code),
                "kernels": [{"name": k.name, "var": k.var, "kind": k.kind, "lines": k.lines} for k in kernels],
            }
            lower = {}
            for k in kernels:
                try:
                    compiled = inductor_compiled(path, k)
                    lower[k.var] = sorted((getattr(compiled, "asm", None) or {}).keys()) if compiled is not None else None
                except Exception as e:  # noqa: BLE001
                    lower[k.var] = f"{type(e).__name__}: {e}"
            info[f"module{suffix}"]["lower_levels"] = lower
    (out / "probe.json").write_text(json.dumps(probe, indent=1) + "\n")
    print(json.dumps(probe, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
