"""Host time per call of tiny ops: ``python -m compare.overhead [--op gelu] [--profile]``.

A kernel on a few thousand elements runs for 2-3 µs on a GPU; what a model
pays for it is the host side: argument checks, ``torch.library`` dispatch,
autograd, Triton's launcher.  ``do_bench`` hides part of that (the GPU is
still busy with its L2 flush while the host launches), so this measures it
directly: a wall-clock loop of many calls, synchronized once at the end,
which is the rate at which a model's Python can issue the op.

For each op: the eager PyTorch reference and ``torch.ops.tk.<op>`` at the
op's smallest default shape, called plainly, then as one training step would
(floating inputs require grad; the call and its ``backward``), where both
sides have a backward.  "tk path" says whether the plain calls were replayed
by the native lane (C++) or ran the op's Python body; "tk autograd" whether
the training steps' autograd nodes were made in C++ or by a Python
``autograd.Function``.  ``--profile`` adds a cProfile of the tk calls, the
cumulative top of the host path.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch
from tabulate import tabulate

import ops
from ops.runtime import native as _native

from . import cli, environment


def per_call_us(fns, args, device: torch.device, calls: int, repeats: int = 7) -> list[float]:
    """For each of ``fns``: the median over ``repeats`` of the wall-clock time of ``calls``
    calls, in µs per call.  The functions take turns, so a drift of the host's speed
    (other processes, clocks) weighs on each alike."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for fn in fns:
        for _ in range(max(10, calls // 10)):  # warm-up: compile, autotune, caches
            fn(*args)
    sync()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, samples in zip(fns, times):
            start = time.perf_counter()
            for _ in range(calls):
                fn(*args)
            sync()
            samples.append((time.perf_counter() - start) / calls * 1e6)
    return [sorted(samples)[len(samples) // 2] for samples in times]


def with_backward(fn, args):
    """A call of ``fn`` on ``args`` whose floating inputs require grad, followed by its backward;
    None if ``fn`` has no backward."""
    leaves = tuple(a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
    try:
        outputs = _differentiable(fn(*leaves))
        if not outputs:
            return None
        grads = [torch.ones_like(o) for o in outputs]
        torch.autograd.backward(outputs, grads)
    except RuntimeError as error:
        if "no autograd formula" in str(error):  # a backward op without a formula of its own
            return None
        raise

    def call():
        torch.autograd.backward(_differentiable(fn(*leaves)), grads)

    return call


def _replays() -> int:
    """Calls the native lane has replayed from C++ so far (ops/_native.py)."""
    return sum(lane["replays"] for lane in _native.stats().values())


def _nodes() -> int:
    """Autograd nodes the native lane has made in C++ so far (calls that needed a gradient)."""
    return sum(lane["nodes"] for lane in _native.stats().values())


def _differentiable(out) -> list:
    outputs = out if isinstance(out, (tuple, list)) else (out,)
    return [o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad]


def measure(spec, device: torch.device, dtype: torch.dtype, calls: int) -> dict:
    shape = min(spec.shapes[device.type], key=lambda s: spec.bytes_moved(s, dtype))
    args = spec.make_inputs(shape, dtype, device)
    replays = _replays()
    eager, tk = per_call_us([spec.reference, spec.tk], args, device, calls)
    path = "C++" if _replays() - replays >= calls else "Python"  # the timed calls, not only the warm-up
    row = {"op": spec.name, "shape": spec.describe(shape), "dtype": str(dtype).replace("torch.", ""),
           "eager µs": eager, "tk µs": tk, "tk / eager": tk / eager, "tk path": path}  # fmt: skip
    training = dict.fromkeys(["eager +backward µs", "tk +backward µs", "tk / eager +backward", "tk autograd"])
    try:
        # tk's first: a backward op has no backward of its own, and then eager's (which for
        # aten's norm backwards raises "not implemented") is not asked for either.
        tk_step = with_backward(spec.tk, args)
        eager_step = with_backward(spec.reference, args) if tk_step is not None else None
    except Exception as error:  # the other columns still report
        return {**row, **training, "note": f"backward failed: {type(error).__name__}: {error}"}
    if eager_step is not None and tk_step is not None:
        nodes = _nodes()
        eager_us, tk_us = per_call_us([eager_step, tk_step], (), device, calls)
        autograd = "C++ node" if _nodes() - nodes >= calls else "Python"
        training = dict(zip(training, (eager_us, tk_us, tk_us / eager_us, autograd)))
    return {**row, **training}


def profile(spec, device: torch.device, dtype: torch.dtype, calls: int, top: int = 30) -> str:
    shape = min(spec.shapes[device.type], key=lambda s: spec.bytes_moved(s, dtype))
    args = spec.make_inputs(shape, dtype, device)
    per_call_us([spec.tk], args, device, 10, repeats=1)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        spec.tk(*args)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(top)
    return f"## {spec.name} {spec.describe(shape)}: cProfile of {calls} tk calls\n{out.getvalue()}"


DEFAULT_CALLS = 2000  # on CUDA; on a CPU a hundredth of it (Triton's interpreter is slow)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m compare.overhead", description=__doc__.splitlines()[0])
    p.add_argument("--op", default="all", help="op name, comma-separated names, or 'all' (default: all)")
    p.add_argument("--dtypes", "--dtype", default=None,
                   help=f"{cli.DTYPES_HELP}; each op at each; default: float16 on a GPU (host time hardly depends on"
                        " it), float32 on CPU, or the op's first dtype where it takes neither")  # fmt: skip
    p.add_argument("--calls", type=int, default=DEFAULT_CALLS,
                   help=f"calls per timed loop (default: {DEFAULT_CALLS} on CUDA; a hundredth of it on a CPU, where the"
                        " interpreter is slow)")  # fmt: skip
    p.add_argument("--profile", action="store_true", help="also print a cProfile of the tk calls")
    environment.add_device_flag(p)
    return p


def default_dtype(spec, device: torch.device) -> torch.dtype:
    preferred = torch.float16 if device.type == "cuda" else torch.float32
    return preferred if preferred in spec.dtypes else spec.dtypes[0]


def main(argv=None) -> int:
    p = parser()
    a = p.parse_args(argv)
    device = environment.chosen_device(p, a.device)
    if a.calls < 1:
        p.error("--calls must be at least 1")
    known = f"known ops: {', '.join(sorted(ops.SPECS))}; or all"
    try:
        specs = [ops.get_spec(n) for n in cli.op_names(a.op, ops.SPECS, known)]
        dtypes = {s.name: cli.parse_dtypes(a.dtypes, s) if a.dtypes else [default_dtype(s, device)] for s in specs}
        cases = [(s, d) for s in specs for d in dtypes[s.name]]
    except cli.UsageError as e:
        p.error(str(e))
    calls = a.calls if device.type == "cuda" else max(1, a.calls // 100)  # the interpreter is slow
    rows = [measure(s, device, d, calls) for s, d in cases]
    print(f"host time per call, wall clock over {calls} calls ({device.type}):")
    print(tabulate(rows, headers="keys", floatfmt=".1f"))
    if a.profile:
        for s, d in cases:
            print(profile(s, device, d, calls))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
