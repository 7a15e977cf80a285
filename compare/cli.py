"""``python -m compare``: the command line, from the flags to the sweeps a run makes (``session`` runs them)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from . import configs, environment, interrupts, layout, runner, session
from .progress import Progress
from .selection import (  # noqa: F401 - the parsing every command shares; these names stay readable here
    ALIASES,
    DTYPES,
    DTYPES_HELP,
    SHAPE_SETS,
    UsageError,
    _split,
    default_dtypes,
    default_shapes,
    op_names,
    parse_dtypes,
    parse_shapes,
    valid_dtypes,
)
from .session import Sweep
from .variants import KINDS, all_variants, select

# Per variant and round: do_bench's rep (CUDA) or the wall-clock budget (CPU), in ms.
DEFAULT_REP_MS = {"cuda": 40.0, "cpu": 50.0}
DEFAULT_ROUNDS = {"cuda": 3, "cpu": 2}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m compare",
        description="Compare every variant of a tk op (eager, unfused, torch.compile, tk, peers) on the same inputs.",
    )
    p.add_argument("--op", default="gelu", help="op name, comma-separated names, or 'all' (default: gelu)")
    p.add_argument("--dtypes", "--dtype", default=None,
                   help=f"{DTYPES_HELP}; default: the spec's dtypes on a GPU, float32 on CPU")  # fmt: skip
    p.add_argument("--shapes", "--sizes", default=None,
                   help="comma-separated shapes, dims joined by 'x' (gelu: 1024,1048576; softmax: 4096x1024), or a set: "
                        "'sweep' (the op's own), 'real' (its calls in real models, GPU), 'all' (both, the default on a GPU)")  # fmt: skip
    p.add_argument("--variants", default=None,
                   help="comma-separated variant names or kinds (eager, unfused, compile, max-autotune, tk, tk-plan, peer);"
                        " default: all")  # fmt: skip
    p.add_argument("--max-autotune", action="store_true",
                   help="add torch.compile mode='max-autotune-no-cudagraphs' variants (tens of seconds per shape)")  # fmt: skip
    p.add_argument("--quick", action="store_true",
                   help="one dtype, one short round; the first and last shape on a GPU, the first shape alone on a CPU"
                        " (Triton's interpreter makes the last ones take minutes)")  # fmt: skip
    p.add_argument("--out", default="logs", help="output root (default: logs)")
    environment.add_device_flag(p)
    p.add_argument("--gpus", default="1",
                   help="spread the sweep over this many GPUs, or 'all': one worker process per GPU, each taking the"
                        " next (op, dtype, shape) case as it is free; one run folder and summary, as one GPU writes"
                        " (with --device cpu: that many worker processes on the CPU); default: 1")  # fmt: skip
    p.add_argument("--rep-ms", type=float, default=None, help="timing per variant and round, ms (default: 40 on CUDA, 50 on CPU)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default: 3 on CUDA, 2 on CPU)")
    p.add_argument("--no-capture", action="store_true", help="do not capture Inductor's output code")
    p.add_argument("--ir", action=argparse.BooleanOptionalAction, default=None,
                   help="store the compiled levels (TTIR, TTGIR, LLIR, PTX, SASS) of tk's kernels for each case: on a"
                        " GPU those that ran (the default there), on a CPU those an H100 would run, compiled for sm_90"
                        " (about a second a kernel: off by default there)")  # fmt: skip
    p.add_argument("--profile", action="store_true",
                   help="a torch.profiler Chrome trace and key_averages table of each variant (profile/ in the report)")
    p.add_argument("--ncu", action="store_true",
                   help="Nsight Compute over the sweep's first case, one variant at a time (GPU, ncu on PATH):"
                        " bandwidth, occupancy, registers, spills per kernel (ncu/ in the report)")  # fmt: skip
    p.add_argument("--configs", action="store_true",
                   help="also time tk's kernel under each configuration its op declares (block sizes, warps, stages:"
                        " matmul's autotuner candidates) on every selected shape: a table in report.md and configs.png"
                        " (on a CPU, interpreter times: no performance figure)")  # fmt: skip
    p.add_argument("--no-cudagraph", action="store_true", help="skip the CUDA-graph replay time of small calls")
    p.add_argument("--quiet", action="store_true", help="no progress line, no tables on the terminal")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # "k/n": a worker of a split sweep (split.py)
    p.add_argument("--worker-run", default=None, help=argparse.SUPPRESS)  # that sweep's run folder
    return p


def _selected(spec, wanted: list[str] | None, max_autotune: bool, several: bool) -> list:
    """The op's variants named by ``wanted`` (by name or kind).  With several ops a name only some ops have
    selects nothing in the others; with one op an unknown name is an error."""
    variants = all_variants(spec, max_autotune=max_autotune)
    if wanted and several:
        wanted = [w for w in wanted if w in KINDS or any(v.name == w for v in variants)]
        if not wanted:
            return []
    return select(variants, wanted)


def _empty_selection(spec, variants: list, args, device: torch.device) -> str | None:
    """Why the op's selection has nothing that can run on ``device``, or None when it has."""
    if not variants:
        names = ", ".join(v.name for v in all_variants(spec, max_autotune=True))
        return f"op {spec.name} has no variant {args.variants!r} (it has: {names})"
    if all(v.kind == "peer" and device.type not in v.peer_devices for v in variants):
        where = ", ".join(sorted({d for v in variants for d in v.peer_devices}))
        chosen = ", ".join(v.name for v in variants)
        return f"the selected variants of {spec.name} ({chosen}) run on {where} only, not on {device.type}"
    return None


def make_sweeps(args, device: torch.device, notes: list[str] | None = None) -> list[Sweep]:
    """Per op, what its sweep runs.  An op whose selection is empty is a usage error; with several ops it is left
    out (``notes`` says why), and an error only when every op is."""
    import ops

    from .models import model_specs

    models = model_specs()  # examples/: models compared as a whole, run by name ("all" is every op)
    specs = {**ops.SPECS, **models}
    known = f"known ops: {', '.join(sorted(ops.SPECS))}; models: {', '.join(sorted(models)) or 'none'}; or all"
    names = op_names(args.op, specs, known)
    if args.configs:
        configs.check(names, specs)
    if args.shapes and args.shapes not in SHAPE_SETS and len(names) > 1:
        raise UsageError(f"--shapes needs a single op (shapes differ between ops), or one of {', '.join(SHAPE_SETS)}")
    wanted = _split(args.variants) if args.variants else None
    max_autotune = args.max_autotune or any("max-autotune" in w for w in wanted or [])
    if wanted and len(names) > 1:
        every = {v.name for name in names for v in all_variants(specs[name], max_autotune=True)}
        unknown = [w for w in wanted if w not in KINDS and w not in every]
        if unknown:
            kinds = ", ".join(KINDS)
            raise UsageError(f"unknown variant(s) {', '.join(unknown)}: no op of {args.op} has them (kinds: {kinds})")
    sweeps, left_out = [], []
    for name in names:
        spec = specs[name]
        dtypes = parse_dtypes(args.dtypes, spec) if args.dtypes else default_dtypes(spec, device)
        shapes = default_shapes(spec, device, args.shapes or "all") if args.shapes in (None, *SHAPE_SETS) else (
            parse_shapes(args.shapes, spec)
        )
        if args.quick:  # see --quick's help: on a CPU the interpreter makes the last shapes slow
            shapes = shapes[:1] if device.type != "cuda" else list(dict.fromkeys([shapes[0], shapes[-1]]))
            dtypes = dtypes[:1]
        try:
            variants = _selected(spec, wanted, max_autotune, len(names) > 1)
        except ValueError as e:
            raise UsageError(f"op {name}: {e}") from None
        why = _empty_selection(spec, variants, args, device)
        if why is not None:
            if len(names) == 1:
                raise UsageError(f"{why}: nothing to run")
            left_out.append(why)
            continue
        sweeps.append(Sweep(spec, dtypes, shapes, variants))
    if not sweeps:
        raise UsageError("nothing to run: " + "; ".join(left_out))
    if notes is not None:
        notes += [f"left out: {why}" for why in left_out]
    return sweeps


def parse_gpus(text: str, device: torch.device) -> list[str]:
    """The devices a sweep is spread over, as CUDA_VISIBLE_DEVICES names them (one worker each); one: no workers."""
    if device.type == "cuda":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = _split(visible) if visible else [str(i) for i in range(torch.cuda.device_count())]
        if text == "all":
            return ids
    elif text == "all":
        raise UsageError("--gpus all needs CUDA devices; with --device cpu give the number of worker processes")
    try:
        count = int(text)
    except ValueError:
        raise UsageError(f"--gpus {text!r}: a number of GPUs, or all") from None
    if count < 1:
        raise UsageError(f"--gpus {text!r}: at least 1")
    if device.type != "cuda":
        return [str(i) for i in range(count)]  # worker processes on the CPU, pinned as GPUs would be
    if count > len(ids):
        raise UsageError(f"--gpus {count}: only {len(ids)} GPU(s) visible ({', '.join(ids) or 'none'})")
    return ids[:count]


def settings_from(args, device: torch.device) -> runner.Settings:
    rep_ms = args.rep_ms or DEFAULT_REP_MS[device.type]
    rounds = args.rounds or DEFAULT_ROUNDS[device.type]
    if args.quick:
        rep_ms, rounds = (args.rep_ms or rep_ms / 2), (args.rounds or 1)
    return runner.Settings(device=device, rep_ms=rep_ms, rounds=rounds, cudagraph=not args.no_cudagraph,
                           profile=args.profile, ir=args.ir, ncu=args.ncu, configs=args.configs)  # fmt: skip


def main(argv=None) -> int:
    with interrupts.sigterm_as_interrupt():
        return _main(list(sys.argv[1:] if argv is None else argv))


def _main(argv: list[str]) -> int:
    from . import split

    p = parser()
    args = p.parse_args(argv)
    device = environment.chosen_device(p, args.device)
    notes: list[str] = []
    try:
        sweeps = make_sweeps(args, device, notes)
        gpus = parse_gpus(args.gpus, device) if args.worker is None else []
    except UsageError as e:
        p.error(str(e))
    if args.rounds is not None and args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.configs and len(gpus) > 1:
        p.error("--configs runs in one process: leave out --gpus")
    if args.ncu:
        from . import ncu

        why = ncu.unavailable(device, len(gpus))
        if why:
            p.error(f"--ncu: {why}")
    settings = settings_from(args, device)
    if args.worker is not None:  # one worker of a split sweep: its cases come from the parent
        return split.serve(sweeps, settings, Path(args.worker_run), args.worker, not args.no_capture)
    progress = Progress(enabled=not args.quiet)
    root = Path(args.out)
    try:
        run_dir = layout.new_run_dir(root)
    except OSError as e:  # read-only, full, or not a folder: nothing has run yet
        progress.message(f"error: cannot create a run folder under {root}/: {e}")
        return 1
    progress.message(f"run folder: {run_dir}")
    if device.type != "cuda":  # said first and last, so that it is on the screen a newcomer looks at
        progress.message(GPU_FIGURES)
    for note in notes:
        progress.message(note)
    run = session.Run(root, run_dir, progress, args.quiet)
    if len(gpus) > 1:
        return split.run_split(sweeps, run, settings, gpus, argv, quick=args.quick, capture=not args.no_capture)
    status = session.run_here(sweeps, run, settings, quick=args.quick, capture=not args.no_capture)
    if device.type != "cuda" and status == 0:
        progress.message(GPU_FIGURES)
    return status


# What a run without a GPU ends by saying: it cannot show a kernel's speed, and where the GPU's figures are.
GPU_FIGURES = (
    "No GPU here: tk's kernels ran in Triton's interpreter, whose times are no performance figure. "
    "The H100's figures: logs/examples/h100/README.md (every op: logs/examples/h100/sweep/summary.md)."
)


if __name__ == "__main__":
    sys.exit(main())
