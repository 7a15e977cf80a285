"""A sweep spread over a host's GPUs: ``python -m compare --gpus 4`` (``make bench GPUS=4``).

The parent starts one worker process per GPU (``python -m compare <the same
flags> --worker k/n``), each pinned to its GPU by ``CUDA_VISIBLE_DEVICES``,
and hands out the (op, dtype, shape) cases one at a time to whichever worker
is free, in sweep order, so that a slow case does not hold the others back.
A worker runs a case exactly as a one-process run does (``runner.sweep_case``)
and sends its records back; the parent puts each op's records in sweep order
and writes the op's pages as soon as its last case is in, into one run folder,
then one summary.md: the same files a one-GPU run writes.  Each record names
its ``worker``.

* The limits (copy bandwidth, matmul throughput) are measured once, by the
  first worker on its GPU, before any case runs; every case is judged
  against them (the GPUs of one host are alike; the SM clock of each case is
  read on its own GPU).
* A worker that dies (a crash, an illegal memory access that poisons its
  CUDA context) loses the case it was running: that case's records say so
  (``failed``, the worker's exit status), it is not run again, and a fresh
  worker takes the GPU (``RESTARTS`` times at most; then the others take its
  share).  An op with a lost case is written but not linked: it may not
  replace a good report.
* Every worker's environment has ``NCCL_NVLS_ENABLE=0``,
  ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` and ``NVSHMEM_DISABLE_NVLS=1``
  (NVLink multicast stays off on multi-GPU machines, although the sweep uses
  no NCCL).
* Each worker runs on its own block of the host's physical cores (``core_blocks``),
  and so does everything it starts: Inductor starts a compile process for each
  core it may use, and one worker's compile, left on every core, slowed the
  other worker's launch-bound calls up to 8x (two H100s, perf-notes).
* With ``--device cpu`` the workers run on the CPU, each on its block of
  cores: that is how the split and the merge are tested without GPUs.

Protocol: JSON lines, the parent's on the worker's stdin, the worker's on its
stdout (everything else a worker prints goes to its stderr, which the parent
shows prefixed ``[worker k]``).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import environment, limits as limits_mod, report, runner, session
from .progress import Progress

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
RESTARTS = 2  # fresh workers a GPU gets after its worker died
FINISH_TIMEOUT_S = 120  # how long the parent waits for a worker's last words (its tk kernels) at the end


def worker_command() -> list[str]:
    """The command a worker runs, before its flags (tests start their own script that registers a spec first)."""
    return [sys.executable, "-m", "compare"]


# --------------------------------------------------------------------------
# The worker.
# --------------------------------------------------------------------------


def serve(sweeps: list[session.Sweep], settings: runner.Settings, run_dir: Path, worker: str, capture: bool,
          inp=None, out=None) -> int:  # fmt: skip
    """Run the cases the parent sends until it says finish (see the module's docstring)."""
    from . import capture as capture_mod

    index, count = (int(part) for part in worker.split("/"))
    if out is None:  # the protocol keeps the real stdout; anything printed goes to stderr
        out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
    inp = inp or sys.stdin
    if settings.device.type == "cpu":  # the parent pinned this process to its cores where the OS can
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1) // count
        torch.set_num_threads(max(1, cores))
    sweeps_by_op = {s.spec.name: s for s in sweeps}
    captures: dict[str, object] = {}
    progress = Progress(stream=sys.stderr, statuses=False)  # notes only (a long first call), which the parent shows
    limits: dict | None = None

    def send(message: dict) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    try:
        for line in inp:
            msg = json.loads(line)
            if msg["do"] == "limits":
                dtypes = [_dtype(name) for name in msg["dtypes"]]
                limits = limits_mod.measure(settings.device, dtypes, settings.rep_ms)
                send({"limits": limits, "environment": environment.describe(settings.device)})
            elif msg["do"] == "start":
                limits = msg["limits"]
                send({"started": _pinning()})
            elif msg["do"] == "case":
                sweep = sweeps_by_op[msg["op"]]
                op_dir = run_dir / msg["op"]
                if msg["op"] not in captures:
                    captures[msg["op"]] = session.capture_for(sweep, op_dir, settings.device, capture, settings.ir)
                settings.capture = captures[msg["op"]]
                settings.profile_dir = op_dir / "profile" if settings.profile else None
                before = len(settings.capture.entries) if settings.capture is not None else 0
                records = runner.sweep_case(sweep.spec, sweep.variants, _dtype(msg["dtype"]), tuple(msg["shape"]),
                                            settings, limits, progress)  # fmt: skip
                for r in records:
                    r["worker"] = index
                entries = [asdict(e) for e in settings.capture.entries[before:]] if settings.capture is not None else []
                send({"case": msg["case"], "records": records, "capture": entries})
            elif msg["do"] == "finish":
                tk = {op: capture_mod.store_handwritten(run_dir / op, sweeps_by_op[op].spec, settings.device,
                                                        tag=f"worker{index}-", sources=False)
                      for op, c in captures.items() if c is not None}  # fmt: skip
                send({"finished": True, "handwritten": tk})
                return 0
    except KeyboardInterrupt:  # Ctrl-C reaches the workers too: the parent writes what came back
        return 130
    return 0


def core_blocks(count: int, cores=None, twins=None) -> list[list[int]]:
    """The cores each of `count` workers may use: this process's physical cores in contiguous blocks
    (neighbours share caches), as even as they divide, each with its hyperthreads (`twins`: a CPU's
    physical core's CPUs, from sysfs): Linux numbers the twins apart (0-95 the cores, 96-191 their second
    threads), and blocks of numbers alone would give two workers the same cores.  Where there are fewer
    cores than workers, they share them in turn."""
    if cores is None:
        cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores, twins = set(cores), twins or _twins
    groups, seen = [], set()  # each physical core's CPUs, in the order of its first
    for cpu in sorted(cores):
        if cpu not in seen:
            group = sorted((twins(cpu) & cores) | {cpu})
            seen.update(group)
            groups.append(group)
    if len(groups) < count:
        return [groups[k % len(groups)] for k in range(count)]
    blocks = [groups[k * len(groups) // count : (k + 1) * len(groups) // count] for k in range(count)]
    return [sorted(cpu for group in block for cpu in group) for block in blocks]


def _twins(cpu: int) -> set[int]:
    """The CPUs of `cpu`'s physical core, as sysfs lists them ("0,96", "0-1"); `cpu` alone where it does not."""
    try:
        text = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
    except OSError:
        return {cpu}
    found = set()
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        found.update(range(int(first), int(last or first) + 1))
    return found


def _pin(proc: subprocess.Popen, cores: list[int]) -> None:
    """Keep a worker just started, and every process it starts later (they inherit it), on `cores`: set from
    here, before its Python has imported anything (a preexec_fn is not safe once this process has threads)."""
    if hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(ProcessLookupError):  # it died at once: its reader says so
            os.sched_setaffinity(proc.pid, cores)


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _pinning() -> dict:
    """What the worker was pinned with, for the report's environment."""
    pinned = {name: os.environ.get(name) for name in ("CUDA_VISIBLE_DEVICES", *NO_MULTICAST)}
    pinned["cpu_cores"] = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return pinned


# --------------------------------------------------------------------------
# The parent.
# --------------------------------------------------------------------------


@dataclass
class Case:
    number: int
    sweep: session.Sweep
    dtype: torch.dtype
    shape: tuple

    @property
    def label(self) -> str:
        return f"{self.sweep.spec.name} {limits_mod.dtype_name(self.dtype)} {self.sweep.spec.describe(self.shape)}"


@dataclass
class Worker:
    index: int
    gpu: str  # as CUDA_VISIBLE_DEVICES names it
    cores: list[int]  # the CPU cores it and its compile processes run on
    proc: subprocess.Popen | None = None
    generation: int = 0  # restarts so far
    case: Case | None = None  # the case it runs
    stderr_tail: list[str] = field(default_factory=list)


class Parent:
    """Hands out the cases and puts each op's report together (see the module's docstring)."""

    def __init__(self, sweeps, run: session.Run, settings: runner.Settings, gpus: list[str], argv: list[str],
                 quick: bool, capture: bool):  # fmt: skip
        self.sweeps, self.run, self.settings, self.argv = sweeps, run, settings, argv
        self.quick, self.capture = quick, capture
        self.workers = [Worker(k, gpu, cores) for k, (gpu, cores) in enumerate(zip(gpus, core_blocks(len(gpus))))]
        self.inbox: queue.Queue = queue.Queue()  # (worker index, generation, message or None at its end)
        self.cases = [Case(n, *case) for n, case in enumerate((s, d, sh) for s in sweeps for d, sh in s.cases())]
        self.todo = list(self.cases)
        self.records: dict[int, list[dict]] = {}  # case number -> its records
        self.entries: dict[int, list[dict]] = {}  # case number -> its captured output code
        self.lost: dict[str, list[str]] = {}  # op -> the cases lost with a worker
        self.docs: dict[str, dict] = {}
        self.written: set[str] = set()
        self.progress: Progress = run.progress
        self.limits: dict | None = None

    # -- workers --------------------------------------------------------------------------------------

    def start(self, w: Worker) -> None:
        env = dict(os.environ, **NO_MULTICAST, CUDA_VISIBLE_DEVICES=w.gpu, PYTHONUNBUFFERED="1")
        package_root = str(Path(__file__).resolve().parents[1])  # this checkout's compare and ops, from any folder
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        flags = ["--gpus", "1", "--worker", f"{w.index}/{len(self.workers)}", "--worker-run", str(self.run.run_dir)]
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        w.proc = subprocess.Popen([*worker_command(), *self.argv, *flags, "--quiet"], text=True, env=env, bufsize=1, **pipes)
        _pin(w.proc, w.cores)
        w.case, w.stderr_tail = None, []
        generation = w.generation
        threading.Thread(target=self._read, args=(w, generation), daemon=True).start()
        threading.Thread(target=self._relay, args=(w,), daemon=True).start()

    def _read(self, w: Worker, generation: int) -> None:
        for line in w.proc.stdout:
            try:
                self.inbox.put((w.index, generation, json.loads(line)))
            except json.JSONDecodeError:
                self.progress.message(f"[worker {w.index}] {line.rstrip()}")
        self.inbox.put((w.index, generation, None))

    def _relay(self, w: Worker) -> None:
        for line in w.proc.stderr:
            w.stderr_tail = (w.stderr_tail + [line.rstrip()])[-5:]
            self.progress.message(f"[worker {w.index}] {line.rstrip()}")

    def send(self, w: Worker, message: dict) -> bool:
        try:
            w.proc.stdin.write(json.dumps(message) + "\n")
            w.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def alive(self) -> list[Worker]:
        return [w for w in self.workers if w.proc is not None]

    def next_message(self) -> tuple[Worker, dict | None]:
        while True:
            k, generation, msg = self.inbox.get()
            w = self.workers[k]
            if generation == w.generation and w.proc is not None:
                return w, msg

    def died(self, w: Worker) -> None:
        """The worker is gone: its case is lost (reported), and its GPU gets a fresh worker while restarts are left."""
        code = w.proc.wait()
        tail = f"; its last words: {w.stderr_tail[-1]}" if w.stderr_tail else ""
        why = f"worker {w.index} (CUDA_VISIBLE_DEVICES={w.gpu}) exited with code {code}"
        if w.case is not None:
            self.fail(w.case, f"{why} while running this case, which was not run again{tail}", w.index)
        self.progress.message(f"error: {why}{tail}")
        w.proc = None
        if w.generation < RESTARTS and self.todo:
            w.generation += 1
            self.start(w)
            self.send(w, {"do": "start", "limits": self.limits})
            self.progress.message(f"worker {w.index}: started again ({w.generation} of {RESTARTS} restarts)")

    # -- cases and reports ------------------------------------------------------------------------------

    def fail(self, case: Case, why: str, worker: int | None) -> None:
        """Records for a case no worker could finish, one per variant, saying why."""
        records = []
        for v in case.sweep.variants:
            r = runner.base_record(case.sweep.spec, v, case.dtype, case.shape, self.settings)
            r["error"], r["worker"] = f"worker: {why}", worker
            records.append(r)
        self.lost.setdefault(case.sweep.spec.name, []).append(case.label)
        self.done(case, records)

    def done(self, case: Case, records: list[dict]) -> None:
        op = case.sweep.spec.name
        self.records[case.number] = records
        doc = self.docs[op]
        ran = [c for c in self.cases if c.sweep is case.sweep and c.number in self.records]
        doc["records"] = [r for c in ran for r in self.records[c.number]]  # in sweep order
        try:
            report.write_json(doc, self.run.op_dir(op))  # a crash of the parent keeps what came back
        except OSError:
            pass  # the final write reports a full disk
        if all(c.number in self.records for c in self.cases if c.sweep is case.sweep):
            doc["complete"] = True
            self.write(case.sweep)

    def write(self, sweep: session.Sweep) -> None:
        """The op's pages, and its link unless a case was lost."""
        op = sweep.spec.name
        doc = self.docs[op]
        index = self._indexer(sweep, None) if doc["settings"]["capture"] else None
        try:
            self.run.write_report(doc, index)
        except session.ReportNotWritten as e:
            if op not in self.written:
                self.run.not_written(e)
            self.written.add(op)
            return
        if op not in self.written:
            self.written.add(op)
            lost = self.lost.get(op)
            held_back = f"{len(lost)} case(s) of {op} were lost with a worker ({', '.join(lost)})" if lost else None
            self.run.publish(doc, held_back)

    def _indexer(self, sweep: session.Sweep, handwritten: dict | None):
        from . import capture as capture_mod

        def index(doc: dict) -> None:
            op_dir = self.run.op_dir(sweep.spec.name)
            rows = capture_mod.store_handwritten(op_dir, sweep.spec, torch.device("cpu"))  # the sources
            for row in rows:  # and each worker's compiled specializations
                for worker_rows in (handwritten or {}).values():
                    row["compiled"] += next((r["compiled"] for r in worker_rows if r["name"] == row["name"]), [])
            entries = [e for c in self.cases if c.sweep is sweep for e in self.entries.get(c.number, [])]  # sweep order
            capture_mod.write_index(op_dir, sweep.spec, self.settings.device, rows, entries, doc)

        return index

    def status(self) -> None:
        running = "; ".join(f"worker {w.index}: {w.case.label}" for w in self.workers if w.case is not None)
        self.progress.status(f"{len(self.records)}/{len(self.cases)} cases | {running}")

    def dispatch(self, w: Worker) -> None:
        while self.todo and w.case is None and w.proc is not None:
            case = self.todo.pop(0)
            message = {"do": "case", "case": case.number, "op": case.sweep.spec.name,
                       "dtype": limits_mod.dtype_name(case.dtype), "shape": list(case.shape)}  # fmt: skip
            if self.send(w, message):
                w.case = case
            else:
                self.todo.insert(0, case)
                return  # its end comes through the inbox

    # -- the run ----------------------------------------------------------------------------------------

    def answer(self, w: Worker, msg: dict | None, env: dict) -> None:
        """One message of a worker: its end, its pinning, or a case's records."""
        if msg is None:
            self.died(w)
        elif "started" in msg:
            env["workers"][w.index].update(msg["started"])
        elif "case" in msg:
            case, w.case = w.case, None
            self.entries[case.number] = msg["capture"]
            self.done(case, msg["records"])

    def measure_limits(self) -> tuple[dict, dict]:
        """The limits and the environment, from the first worker that answers."""
        dtypes = [limits_mod.dtype_name(d) for d in dict.fromkeys(d for s in self.sweeps for d in s.dtypes)]
        for w in self.workers:
            if w.proc is None or not self.send(w, {"do": "limits", "dtypes": dtypes}):
                continue
            self.progress.status(f"limits: measured by worker {w.index} (CUDA_VISIBLE_DEVICES={w.gpu})")
            while True:
                sender, msg = self.next_message()
                if msg is None:
                    self.progress.message(f"error: worker {sender.index} exited with code {sender.proc.wait()}")
                    sender.proc = None
                    if sender is w:
                        break
                elif sender is w and "limits" in msg:
                    return msg["limits"], msg["environment"]
        errors = ["no worker measured the limits"]
        return {"method": "", "copy": None, "matmul": {}, "errors": errors}, environment.describe(torch.device("cpu"))

    def go(self) -> int:
        for w in self.workers:
            self.start(w)
        self.limits, env = self.measure_limits()
        # Every report's environment names the workers and what each was pinned with (filled as they answer).
        env = {**env, "workers": [{"worker": w.index, "CUDA_VISIBLE_DEVICES": w.gpu} for w in self.workers]}
        for sweep in self.sweeps:
            capture = self.capture and any(v.compiled for v in sweep.variants)
            self.docs[sweep.spec.name] = session.new_doc(sweep, self.settings, env, self.limits, self.quick, capture,
                                                         workers=len(self.workers))  # fmt: skip
        waiting = {w.index for w in self.alive() if self.send(w, {"do": "start", "limits": self.limits})}
        while waiting & {w.index for w in self.alive()}:  # each says what it was pinned with
            w, msg = self.next_message()
            self.answer(w, msg, env)
            waiting.discard(w.index)
        for w in self.alive():
            self.dispatch(w)
        while len(self.records) < len(self.cases):
            if not self.alive():
                for case in list(self.todo):
                    self.fail(case, "no worker was left to run this case", None)
                self.todo.clear()
                break
            self.status()
            self.answer(*self.next_message(), env)
            for free in self.alive():
                self.dispatch(free)
        self.progress.close()
        self.finish_workers()
        return self.run.finish()

    def finish_workers(self) -> None:
        """Ask each worker for its tk kernels (GPU: their compiled forms), add them to the indexes, let them go."""
        handwritten: dict[str, dict[int, list]] = {}
        waiting = {w.index for w in self.alive() if self.send(w, {"do": "finish"})}
        while waiting:
            try:
                k, generation, msg = self.inbox.get(timeout=FINISH_TIMEOUT_S)
            except queue.Empty:
                break
            w = self.workers[k]
            if generation != w.generation or k not in waiting:
                continue
            if msg is not None and msg.get("finished"):
                for op, rows in msg["handwritten"].items():
                    handwritten.setdefault(op, {})[k] = rows
            if msg is None or msg.get("finished"):
                waiting.discard(k)
        self.stop()
        for sweep in self.sweeps:
            op = sweep.spec.name
            if op in handwritten and op in self.written and self.docs[op]["settings"]["capture"]:
                self._indexer(sweep, handwritten[op])(self.docs[op])

    def stop(self) -> None:
        for w in self.workers:
            if w.proc is None:
                continue
            try:
                w.proc.stdin.close()
            except OSError:
                pass
            try:
                w.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
            w.proc = None

    def interrupted(self) -> int:
        """Ctrl-C or SIGTERM: the workers stop; each op that had begun gets its pages for what came back."""
        for w in self.workers:
            if w.proc is not None:
                w.proc.terminate()
        self.stop()
        for sweep in self.sweeps:
            op = sweep.spec.name
            if op in self.docs and op not in self.run.written and self.docs[op]["records"]:
                index = self._indexer(sweep, None) if self.docs[op]["settings"]["capture"] else None
                try:
                    self.run.write_report(self.docs[op], index)
                except (session.ReportNotWritten, KeyboardInterrupt):
                    pass
        return self.run.interrupted()


def run_split(
    sweeps: list[session.Sweep], run: session.Run, settings: runner.Settings, gpus: list[str], argv: list[str],
    quick: bool, capture: bool,
) -> int:  # fmt: skip
    """The sweep over one worker per GPU (see the module's docstring); the exit status."""
    run.progress.message(f"spreading {sum(len(s.cases()) for s in sweeps)} cases over {len(gpus)} workers"
                         f" (CUDA_VISIBLE_DEVICES {', '.join(gpus)})")  # fmt: skip
    parent = Parent(sweeps, run, settings, gpus, argv, quick, capture)
    try:
        return parent.go()
    except KeyboardInterrupt:
        return parent.interrupted()
