"""One run of the harness after its flags are read: each op's report written whole, the links, the summary.

A run writes into its own folder (``layout``).  For each op:

1. the sweep fills a report document (``new_doc``), results.json saved after
   every (dtype, shape) so that a crash keeps what ran;
2. ``Run.write_report`` writes every page of it (results.json, results.csv,
   throughput.png, report.md, the capture's index and report.html), interrupts waiting
   until the pages are whole (``interrupts.deferred``);
3. ``Run.publish`` prints its tables and points ``<out>/<op>`` at it, unless
   nothing in it ran (every variant skipped: an earlier good report is not
   replaced by an empty one).

``Run.finish`` writes summary.md over the ops and points ``<out>/latest`` at
the run when every op was written and linked.  A run in one process is
``run_here``; a sweep spread over a host's GPUs is ``split.run_split``, which
uses the same steps.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import interrupts, layout, limits as limits_mod, report, runner, schema, summary, timing
from .progress import Progress


@dataclass
class Sweep:
    """What one op's sweep runs: its spec, dtypes, shapes and variants, every (dtype, shape) a case."""

    spec: object
    dtypes: list
    shapes: list
    variants: list

    def cases(self) -> list[tuple]:
        """(dtype, shape) in sweep order: every shape of the first dtype, then of the next."""
        return [(dtype, shape) for dtype in self.dtypes for shape in self.shapes]


class ReportNotWritten(Exception):
    """The sweep ran but its report could not be written (a full disk, a read-only folder)."""

    def __init__(self, doc: dict, folder: Path, error: OSError):
        super().__init__(f"the report of {doc['op']} could not be written to {folder}: {error}")
        self.doc, self.folder, self.error = doc, folder, error


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def skipped(records: list[dict]) -> list[dict]:
    seen = {}
    for r in records:
        if r["status"] == "skipped":
            seen.setdefault(r["variant"], r["error"])
    return [{"variant": k, "reason": v} for k, v in seen.items()]


def new_doc(
    sweep: Sweep, settings: runner.Settings, env: dict, lim: dict, quick: bool, capture: bool, workers: int = 1
) -> dict:
    spec = sweep.spec
    return {
        "schema": schema.SCHEMA,
        "schema_version": schema.SCHEMA_VERSION,
        "op": spec.name,
        "call": spec.call,  # what is compared, in words (an op's arguments: gelu's approximation...)
        "bound": spec.bound,
        "complete": False,
        "started_utc": now_utc(),
        "finished_utc": None,
        "settings": {
            "device": settings.device.type,
            "dtypes": [limits_mod.dtype_name(d) for d in sweep.dtypes],
            "shapes": [list(s) for s in sweep.shapes],
            "shape_labels": [spec.describe(s) for s in sweep.shapes],
            "variants": [v.name for v in sweep.variants],
            "rep_ms": settings.rep_ms,
            "rounds": settings.rounds,
            "timing_method": timing.method(settings.device),
            "quick": bool(quick),
            "capture": capture,
            "workers": workers,
            "profile": settings.profile,
            "ir": bool(capture) and (settings.ir if settings.ir is not None else settings.device.type == "cuda"),
            "configs": settings.configs,
        },
        "environment": env,
        "limits": lim,
        "skipped": [],
        "records": [],
    }


def ran(doc: dict) -> bool:
    """Whether some variant of the report ran (was not skipped)."""
    return any(r["status"] != "skipped" for r in doc["records"])


class Run:
    """One run's folder, its ops' reports and links, and what to tell the user about them."""

    def __init__(self, root: Path, run_dir: Path, progress: Progress, quiet: bool):
        self.root, self.run_dir, self.progress, self.quiet = Path(root), run_dir, progress, quiet
        self.docs: list[dict] = []  # the reports written
        self.unwritten: list[str] = []  # ops whose report or link could not be written
        self.held_back: list[str] = []  # ops whose report is written but may not replace the previous one
        self.linked: list[str] = []  # ops whose link now names this run
        self.written: dict[str, dict] = {}  # op -> its report, once its pages are written

    def op_dir(self, op: str) -> Path:
        path = self.run_dir / op
        path.mkdir(parents=True, exist_ok=True)
        return path

    def partial_saver(self, doc: dict, key: str = "records") -> Callable[[list[dict]], None]:
        """A callback that adds a case's records to ``doc[key]`` and saves results.json: a crash keeps them."""
        op_dir = self.op_dir(doc["op"])
        doc.setdefault(key, [])

        def save(found: list[dict]) -> None:
            doc[key].extend(found)
            try:
                report.write_json(doc, op_dir)
            except OSError as e:  # a full disk must not stop the sweep; the final write reports it
                note = f"partial results not saved: {e}"
                if note not in doc.setdefault("notes", []):
                    doc["notes"].append(note)
                    self.progress.message(f"warning: {note}")

        return save

    def write_report(self, doc: dict, index: Callable[[dict], None] | None = None) -> None:
        """Every page of ``doc``, whole: an interrupt waits until they are written.  ``index(doc)`` writes the
        capture's index.  ReportNotWritten when the disk refuses them."""
        op_dir = self.op_dir(doc["op"])
        with interrupts.deferred(self.progress.message):
            doc["finished_utc"] = now_utc()
            doc["skipped"] = skipped(doc["records"])
            if index is not None:
                try:
                    index(doc)
                except Exception as e:  # noqa: BLE001 - the comparison stands without the capture
                    doc.setdefault("notes", []).append(f"capture index not written: {type(e).__name__}: {e}")
            self.progress.close()
            try:
                report.write_all(doc, op_dir)
                write_html(doc, op_dir)
            except OSError as e:
                raise ReportNotWritten(doc, op_dir, e) from e
            self.written[doc["op"]] = doc

    def not_written(self, error: ReportNotWritten) -> None:
        """The results are only on the terminal now; the next op may still fit."""
        if not self.quiet:
            self.progress.message("\n" + report.terminal_tables(error.doc) + "\n")
        self.progress.message(f"error: {error}; {self.root / error.doc['op']} still names the previous report")
        self.unwritten.append(error.doc["op"])

    def publish(self, doc: dict, held_back: str | None = None) -> None:
        """The op's tables on the terminal and its link, once its report is written.  ``held_back``: why the
        report may not replace the previous one although it is written (cases lost with a worker)."""
        op = doc["op"]
        self.docs.append(doc)
        with interrupts.deferred(self.progress.message):
            if not self.quiet:
                self.progress.message("\n" + report.terminal_tables(doc) + "\n")
            op_dir, link = self.run_dir / op, self.root / op
            if held_back is None and not ran(doc):
                reasons = "; ".join(f"{s['variant']}: {s['reason']}" for s in doc["skipped"]) or "no variant"
                held_back = f"no variant of {op} ran ({reasons})"
            if held_back is not None:
                self.progress.message(f"error: {held_back}; its report is in {op_dir}")
                self.progress.message(f"{link} still names the previous report")
                self.held_back.append(op)
                return
            if not self._repoint(link, op_dir):
                self.unwritten.append(op)
                return
            self.linked.append(op)
            self.progress.message(f"{op}: report in {link}/ (= {op_dir})")

    def interrupted(self) -> int:
        """What an interrupt left, said as it is; the exit status 130."""
        self.progress.close()
        unlinked = [doc for op, doc in self.written.items() if op not in self.linked]
        complete = [doc["op"] for doc in unlinked if doc["complete"]]
        said = []
        if len(complete) < len(unlinked) or not unlinked:
            partial = [doc["op"] for doc in unlinked if not doc["complete"]]
            said.append(f"partial report in {self.run_dir}" + (f" ({', '.join(partial)}: what ran)" if partial else ""))
        if complete:
            where = ", ".join(str(self.run_dir / op) for op in complete)
            said.append(f"the report of {', '.join(complete)} in {where} is complete (every case ran)")
        if self.linked:
            said.append(f"{', '.join(self.linked)}: linked before the interrupt")
        others = "the other op links" if self.linked else "the op links"
        self.progress.message(f"interrupted: {'; '.join(said)}; {self.root}/latest and {others} are unchanged")
        return 130

    def finish(self) -> int:
        """summary.md over the ops (more than one), and ``latest`` when every op was written and linked."""
        if len(self.docs) > 1:
            path = self.run_dir / "summary.md"
            try:
                path.write_text(summary.markdown(self.docs))
                self.progress.message(f"every op at a glance: {path}")
            except OSError as e:  # the op reports stand without it
                self.progress.message(f"error: cannot write {path}: {e}")
        if self.unwritten or self.held_back:  # latest names complete runs only
            lists = (("not written", self.unwritten), ("not linked", self.held_back))
            parts = [f"{what}: {', '.join(ops)}" for what, ops in lists if ops]
            self.progress.message(f"error: {'; '.join(parts)}; {self.root}/latest is unchanged")
            return 1
        return 0 if self._repoint(self.root / "latest", self.run_dir) else 1

    def _repoint(self, link: Path, target: Path) -> bool:
        """Point ``link`` at ``target``; a clear message, and False, when it cannot be done."""
        try:
            if layout.repoint(link, target):
                return True
            self.progress.message(f"note: {link} is not a link; left as it is")
            return True  # the report is written; the user keeps their own folder there
        except OSError as e:
            self.progress.message(f"error: cannot point {link} at {target}: {e}; it still names the previous report")
            return False


def write_html(doc: dict, op_dir: Path) -> None:
    """report.html, last: it reads the other pages' files (the plot, the capture's index, the profiles).
    A full disk is the report's failure; anything else only costs the page (report.md stands)."""
    from . import html

    try:
        html.write(doc, op_dir)
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001
        doc.setdefault("notes", []).append(f"report.html not written: {type(e).__name__}: {e}")


def capture_for(sweep: Sweep, op_dir: Path, device, wanted: bool, ir: bool | None = None):
    """The capture of the op's compiled variants' output code and of tk's launches, or None (off, or neither
    kind of variant in the sweep).  ``ir``: tk's compiled levels too (None: on a GPU)."""
    if not wanted or not any(v.compiled or v.kind == "tk" for v in sweep.variants):
        return None
    try:
        from .capture import Capture
    except ImportError:
        return None
    return Capture(op_dir, sweep.spec, device, ir=ir)


def run_op(sweep: Sweep, run: Run, settings: runner.Settings, env: dict, lim: dict, quick: bool, capture: bool) -> dict:
    """Sweep one op in this process into ``<run>/<op>``; its pages are written whole, even when interrupted."""
    op_dir = run.op_dir(sweep.spec.name)
    settings.capture = capture_for(sweep, op_dir, settings.device, capture, settings.ir)
    settings.profile_dir = op_dir / "profile" if settings.profile else None
    doc = new_doc(sweep, settings, env, lim, quick, settings.capture is not None)
    try:
        runner.sweep(sweep.spec, sweep.variants, sweep.dtypes, sweep.shapes, settings, lim, run.progress,
                     on_records=run.partial_saver(doc))  # fmt: skip
        if settings.configs:
            from . import configs

            configs.sweep(sweep, settings, lim, run.progress, on_records=run.partial_saver(doc, "configs"))
        if settings.ncu:
            from . import ncu

            doc["ncu"] = ncu.profile_case(sweep, op_dir, run.progress)
        doc["complete"] = True
    finally:
        run.write_report(doc, settings.capture.finish if settings.capture is not None else None)
    return doc


def run_here(sweeps: list[Sweep], run: Run, settings: runner.Settings, quick: bool, capture: bool) -> int:
    """Every op, one after the other, in this process."""
    from . import environment

    env = environment.describe(settings.device)
    dtypes = list(dict.fromkeys(d for sweep in sweeps for d in sweep.dtypes))
    try:
        lim = limits_mod.measure(settings.device, dtypes, settings.rep_ms, run.progress)
        for sweep in sweeps:
            try:
                doc = run_op(sweep, run, settings, env, lim, quick, capture)
            except ReportNotWritten as e:
                run.not_written(e)
                continue
            run.publish(doc)
    except KeyboardInterrupt:
        return run.interrupted()
    return run.finish()
