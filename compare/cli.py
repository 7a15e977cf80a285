"""``python -m compare``: the command line, and one run from start to end."""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from . import environment, layout, limits as limits_mod, report, runner, schema, summary, timing
from .progress import Progress
from .variants import all_variants, select

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "uint8": torch.uint8,  # images (rgb_to_grayscale)
}
ALIASES = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp64": "float64", "double": "float64"}

# Per variant and round: do_bench's rep (CUDA) or the wall-clock budget (CPU), in ms.
DEFAULT_REP_MS = {"cuda": 40.0, "cpu": 50.0}
DEFAULT_ROUNDS = {"cuda": 3, "cpu": 2}


class UsageError(Exception):
    pass


class ReportNotWritten(Exception):
    """The sweep ran but its report could not be written (a full disk, a read-only folder)."""

    def __init__(self, doc: dict, folder: Path, error: OSError):
        super().__init__(f"the report of {doc['op']} could not be written to {folder}: {error}")
        self.doc, self.folder, self.error = doc, folder, error


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m compare",
        description="Compare every variant of a tk op (eager, unfused, torch.compile, tk, peers) on the same inputs.",
    )
    p.add_argument("--op", default="gelu", help="op name, comma-separated names, or 'all' (default: gelu)")
    p.add_argument("--dtypes", "--dtype", default=None,
                   help="comma-separated dtypes (float32, float16, bfloat16, float64, uint8 where the op takes it); default: the spec's dtypes on a GPU, float32 on CPU")  # fmt: skip
    p.add_argument("--shapes", "--sizes", default=None,
                   help="comma-separated shapes, dims joined by 'x' (gelu: 1024,1048576; softmax: 4096x1024); default: the spec's sweep for the device")  # fmt: skip
    p.add_argument("--variants", default=None,
                   help="comma-separated variant names or kinds (eager, unfused, compile, max-autotune, tk, peer); default: all")  # fmt: skip
    p.add_argument("--max-autotune", action="store_true",
                   help="add torch.compile mode='max-autotune-no-cudagraphs' variants (tens of seconds per shape)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="first and last shape, one dtype, one short round")
    p.add_argument("--out", default="logs", help="output root (default: logs)")
    environment.add_device_flag(p)
    p.add_argument("--rep-ms", type=float, default=None, help="timing per variant and round, ms (default: 40 on CUDA, 50 on CPU)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default: 3 on CUDA, 2 on CPU)")
    p.add_argument("--no-capture", action="store_true", help="do not capture Inductor's output code")
    p.add_argument("--no-cudagraph", action="store_true", help="skip the CUDA-graph replay time of small calls")
    p.add_argument("--quiet", action="store_true", help="no progress line, no tables on the terminal")
    return p


@dataclass
class Plan:
    spec: object
    dtypes: list
    shapes: list
    variants: list


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_dtypes(text: str, spec) -> list:
    valid = [limits_mod.dtype_name(d) for d in DTYPES.values() if d in spec.tolerance]
    out = []
    for name in _split(text):
        name = ALIASES.get(name.lower(), name.lower())
        if name not in DTYPES or DTYPES[name] not in spec.tolerance:
            raise UsageError(f"unknown dtype {name!r} for op {spec.name}; valid dtypes: {', '.join(valid)}")
        out.append(DTYPES[name])
    if not out:
        raise UsageError(f"no dtype given; valid dtypes for {spec.name}: {', '.join(valid)}")
    return out


def parse_shapes(text: str, spec) -> list[tuple]:
    examples = next(iter(spec.shapes.values()), [])
    rank = len(examples[0]) if examples else None
    out = []
    for item in _split(text):
        try:
            shape = tuple(int(d) for d in item.lower().split("x"))
        except ValueError:
            raise UsageError(f"bad shape {item!r}: dims are integers joined by 'x', e.g. 4096x1024") from None
        if rank is not None and len(shape) != rank:
            ex = "x".join(map(str, examples[0]))
            raise UsageError(f"shape {item!r} of op {spec.name} needs {rank} dim(s), like {ex}")
        if any(d <= 0 for d in shape):
            raise UsageError(f"bad shape {item!r}: dims must be positive")
        out.append(shape)
    return out


def default_dtypes(spec, device: torch.device) -> list:
    if device.type == "cuda":
        return list(spec.dtypes)
    # One dtype on CPU, so that a fresh machine finishes in about a minute.
    return [torch.float32] if torch.float32 in spec.tolerance else [spec.dtypes[0]]


def make_plans(args, device: torch.device) -> list[Plan]:
    import ops

    from .models import model_specs

    models = model_specs()  # examples/: models compared as a whole, run by name ("all" is every op)
    specs = {**ops.SPECS, **models}
    known = f"known ops: {', '.join(sorted(ops.SPECS))}; models: {', '.join(sorted(models)) or 'none'}; or all"
    names = sorted(ops.SPECS) if args.op == "all" else _split(args.op)
    if not names:
        raise UsageError(f"no op given; {known}")
    for name in names:
        if name not in specs:
            raise UsageError(f"unknown op {name!r}; {known}")
    if args.shapes and len(names) > 1:
        raise UsageError("--shapes needs a single op (shapes differ between ops)")
    wanted = _split(args.variants) if args.variants else None
    max_autotune = args.max_autotune or any("max-autotune" in w for w in wanted or [])
    plans = []
    for name in names:
        spec = specs[name]
        dtypes = parse_dtypes(args.dtypes, spec) if args.dtypes else default_dtypes(spec, device)
        if args.shapes:
            shapes = parse_shapes(args.shapes, spec)
        else:
            shapes = list(spec.shapes.get(device.type) or spec.shapes.get("cpu") or [])
        if args.quick:
            shapes = shapes[:1] if device.type != "cuda" else list(dict.fromkeys([shapes[0], shapes[-1]]))
            dtypes = dtypes[:1]
        try:
            variants = select(all_variants(spec, max_autotune=max_autotune), wanted)
        except ValueError as e:
            raise UsageError(f"op {name}: {e}") from None
        plans.append(Plan(spec, dtypes, shapes, variants))
    return plans


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _skipped(records: list[dict]) -> list[dict]:
    seen = {}
    for r in records:
        if r["status"] == "skipped":
            seen.setdefault(r["variant"], r["error"])
    return [{"variant": k, "reason": v} for k, v in seen.items()]


def new_doc(plan: Plan, settings: runner.Settings, env: dict, lim: dict, args) -> dict:
    spec = plan.spec
    return {
        "schema": schema.SCHEMA,
        "schema_version": schema.SCHEMA_VERSION,
        "op": spec.name,
        "bound": spec.bound,
        "complete": False,
        "started_utc": _now(),
        "finished_utc": None,
        "settings": {
            "device": settings.device.type,
            "dtypes": [limits_mod.dtype_name(d) for d in plan.dtypes],
            "shapes": [list(s) for s in plan.shapes],
            "shape_labels": [spec.describe(s) for s in plan.shapes],
            "variants": [v.name for v in plan.variants],
            "rep_ms": settings.rep_ms,
            "rounds": settings.rounds,
            "timing_method": timing.method(settings.device),
            "quick": bool(args.quick),
            "capture": settings.capture is not None,
        },
        "environment": env,
        "limits": lim,
        "skipped": [],
        "records": [],
    }


def run_op(plan: Plan, run_dir: Path, settings: runner.Settings, env: dict, lim: dict, args, progress: Progress) -> dict:
    """Sweep one op into ``run_dir/<op>``; the report is written even when interrupted."""
    op_dir = layout_op_dir(run_dir, plan.spec.name)
    settings.capture = _capture_for(plan, op_dir, settings, args)
    doc = new_doc(plan, settings, env, lim, args)

    def partial(found):
        doc["records"].extend(found)
        try:
            report.write_json(doc, op_dir)  # the data so far survives a crash
        except OSError as e:  # a full disk must not stop the sweep; the final write reports it
            note = f"partial results not saved: {e}"
            if note not in doc.setdefault("notes", []):
                doc["notes"].append(note)
                progress.message(f"warning: {note}")

    write_error = None
    try:
        runner.sweep(plan.spec, plan.variants, plan.dtypes, plan.shapes, settings, lim, progress, on_records=partial)
        doc["complete"] = True
    finally:
        doc["finished_utc"] = _now()
        doc["skipped"] = _skipped(doc["records"])
        if settings.capture is not None:
            try:
                settings.capture.finish(doc)
            except Exception as e:  # noqa: BLE001 - the comparison stands without the capture
                doc.setdefault("notes", []).append(f"capture index not written: {type(e).__name__}: {e}")
        progress.close()
        try:
            report.write_all(doc, op_dir)
        except OSError as e:  # raised below, not here: an interrupt on its way out goes on
            write_error = e
    if write_error is not None:
        raise ReportNotWritten(doc, op_dir, write_error)
    return doc


def layout_op_dir(run_dir: Path, op: str) -> Path:
    path = run_dir / op
    path.mkdir(parents=True, exist_ok=True)
    return path


def _capture_for(plan: Plan, op_dir: Path, settings: runner.Settings, args):
    if args.no_capture or not any(v.compiled for v in plan.variants):
        return None
    try:
        from .capture import Capture
    except ImportError:
        return None
    return Capture(op_dir, plan.spec, settings.device)


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM (a job's time limit, ``kill``) stops a run the way Ctrl-C does:
    the partial report is written and the links are left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv=None) -> int:
    with _sigterm_as_interrupt():
        return _main(argv)


def _main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    device = environment.chosen_device(p, args.device)
    try:
        plans = make_plans(args, device)
    except UsageError as e:
        p.error(str(e))
    if args.rounds is not None and args.rounds < 1:
        p.error("--rounds must be at least 1")
    rep_ms = args.rep_ms or DEFAULT_REP_MS[device.type]
    rounds = args.rounds or DEFAULT_ROUNDS[device.type]
    if args.quick:
        rep_ms, rounds = (args.rep_ms or rep_ms / 2), (args.rounds or 1)
    settings = runner.Settings(device=device, rep_ms=rep_ms, rounds=rounds, cudagraph=not args.no_cudagraph)
    progress = Progress(enabled=not args.quiet)
    root = Path(args.out)
    try:
        run_dir = layout.new_run_dir(root)
    except OSError as e:  # read-only, full, or not a folder: nothing has run yet
        progress.message(f"error: cannot create a run folder under {root}/: {e}")
        return 1
    progress.message(f"run folder: {run_dir}")

    env = environment.describe(device)
    all_dtypes = list(dict.fromkeys(d for plan in plans for d in plan.dtypes))
    unwritten = []  # ops whose report or link could not be written
    docs = []
    try:
        lim = limits_mod.measure(device, all_dtypes, rep_ms, progress)
        for plan in plans:
            try:
                doc = run_op(plan, run_dir, settings, env, lim, args, progress)
                docs.append(doc)
            except ReportNotWritten as e:  # the results are only on the terminal now; the next op may still fit
                if not args.quiet:
                    progress.message("\n" + report.terminal_tables(e.doc) + "\n")
                progress.message(f"error: {e}; {root / plan.spec.name} still names the previous report")
                unwritten.append(plan.spec.name)
                continue
            if not args.quiet:
                progress.message("\n" + report.terminal_tables(doc) + "\n")
            op_dir = run_dir / plan.spec.name
            if not _repoint(root / plan.spec.name, op_dir, progress):
                unwritten.append(plan.spec.name)
                continue
            progress.message(f"{plan.spec.name}: report in {root / plan.spec.name}/ (= {op_dir})")
    except KeyboardInterrupt:
        progress.close()
        progress.message(f"interrupted: partial report in {run_dir}; {root}/latest and the op links are unchanged")
        return 130
    if len(docs) > 1:
        _write_summary(docs, run_dir, progress)
    if unwritten:  # latest names complete runs only
        progress.message(f"error: not written: {', '.join(unwritten)}; {root}/latest is unchanged")
        return 1
    return 0 if _repoint(root / "latest", run_dir, progress) else 1


def _write_summary(docs: list[dict], run_dir: Path, progress: Progress) -> None:
    """The one page over every op of the run (see summary.py)."""
    path = run_dir / "summary.md"
    try:
        path.write_text(summary.markdown(docs))
    except OSError as e:  # the op reports stand without it
        progress.message(f"error: cannot write {path}: {e}")
        return
    progress.message(f"every op at a glance: {path}")


def _repoint(link: Path, target: Path, progress: Progress) -> bool:
    """Point ``link`` at ``target``; a clear message, and False, when it cannot be done."""
    try:
        if layout.repoint(link, target):
            return True
        progress.message(f"note: {link} is not a link; left as it is")
        return True  # the report is written; the user keeps their own folder there
    except OSError as e:
        progress.message(f"error: cannot point {link} at {target}: {e}; it still names the previous report")
        return False


if __name__ == "__main__":
    sys.exit(main())
