"""What Inductor generated for the compiled variants, stored beside tk's own kernels.

The output code is the ``output_code`` logging artifact, the very text
``TORCH_LOGS=output_code`` prints: while a compiled variant builds and runs
its first call, a handler is attached to the artifact's loggers in-process
(nothing goes to stderr).

Warm caches: on an FX-graph-cache hit Inductor logs the cached module's code
again; when a version does not, the log still says "Output code written to:
<path>" and the module is read from that file.  So the second run of a sweep
stores as much as the first, without disabling any cache (which would change
what the first-call time means).  ``source`` in the index says which way each
module was obtained.

Layout, under the op's report folder::

    kernels/tk/<kernel>.py                          hand-written @triton.jit source
    kernels/tk/<kernel>/<n>/{ttir,ttgir,ptx,json}   (GPU) each compiled specialization
    kernels/<variant>/<dtype>/<shape>/output_code.py   the whole module (runs standalone)
    kernels/<variant>/<dtype>/<shape>/<kernel>.py|.cpp  one file per generated kernel
    kernels/<variant>/<dtype>/<shape>/<kernel>.{ttir,ttgir,ptx,json}  (GPU)
    kernels/index.json, index.md                    every kernel, its kind, lines, time per call
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import logging
import os
import pkgutil
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import limits as limits_mod
from .formats import fmt_time
from .record import NOISY, marked

LOG_CODE = "Output code: \n"
LOG_PATH = "Output code written to: "
LOWER_LEVELS = ("ttir", "ttgir", "ptx")


# --------------------------------------------------------------------------
# The output_code artifact, in-process.
# --------------------------------------------------------------------------


class _Collector(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.codes: list[str] = []
        self.paths: list[str] = []

    def emit(self, record):
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is not ours to fix
            return
        if msg.startswith(LOG_CODE):
            code = msg[len(LOG_CODE) :]
            if code not in self.codes:
                self.codes.append(code)
        elif msg.startswith(LOG_PATH):
            path = msg[len(LOG_PATH) :].strip()
            if path not in self.paths:
                self.paths.append(path)


def _artifact_loggers() -> list[logging.Logger]:
    import torch._inductor.codecache  # noqa: F401 - defines the artifact loggers
    import torch._inductor.graph  # noqa: F401

    names = [n for n in list(logging.root.manager.loggerDict) if n.endswith(".__output_code")]
    return [logging.getLogger(n) for n in names]


@contextlib.contextmanager
def output_code_logs():
    """Collect the output_code artifact while the block runs; stderr sees nothing of it."""
    collector = _Collector()
    loggers = _artifact_loggers()
    saved = [(lg, lg.level, lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.DEBUG)
        lg.propagate = False
        lg.addHandler(collector)
    try:
        yield collector
    finally:
        for lg, level, propagate in saved:
            lg.removeHandler(collector)
            lg.setLevel(level)
            lg.propagate = propagate


def modules_from(collector: _Collector) -> list[tuple[str, str, str | None]]:
    """(code, how it was obtained, file path) of every module the block compiled."""
    out = [(code, "log", None) for code in collector.codes]
    if out:
        paths = collector.paths
        return [(code, how, paths[i] if i < len(paths) else None) for i, (code, how, _) in enumerate(out)]
    for path in collector.paths:  # the code was not logged: read the module the log names
        try:
            out.append((Path(path).read_text(), "cached module file", path))
        except OSError:
            pass
    return out


# --------------------------------------------------------------------------
# Parsing an output-code module into its kernels.
# --------------------------------------------------------------------------

_DEF = re.compile(r"^(?P<var>[A-Za-z_]\w*) = async_compile\.(?P<method>\w+)\((?P<args>[^\n]*?)(?P<quote>r?'''|r?\"\"\")", re.M)
_FIRST_STRING = re.compile(r"""^\s*['"]([^'"]+)['"]""")
_HEURISTIC = re.compile(r"@triton_heuristics\.(\w+)")
_EXTERN = re.compile(r"\bextern_kernels\.(\w+)\(")
_KINDS_BY_HEURISTIC = {
    "pointwise": "pointwise", "reduction": "reduction", "persistent_reduction": "reduction",
    "split_scan": "scan", "template": "template", "foreach": "foreach", "user_autotune": "hand-written",
    "cooperative_reduction": "reduction",
}  # fmt: skip
_KINDS_BY_PREFIX = (("triton_poi", "pointwise"), ("triton_red", "reduction"), ("triton_per", "reduction"),
                    ("triton_tem", "template"), ("triton_for", "foreach"), ("triton_spl", "scan"))  # fmt: skip


@dataclass
class Kernel:
    name: str  # as the kernel is launched (and named by the profiler)
    var: str  # the module-level name, unique in its module: the file name
    kind: str  # pointwise | reduction | template | foreach | scan | cpp | hand-written | triton
    language: str  # triton | cpp
    source: str
    lines: int = 0

    def __post_init__(self):
        self.lines = self.source.count("\n") + 1


def _kind(name: str, method: str, source: str) -> str:
    if method.startswith("cpp"):
        return "cpp"
    match = _HEURISTIC.search(source)
    if match and match.group(1) in _KINDS_BY_HEURISTIC:
        return _KINDS_BY_HEURISTIC[match.group(1)]
    for prefix, kind in _KINDS_BY_PREFIX:
        if name.startswith(prefix):
            return kind
    return "triton" if name.startswith("triton_") else "hand-written"


def parse_kernels(code: str) -> list[Kernel]:
    """Every ``name = async_compile.<triton|cpp...>(..., '''<source>''')`` of a module."""
    kernels = []
    for m in _DEF.finditer(code):
        quote = m.group("quote").lstrip("r")
        start = m.end()
        end = code.find(quote, start)
        if end < 0:
            continue
        source = code[start:end].strip("\n") + "\n"
        first = _FIRST_STRING.match(m.group("args"))
        name = first.group(1) if first and m.group("method") == "triton" else m.group("var")
        language = "cpp" if m.group("method").startswith("cpp") else "triton"
        kernels.append(Kernel(name, m.group("var"), _kind(name, m.group("method"), source), language, source))
    return kernels


def extern_calls(code: str) -> list[str]:
    """Library calls of the module (cuBLAS mm, convolutions...): kernels without a source here."""
    return list(dict.fromkeys(_EXTERN.findall(code)))


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", text).strip("_") or "_"


# --------------------------------------------------------------------------
# Lower levels (GPU): Triton IR, TritonGPU IR and PTX of compiled kernels.
# --------------------------------------------------------------------------


def _metadata_dict(compiled) -> dict:
    meta = getattr(compiled, "metadata", None)
    if meta is None:
        return {}
    if hasattr(meta, "_asdict"):
        meta = meta._asdict()
    elif not isinstance(meta, dict):
        meta = dict(getattr(meta, "__dict__", {}))
    keep = ("name", "num_warps", "num_stages", "num_ctas", "shared", "maxnreg", "hash", "target")
    return {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v)) for k, v in meta.items() if k in keep}


def describe_compiled(compiled) -> dict:
    """Registers, spills and shared memory of a Triton CompiledKernel (loaded on demand)."""
    info = _metadata_dict(compiled)
    with contextlib.suppress(Exception):
        compiled._init_handles()
    for attr in ("n_regs", "n_spills", "n_max_threads", "shared"):
        value = getattr(compiled, attr, None)
        if isinstance(value, int):
            info[attr] = value
    return info


def write_lower_levels(compiled, folder: Path, stem: str) -> list[str]:
    """``stem.ttir``, ``.ttgir``, ``.ptx`` and ``.json`` of a CompiledKernel; the files written."""
    asm = getattr(compiled, "asm", None) or {}
    written = []
    folder.mkdir(parents=True, exist_ok=True)
    for level in LOWER_LEVELS:
        text = asm.get(level)
        if isinstance(text, bytes):
            text = text.decode(errors="replace")
        if text:
            (folder / f"{stem}.{level}").write_text(text)
            written.append(f"{stem}.{level}")
    info = describe_compiled(compiled)
    (folder / f"{stem}.json").write_text(json.dumps(info, indent=1, default=str) + "\n")
    written.append(f"{stem}.json")
    return written


def _compiled_in(obj, depth: int = 0):
    """Triton CompiledKernels reachable from an Inductor kernel object (a CachingAutotuner)."""
    if obj is None or depth > 3:
        return
    if isinstance(getattr(obj, "asm", None), dict):
        yield obj
        return
    for attr in ("compile_results", "launchers", "kernel", "bin", "_kernel"):
        child = getattr(obj, attr, None)
        if child is None or child is obj:
            continue
        for item in child if isinstance(child, (list, tuple)) else (child,):
            yield from _compiled_in(item, depth + 1)


class _FromCacheDir:
    """A compiled kernel seen only through its files in Triton's cache (the static launcher keeps no asm)."""

    def __init__(self, folder: Path, name: str):
        self.asm = {lvl: (folder / f"{name}.{lvl}").read_text() for lvl in LOWER_LEVELS if (folder / f"{name}.{lvl}").exists()}
        meta = folder / f"{name}.json"
        self.metadata = json.loads(meta.read_text()) if meta.exists() else {}
        self.folder = str(folder)


def triton_cache_dirs() -> list[Path]:
    """Where Triton may have stored compiled kernels, most specific first."""
    dirs = [os.environ.get("TRITON_CACHE_DIR")]
    with contextlib.suppress(Exception):
        import triton

        dirs.append(triton.knobs.cache.dir)  # Triton 3.4+
    with contextlib.suppress(Exception):
        from triton.runtime.cache import default_cache_dir

        dirs.append(default_cache_dir())
    with contextlib.suppress(Exception):
        from torch._inductor.runtime.cache_dir_utils import triton_cache_dir

        dirs.append(triton_cache_dir(torch.cuda.current_device()))
    dirs.append(os.path.join(os.path.expanduser("~"), ".triton", "cache"))
    return [Path(d) for d in dict.fromkeys(d for d in dirs if d)]


def _compiled_from_cache_dir(obj, name: str):
    """Inductor's static CUDA launcher keeps no ``asm``; its launcher knows the Triton
    cache hash, and the cache folder of that hash holds ``<name>.ttir/.ttgir/.ptx``."""
    for launcher in getattr(obj, "launchers", None) or []:
        folders = []
        cache_hash = getattr(launcher, "cache_hash", None)
        if isinstance(cache_hash, str):
            folders += [d / cache_hash for d in triton_cache_dirs()]
        for result in getattr(obj, "compile_results", None) or []:
            for holder in (result, getattr(result, "kernel", None)):
                path = getattr(holder, "cubin_path", None)
                if isinstance(path, str):
                    folders.append(Path(path).parent)
        for folder in folders:
            if (folder / f"{name}.ptx").exists() or (folder / f"{name}.ttir").exists():
                found = _FromCacheDir(folder, name)
                for attr in ("n_regs", "n_spills", "shared"):
                    if isinstance(getattr(launcher, attr, None), int):
                        setattr(found, attr, getattr(launcher, attr))
                return found
    return None


def inductor_compiled(module_path: str | None, kernel: Kernel):
    """The compiled kernel behind one kernel of a loaded output-code module, or None."""
    if module_path is None:
        return None
    module = next((m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == module_path), None)
    obj = getattr(module, kernel.var, None) if module is not None else None
    if obj is None:
        return None
    return next(_compiled_in(obj), None) or _compiled_from_cache_dir(obj, kernel.name)


def handwritten_kernels(spec) -> list:
    """The kernels of the op behind ``spec.tk`` (or of the spec's ``kernel_modules``): the public
    ``@triton.jit`` functions of its module, or of every module of its folder when the op is a
    folder (``ops/softmax/``: the spec lives in ``spec.py`` beside the kernels), autotuners
    unwrapped.  Private ones (``_name``) are device helpers the kernels call."""
    names = spec.kernel_modules
    if not names:
        module = inspect.getmodule(spec.tk) or sys.modules.get(getattr(spec.tk, "__module__", ""), None)
        if module is None:
            return []
        package = module.__name__.rpartition(".")[0]
        names = (package,) if module.__name__.endswith(".spec") and package.count(".") >= 1 else (module.__name__,)
    return [k for name in names for m in _modules_of(name) for k in _module_kernels(m)]


def _modules_of(name: str) -> list:
    """The module `name`, or every module of the package `name`."""
    module = importlib.import_module(name)
    if not hasattr(module, "__path__"):
        return [module]
    return [module] + [importlib.import_module(f"{name}.{m.name}") for m in pkgutil.iter_modules(module.__path__)]


def _module_kernels(module) -> list:
    from triton.runtime.jit import JITFunction

    found = {}
    for value in vars(module).values():
        fn = value
        for _ in range(4):  # Autotuner / Heuristics keep what they wrap in .fn
            if isinstance(fn, JITFunction):
                break
            try:
                fn = getattr(fn, "fn", None)
            except Exception:  # noqa: BLE001 - e.g. torch.classes raises on unknown attributes
                break
        if isinstance(fn, JITFunction) and getattr(fn.fn, "__module__", None) == module.__name__ and not fn.__name__.startswith("_"):
            found.setdefault(id(fn), fn)
    return sorted(found.values(), key=lambda f: f.fn.__code__.co_firstlineno)


def jit_compiled(jit) -> list:
    """The CompiledKernels a JITFunction holds, over every device (Triton 3.x caches)."""
    out = []
    caches = getattr(jit, "device_caches", None) or {}
    for entry in list(caches.values()):
        kernel_cache = entry[0] if isinstance(entry, tuple) else entry
        if isinstance(kernel_cache, dict):
            out += [k for k in kernel_cache.values() if isinstance(getattr(k, "asm", None), dict)]
    cache = getattr(jit, "cache", None)  # older Triton: {device: {key: CompiledKernel}}
    if isinstance(cache, dict):
        for per_device in cache.values():
            if isinstance(per_device, dict):
                out += [k for k in per_device.values() if isinstance(getattr(k, "asm", None), dict)]
    return out


# --------------------------------------------------------------------------
# The capture of one op's sweep.
# --------------------------------------------------------------------------


@dataclass
class Entry:
    variant: str
    dtype: str
    shape: list
    shape_label: str
    folder: str  # relative to the op folder
    modules: list = field(default_factory=list)  # [{file, source, lines}]
    kernels: list = field(default_factory=list)  # [{name, kind, language, lines, file, lower}]
    extern: list = field(default_factory=list)
    error: str | None = None


class Capture:
    def __init__(self, op_dir: Path, spec, device: torch.device):
        self.op_dir = Path(op_dir)
        self.root = self.op_dir / "kernels"
        self.spec = spec
        self.device = device
        self.entries: list[Entry] = []

    @contextlib.contextmanager
    def recording(self, spec, variant, dtype, shape):
        entry = Entry(variant.name, limits_mod.dtype_name(dtype), list(shape), spec.describe(shape), "")
        with contextlib.ExitStack() as stack:
            try:
                collector = stack.enter_context(output_code_logs())
            except Exception as e:  # noqa: BLE001 - no capture, but the variant still runs
                entry.error = f"capture not attached: {type(e).__name__}: {e}"
                self.entries.append(entry)
                collector = None
            yield
        if collector is None:
            return
        try:
            self._store(entry, collector)
        except Exception as e:  # noqa: BLE001 - a failed capture never fails the comparison
            entry.error = f"{type(e).__name__}: {e}"
        self.entries.append(entry)

    def _store(self, entry: Entry, collector: _Collector) -> None:
        folder = self.root / safe_name(entry.variant) / entry.dtype / safe_name(entry.shape_label)
        folder.mkdir(parents=True, exist_ok=True)
        entry.folder = str(folder.relative_to(self.op_dir))
        modules = modules_from(collector)
        if not modules:
            entry.error = "no output code was logged (nothing compiled, or the graph was not Inductor's)"
        for i, (code, how, path) in enumerate(modules):
            file = "output_code.py" if i == 0 else f"output_code_{i}.py"
            (folder / file).write_text(code)
            entry.modules.append({"file": file, "source": how, "lines": code.count("\n") + 1})
            entry.extern += [e for e in extern_calls(code) if e not in entry.extern]
            for k in parse_kernels(code):
                ext = ".cpp" if k.language == "cpp" else ".py"
                kfile = safe_name(k.var) + ext
                (folder / kfile).write_text(k.source)
                row = {"name": k.name, "var": k.var, "kind": k.kind, "language": k.language, "lines": k.lines,
                       "file": kfile, "module": file, "lower": [], "info": {}}  # fmt: skip
                if self.device.type == "cuda" and k.language == "triton":
                    with contextlib.suppress(Exception):
                        compiled = inductor_compiled(path, k)
                        if compiled is not None:
                            row["lower"] = write_lower_levels(compiled, folder, safe_name(k.var))
                            row["info"] = describe_compiled(compiled)
                entry.kernels.append(row)

    def finish(self, doc: dict) -> None:
        """Write the hand-written kernels and the index (with profiler times from ``doc``)."""
        handwritten = store_handwritten(self.op_dir, self.spec, self.device)
        write_index(self.op_dir, self.spec, self.device, handwritten, [asdict(e) for e in self.entries], doc)


# --------------------------------------------------------------------------
# The hand-written side and the index (a sweep split over GPUs writes them from its workers' parts).
# --------------------------------------------------------------------------


def store_handwritten(op_dir: Path, spec, device: torch.device, tag: str = "", sources: bool = True) -> list[dict]:
    """Write tk's kernel sources (unless ``sources`` is False: a worker of a split sweep, whose parent writes
    them) and (on a GPU) each compiled specialization this process holds, under ``kernels/tk/<kernel>/<tag><n>/``;
    their index rows."""
    folder = Path(op_dir) / "kernels" / "tk"
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for jit in handwritten_kernels(spec):
        name = jit.fn.__name__
        try:
            source = inspect.getsource(jit.fn)
        except (OSError, TypeError):
            source = getattr(jit, "src", "") or ""
        if sources:
            (folder / f"{safe_name(name)}.py").write_text(source)
        row = {"name": name, "file": f"kernels/tk/{safe_name(name)}.py", "lines": source.count("\n") + 1,
               "module": jit.fn.__module__, "compiled": []}  # fmt: skip
        if device.type == "cuda":
            for i, compiled in enumerate(jit_compiled(jit)):
                with contextlib.suppress(Exception):
                    sub = folder / safe_name(name) / f"{tag}{i}"
                    files = write_lower_levels(compiled, sub, safe_name(name))
                    row["compiled"].append({"folder": str(sub.relative_to(op_dir)), "files": files,
                                            "info": describe_compiled(compiled)})  # fmt: skip
        rows.append(row)
    return rows


def write_index(
    op_dir: Path, spec, device: torch.device, handwritten: list[dict], generated: list[dict], doc: dict
) -> None:
    """``kernels/index.json`` and ``index.md``: every kernel, with the profiler's times from ``doc``'s records."""
    times = {}
    for r in doc["records"]:
        for name, us in (r.get("kernel_us") or {}).items():
            times[(r["variant"], r["dtype"], r["shape_label"], name)] = us
    index = {"op": spec.name, "device": device.type, "handwritten": handwritten, "generated": generated}
    for e in index["generated"]:
        for k in e["kernels"]:
            k["us_per_call"] = _time_of(times, e, k["name"])
    root = Path(op_dir) / "kernels"
    root.mkdir(parents=True, exist_ok=True)
    (root / "index.json").write_text(json.dumps(index, indent=1, default=str) + "\n")
    (Path(op_dir) / "index.md").write_text(index_markdown(index, doc))


def _time_of(times: dict, entry: dict, name: str):
    """The profiler's time of kernel ``name`` (on a CPU, Inductor prefixes it: graph_0_cpp_fused_...)."""
    key = (entry["variant"], entry["dtype"], entry["shape_label"])
    for (v, d, s, n), us in times.items():
        if (v, d, s) == key and (n == name or n.endswith("_" + name)):
            return us
    return None


def _us(value) -> str:
    return "" if value is None else f"{value:.2f}"


def _median(records: dict, variant: str, dtype: str, label: str) -> str:
    """The variant's median at that case, as report.md shows it (marked where it is not stable)."""
    r = records.get((variant, dtype, label))
    if r is None or r.get("median_ms") is None:
        return ""
    return marked(fmt_time(r["median_ms"]), r, NOISY)


PROFILER_NOTE = (
    "**profiler µs**: the kernel's time per call over two calls under `torch.profiler`, which adds a cost of its own"
    " to every op it records (on a CPU often more than a small op itself): where a kernel sits in its variant, not a"
    " timing. **median**: the variant's timed median per call, report.md's figure, the one to quote."
)


def index_markdown(index: dict, doc: dict) -> str:
    from tabulate import tabulate

    op = index["op"]
    gpu = index["device"] == "cuda"
    records = {(r["variant"], r["dtype"], r["shape_label"]): r for r in doc["records"]}
    out = [f"# {op}: the kernels that compete", ""]
    out.append("profiler µs: device time of the kernel." if gpu else
               "CPU run: profiler µs is the CPU time of the kernel (or op);"
               " tk's kernels run in Triton's interpreter there, timed as the whole tk op.")  # fmt: skip
    out += ["", PROFILER_NOTE]
    out += ["", "## Hand-written (tk)", ""]
    tk_recs = [r for r in doc["records"] if r["variant"] == "tk"]
    rows = []
    for h in index["handwritten"]:
        per_shape = [f"{r['dtype']} {r['shape_label']}: {_us(r['kernel_us'][h['name']])} (tk median "
                     f"{_median(records, 'tk', r['dtype'], r['shape_label'])})"
                     for r in tk_recs if h["name"] in (r.get("kernel_us") or {})]  # fmt: skip
        regs = "; ".join(
            f"{c['info'].get('n_regs', '?')} regs, {c['info'].get('shared', '?')} B shared, {c['info'].get('num_warps', '?')} warps"
            for c in h["compiled"]
        )
        lower = ", ".join(f"[{c['folder']}]({c['folder']})" for c in h["compiled"])
        rows.append([h["name"], f"[{h['file']}]({h['file']})", h["lines"], "<br>".join(per_shape) or "", regs, lower])
    headers = ["kernel", "source", "lines", "profiler µs per call", "compiled", "ttir/ttgir/ptx"]
    out.append(tabulate(rows, headers=headers, tablefmt="github"))
    if not gpu:
        ops_times = [f"{r['dtype']} {r['shape_label']}: {n} {_us(us)} profiler µs" for r in tk_recs
                     for n, us in (r.get("kernel_us") or {}).items()]  # fmt: skip
        if ops_times:
            out += ["", "The tk op per call (interpreted, not a performance figure): " + "; ".join(ops_times)]
    out += ["", "## Generated by Inductor", ""]
    rows = []
    for e in index["generated"]:
        for k in e["kernels"]:
            info = k.get("info") or {}
            regs = f"{info['n_regs']} regs, {info.get('shared', '?')} B shared" if "n_regs" in info else ""
            path = f"{e['folder']}/{k['file']}"
            rows.append([k["name"], e["variant"], e["dtype"], e["shape_label"], k["kind"], k["lines"],
                         _us(k.get("us_per_call")), _median(records, e["variant"], e["dtype"], e["shape_label"]),
                         regs, f"[{k['file']}]({path})",
                         f"[{e['modules'][0]['file']}]({e['folder']}/{e['modules'][0]['file']})" if e["modules"] else ""])  # fmt: skip
        for name in e["extern"]:
            median = _median(records, e["variant"], e["dtype"], e["shape_label"])
            rows.append([f"extern_kernels.{name}", e["variant"], e["dtype"], e["shape_label"], "extern (library)",
                         "", "", median, "", "", ""])  # fmt: skip
        if e["error"]:
            rows.append([f"(capture: {e['error']})", e["variant"], e["dtype"], e["shape_label"], *[""] * 7])
    headers = ["kernel", "variant", "dtype", "shape", "kind", "lines", "profiler µs per call", "median (report.md)",
               "compiled", "source", "module"]  # fmt: skip
    out.append(tabulate(rows, headers=headers, tablefmt="github"))
    out += ["", "Each `output_code.py` runs by itself (`python output_code.py` benchmarks the module), as Inductor's own do.", ""]
    return "\n".join(out)

