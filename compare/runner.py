"""The sweep: every variant of an op on every (dtype, shape), one process.

For each (dtype, shape):

1. inputs from ``spec.make_inputs``, and the float64 answer from
   ``spec.reference64 or spec.reference`` on float64 copies of them;
2. per variant: build it (``torch.compile`` after ``torch._dynamo.reset()``,
   so that no shape sees another's compiled graph or autotune result), time
   the first call (announced when it runs long: compiling, autotuning),
   check its output against the float64 answer, count its kernels with the
   profiler, and take its peak memory (CUDA);
3. time the variants *interleaved*: round after round, each variant once
   per round with the same repetition time, so that a clock drifting down
   under power capping penalizes none of them alone.

Any exception in a variant becomes a ``failed`` record and the sweep goes
on; ``KeyboardInterrupt`` stops it, after the partial report is written in
the run's own folder (the ``logs/<op>`` link still names the last complete
report).
"""

from __future__ import annotations

import contextlib
import math
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import environment, kernels, limits as limits_mod, profiling, timing
from .progress import long_step
from .record import ABOVE_LIMIT, NOISY, NOISY_COMPILE, NOISY_EAGER, NOISY_GRAPH, UNSTABLE_LIMIT, new_record
from .variants import TK_KINDS, Variant, VariantSkipped

# Steady-state time under which every variant also gets its CUDA-graph replay
# time.  do_bench's L2 flush hides a call's host time only while the flush
# lasts (a 256 MB zero, about 90 µs on an H100): on a slow host a Python
# launch path shows in the median of calls of up to about 100 µs of GPU work
# (rms_norm float32 65536x256: a 79 µs median for 50 µs of kernel).
CUDAGRAPH_BELOW_MS = 0.25


@dataclass
class Settings:
    device: torch.device
    rep_ms: float  # per variant and round: do_bench's rep on CUDA, the wall-clock budget on CPU
    rounds: int
    cudagraph: bool = True
    capture: object | None = None  # compare.capture.Capture, when output code is being captured
    profile: bool = False  # --profile: a torch.profiler trace of each variant (profiling.py)
    profile_dir: Path | None = None  # where they go: the op's profile/ folder, set per op
    ir: bool | None = None  # --ir / --no-ir: tk's compiled levels per case (None: on a GPU only)
    ncu: bool = False  # --ncu: Nsight Compute over the sweep's first case (ncu.py)
    configs: bool = False  # --configs: each case again under every configuration of tk's kernel (configs.py)


@dataclass
class Case:
    """One variant on one (dtype, shape), while it runs."""

    variant: Variant
    record: dict
    fn: object = None
    samples: timing.Samples = field(default_factory=timing.Samples)
    stage: str = "build"  # what it is doing (a failure's record names it)


def error_text(stage: str, exc: BaseException) -> str:
    text = f"{stage}: {type(exc).__name__}: {exc}".strip()
    first_lines = text.splitlines()[:6]
    return "\n".join(first_lines)[:2000]


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _tensors(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


def _to64(args: tuple, device: torch.device) -> tuple:
    return tuple(a.to(device=device, dtype=torch.float64) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


def reference64(spec, args: tuple, device: torch.device) -> list[torch.Tensor]:
    """The float64 answer, on the device, or on the CPU when the device has no room for it."""
    ref = spec.reference64 or spec.reference
    try:
        return [t.detach() for t in _tensors(ref(*_to64(args, device)))]
    except torch.cuda.OutOfMemoryError:
        _free(device)
        return [t.detach() for t in _tensors(ref(*_to64(args, torch.device("cpu"))))]


def errors(out, expected: list[torch.Tensor]) -> tuple[float, float]:
    """(relative norm error, max absolute error) of ``out`` against the float64 answer.

    Relative norm error = ||out - expected|| / ||expected||, over every output
    tensor together; a NaN or inf where the answer is finite is an infinite error.
    """
    got = _tensors(out)
    if len(got) != len(expected):
        raise ValueError(f"returned {len(got)} tensor(s), the reference {len(expected)}")
    diff_sq = ref_sq = 0.0
    max_abs = 0.0
    for g, e in zip(got, expected):
        if tuple(g.shape) != tuple(e.shape):
            raise ValueError(f"output shape {tuple(g.shape)} differs from the reference's {tuple(e.shape)}")
        g64 = g.detach().to(device=e.device, dtype=torch.float64)
        finite = torch.isfinite(e)
        if not bool(torch.equal(torch.isfinite(g64), finite)):
            return math.inf, math.inf
        d = torch.where(finite, g64 - e, torch.zeros_like(e))  # inf/NaN where expected: matched above
        diff_sq += float(torch.sum(d * d))
        ref_sq += float(torch.sum(torch.where(finite, e, torch.zeros_like(e)) ** 2))
        if d.numel():
            max_abs = max(max_abs, float(d.abs().max()))
    if ref_sq == 0.0:
        return (0.0 if diff_sq == 0.0 else math.inf), max_abs
    return math.sqrt(diff_sq / ref_sq), max_abs


def _snapshot(args: tuple, device: torch.device) -> list | None:
    """Copies of the tensor inputs, to catch a variant that writes into them; None
    when the device has no room for the copies (the check is then skipped)."""
    try:
        return [a.detach().clone() if isinstance(a, torch.Tensor) else None for a in args]
    except torch.cuda.OutOfMemoryError:
        _free(device)
        return None


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal element for element, NaN included (torch.equal says NaN != NaN)."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    a, b = a.detach(), b.detach()
    if a.is_floating_point() and a.element_size() in ints:
        return bool(torch.equal(a.view(ints[a.element_size()]), b.view(ints[b.element_size()])))
    return bool(torch.equal(a, b))


def _restore_inputs(args: tuple, pristine: list | None) -> bool:
    """True if every tensor input is as it was; otherwise copy the originals back and say False."""
    if pristine is None:
        return True
    unchanged = True
    for a, p in zip(args, pristine):
        try:
            if p is not None and not _same_bits(a, p):
                unchanged = False
                a.detach().copy_(p)
        except Exception:  # noqa: BLE001 - an input that cannot be compared or written back: the check gives up
            pass
    return unchanged


def base_record(spec, variant: Variant, dtype: torch.dtype, shape: tuple, settings: Settings) -> dict:
    """A fresh record of one variant on one (dtype, shape): what is known before it runs (record.py
    declares every field and the value of the others, which the steps below fill)."""
    device = settings.device
    return new_record(
        op=spec.name,
        dtype=limits_mod.dtype_name(dtype),
        shape=list(shape),
        shape_label=spec.describe(shape),
        variant=variant.name,
        kind=variant.kind,
        interpreted=variant.interpreted(device),
        device=device.type,
        timing_method=timing.method(device),
        bytes=int(spec.bytes_moved(shape, dtype)),
        flops=int(spec.flops(shape, dtype)),
        tolerance=spec.tolerance.get(dtype),
    )


def _why_slow(v: Variant) -> str:
    """What a long first call of ``v`` is busy with."""
    if v.compiled:
        return "torch.compile: Dynamo, Inductor and Triton compiling; Inductor and Triton keep what they build on disk"
    if v.kind in TK_KINDS:
        return "Triton compiling the kernels (kept on disk for the next run) and autotuning those that autotune"
    return "the first call"


def _autotuned(events) -> list[str]:
    """The closing words of a long first call: what Triton's autotuner did in it."""
    out = []
    for kernel, configs, seconds, from_disk in events:
        if from_disk:
            out.append(f"{kernel}: autotune choice read from disk")
        elif seconds is not None:
            out.append(f"autotuned {kernel} over {configs} configs in {seconds:.1f} s")
    return out


def _build_and_first_call(case: Case, spec, dtype, shape, args, settings: Settings, label: str, progress) -> tuple:
    """Build the variant and make its first call: (output, ms); a call that runs long is announced."""
    v, device, capture = case.variant, settings.device, settings.capture
    tk_launches = None
    with contextlib.ExitStack() as stack:
        if capture is not None and v.compiled:
            stack.enter_context(capture.recording(spec, v, dtype, shape))
        if v.kind == "peer":  # a peer may build itself first (the CUDA GELU: nvcc, about a minute, once)
            with long_step(progress, f"{label} | {v.name}: building", "a peer's import, or its extension compiling"):
                case.fn = v.build(device)
        else:
            case.fn = v.build(device)
        case.stage = "first call"
        if capture is not None and v.kind == "tk":  # which of tk's kernels run for this shape, and how
            tk_launches = stack.enter_context(capture.watching_tk())
        details = stack.enter_context(long_step(progress, f"{label} | {v.name}: first call", _why_slow(v)))
        events = stack.enter_context(timing.autotune_events())
        with profiling.timed_region(f"{v.name} {limits_mod.dtype_name(dtype)} {spec.describe(shape)} first call", device):
            out, ms = timing.first_call(case.fn, args, device)
        details += _autotuned(events)
    if tk_launches is not None:
        fn = case.fn
        capture.store_tk(spec, v, dtype, shape, tk_launches, call_again=lambda: fn(*args))
    return out, ms


def _prepare(case: Case, spec, dtype, shape, args, expected, settings: Settings, say, label: str, progress) -> None:
    """Build, first call, correctness, kernel count and peak memory of one variant."""
    v, rec, device = case.variant, case.record, settings.device
    case.stage = "build"
    try:
        say(f"{v.name}: building" + (" and compiling" if v.compiled else ""))
        out, rec["first_call_ms"] = _build_and_first_call(case, spec, dtype, shape, args, settings, label, progress)
        case.stage = "check"
        rel, max_abs = errors(out, expected)
        del out
        rec["rel_error"], rec["max_abs_error"] = rel, max_abs
        tol = rec["tolerance"]
        rec["status"] = "ok" if tol is not None and rel <= tol else "wrong"
        if rec["status"] == "wrong":
            rec["error"] = f"relative error {rel:.3g} above the tolerance {tol}"
        case.stage = "kernel count"
        say(f"{v.name}: counting kernels", True)
        prof = kernels.profile_call(case.fn, args, device)
        rec["kernels"], rec["kernel_unit"], rec["kernel_names"] = prof.count, prof.unit, prof.names
        rec["kernel_us"] = {k: round(t, 3) for k, t in prof.device_us.items()}
        case.stage = "peak memory"
        rec["peak_bytes"] = timing.peak_bytes(case.fn, args, device)
        if settings.profile_dir is not None:
            case.stage = "profile"
            say(f"{v.name}: profiling", True)
            profiling.trace_variant(case.fn, args, device, settings.profile_dir, v.name, rec["dtype"], rec["shape_label"])
    except VariantSkipped as e:
        rec["status"], rec["error"], case.fn = "skipped", str(e), None
        say(f"{v.name}: skipped, {e}")
    except Exception as e:  # noqa: BLE001 - one variant failing must not stop the sweep
        if case.stage in ("kernel count", "peak memory", "profile"):  # the variant itself works: keep it, note what failed
            rec["error"] = error_text(case.stage, e)
        else:
            rec["status"], rec["error"], case.fn = "failed", error_text(case.stage, e), None
            rec["traceback"] = traceback.format_exc(limit=-8)[-4000:]
        _free(device)


def _time(cases: list[Case], args, settings: Settings, progress) -> None:
    device = settings.device
    progress(f"timing {sum(c.fn is not None for c in cases)} variants, {settings.rounds} interleaved round(s)")
    for r in range(settings.rounds):
        for case in cases:
            if case.fn is None:
                continue
            progress(f"{case.variant.name}: timing, round {r + 1}/{settings.rounds}", True)
            rec = case.record
            try:
                with profiling.timed_region(f"{case.variant.name} {rec['dtype']} {rec['shape_label']}", device):
                    case.samples.add(timing.bench(case.fn, args, device, settings.rep_ms))
            except Exception as e:  # noqa: BLE001
                case.record["status"], case.record["error"] = "failed", error_text("timing", e)
                case.fn = None
                _free(device)
    timed = [c for c in cases if c.fn is not None and c.samples.ms]
    for case in timed:
        s, rec = case.samples, case.record
        rec["median_ms"], rec["p20_ms"], rec["p80_ms"] = s.median, s.quantile(0.2), s.quantile(0.8)
        rec["samples"] = len(s.ms)
    # A small call: every variant also gets its CUDA-graph replay time, the time
    # without host overhead (a variant with a slow host path is small too).
    # "Small" is the fastest variant's median, so one slow variant does not decide.
    if settings.cudagraph and device.type == "cuda" and timed and min(c.samples.median for c in timed) < CUDAGRAPH_BELOW_MS:
        _time_graphs(timed, args, settings, progress)


def _time_graphs(cases: list[Case], args, settings: Settings, progress) -> None:
    """Each variant's CUDA-graph replay time: the median of its replays over interleaved rounds,
    as for the medians, so that a disturbance of the GPU during one variant's turn (a clock
    change, another process) does not decide its figure.  A variant that cannot be captured
    (a host sync) or fails while replaying gets none; the others keep theirs."""
    graphed = {id(case): timing.Samples() for case in cases}  # the variants still captured, by identity
    rep_ms = max(settings.rep_ms / 2, 10) / settings.rounds
    for r in range(settings.rounds):
        for case in cases:
            if id(case) not in graphed:
                continue
            progress(f"{case.variant.name}: CUDA-graph replay, round {r + 1}/{settings.rounds}", True)
            try:
                times = timing.cudagraph_times(case.fn, args, rep_ms=rep_ms)
            except Exception:  # noqa: BLE001 - a replay that fails (out of memory) costs this variant its graph time only
                times = None
                _free(settings.device)
            if times is None:
                del graphed[id(case)]
            else:
                graphed[id(case)].add(times)
    for case in cases:
        times = graphed.get(id(case))
        case.record["cudagraph_ms"] = times.median if times is not None else None
        if times is not None and not times.stable:
            _flag(case.record, NOISY_GRAPH)


def _flag(record: dict, code: str) -> None:
    flags = record.setdefault("flags", [])
    if code not in flags:
        flags.append(code)


def derive(records: list[dict], bound: str, limit: float | None, limit_stable: bool = True) -> None:
    """Throughput, share of the limit, speed-ups, the best mark and the flags of the figures
    that are not stable (``record.FLAGS``) for one (dtype, shape)."""
    by_name = {r["variant"]: r for r in records}
    for r in records:
        if r["median_ms"] is not None and not timing.is_stable(r["p20_ms"], r["p80_ms"], r["samples"]):
            _flag(r, NOISY)

    def usable(r):
        return r is not None and r["median_ms"] and r["status"] in ("ok", "wrong") and not r["interpreted"]

    eager = by_name.get("eager")
    compiled = next((r for r in records if r["kind"] == "compile"), None)
    for r in records:
        if not usable(r):
            continue
        sec = r["median_ms"] * 1e-3
        r["gbps"] = r["bytes"] / sec / 1e9
        r["tflops"] = r["flops"] / sec / 1e12
        value = r["tflops"] if bound == "compute" else r["gbps"]
        r["limit_share"] = value / limit if limit else None
        if r["limit_share"] is not None:
            if r["limit_share"] > 1:
                _flag(r, ABOVE_LIMIT)
            if not limit_stable:
                _flag(r, UNSTABLE_LIMIT)
        if usable(eager) and eager["status"] == "ok":
            r["speedup_vs_eager"] = eager["median_ms"] / r["median_ms"]
            if NOISY in eager["flags"] and r is not eager:
                _flag(r, NOISY_EAGER)
        if usable(compiled) and compiled["status"] == "ok":
            r["speedup_vs_compile"] = compiled["median_ms"] / r["median_ms"]
            if NOISY in compiled["flags"] and r is not compiled:
                _flag(r, NOISY_COMPILE)
    ranked = [r for r in records if usable(r) and r["status"] == "ok"]
    if ranked:
        min(ranked, key=lambda r: r["median_ms"])["best"] = True


def _result_dtypes(spec, args, dtype: torch.dtype, count: int) -> list[torch.dtype]:
    """The dtypes PyTorch's reference returns for these inputs (run on meta copies: no work),
    which may not be the inputs' (softmax_to_float32); ``dtype`` for each where it cannot say."""
    try:
        meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
        found = [t.dtype for t in _tensors(spec.reference(*meta))]
    except Exception:  # noqa: BLE001 - a reference with no meta kernel
        found = []
    return found if len(found) == count else [dtype] * count


def _apply_rounding_floor(records: list[dict], expected: list[torch.Tensor], dtypes: list[torch.dtype]) -> None:
    """Raise the tolerance to twice the error of the exact answer rounded to the results' dtypes.

    A result of ``dtype`` cannot be closer to the float64 answer than that
    answer's own rounding: float16 softmax rows of 262144 columns hold values
    near 4e-6, subnormal in float16, whose rounding alone is 2.7e-3, above the
    spec's 2e-3.  Such a case says nothing about the kernels, so no variant is
    marked wrong for it.
    """
    rounding, _ = errors([e.to(d) for e, d in zip(expected, dtypes, strict=True)], expected)
    for r in records:
        r["rounding_error"] = rounding
        if r["tolerance"] is not None and math.isfinite(rounding):
            r["tolerance"] = max(r["tolerance"], 2.0 * rounding)


def sweep_case(spec, variants, dtype, shape, settings: Settings, limits: dict, progress) -> list[dict]:
    """All records of one (dtype, shape)."""
    device = settings.device
    cases = [Case(v, base_record(spec, v, dtype, shape, settings)) for v in variants]
    label = f"{spec.name} {limits_mod.dtype_name(dtype)} {spec.describe(shape)}"

    def say(text, detail=False):
        progress.status(f"{label} | {text}", detail)

    args = expected = None
    try:
        say("inputs and float64 reference")
        torch.manual_seed(0)
        args = spec.make_inputs(shape, dtype, device)
        expected = reference64(spec, args, device)
    except Exception as e:  # noqa: BLE001
        for c in cases:
            c.record["error"] = error_text("inputs", e)
            if c.variant.kind == "peer":  # a peer that is not installed stays "skipped"
                try:
                    c.variant.build(device)
                except VariantSkipped as skip:
                    c.record["status"], c.record["error"] = "skipped", str(skip)
                except Exception:  # noqa: BLE001 - it failed anyway, for the reason above
                    pass
        _free(device)
        return [c.record for c in cases]

    _apply_rounding_floor([c.record for c in cases], expected, _result_dtypes(spec, args, dtype, len(expected)))
    if any(v.compiled for v in variants):
        torch._dynamo.reset()  # a fresh compile per shape: no dynamic shapes, no reused autotune result
    pristine = _snapshot(args, device)
    for c in cases:
        _prepare(c, spec, dtype, shape, args, expected, settings, say, label, progress)
        if not _restore_inputs(args, pristine):  # it wrote into its inputs: the others get them back
            c.record["status"], c.fn = "failed", None
            c.record["error"] = "check: the variant changed its inputs in place (restored for the other variants)"
    del pristine
    del expected
    _free(device)
    _time(cases, args, settings, say)
    if device.type == "cuda":
        clock = environment.sm_clock_mhz()
        for c in cases:
            c.record["sm_clock_mhz"] = clock
    records = [c.record for c in cases]
    limit, _ = limits_mod.limit_for(limits, spec.bound, dtype)
    derive(records, spec.bound, limit, limits_mod.limit_stable(limits, spec.bound, dtype))
    for c in cases:
        c.fn = None
    del args, cases
    _free(device)
    return records


def sweep(spec, variants, dtypes, shapes, settings: Settings, limits: dict, progress, on_records=None) -> list[dict]:
    records = []
    for dtype in dtypes:
        for shape in shapes:
            found = sweep_case(spec, variants, dtype, shape, settings, limits, progress)
            records.extend(found)
            if on_records:
                on_records(found)
    return records


def run_dir_name(now, pid: int) -> str:
    return now.strftime("%Y%m%dT%H%M%SZ") + f"-{pid}"


def ensure_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
