"""What Inductor generated for the compiled variants, stored beside tk's own kernels.

The output code is the ``output_code`` logging artifact, the very text
``TORCH_LOGS=output_code`` prints: while a compiled variant builds and runs
its first call, a handler is attached to the artifact loggers in-process
(``compare.stages``; nothing goes to stderr).  The other stages that explain
it (the traced graph, the post-grad graph, the fusion decisions, recompile
reasons and graph breaks) are stored beside it.

Warm caches: on an FX-graph-cache hit Inductor logs the cached module's code
again; when a version does not, the log still says "Output code written to:
<path>" and the module is read from that file.  So the second run of a sweep
stores as much as the first, without disabling any cache (which would change
what the first-call time means).  ``source`` in the index says which way each
module was obtained (stages.py says how the stages are kept across runs).

tk's side: the tk variant's first call is watched (``launches.watching``):
which kernels ran for that shape, with which grid, constexprs and warps (and
the autotuner's choice).  Their compiled levels (``compare.ir``) are stored:
on a GPU those of the launches that ran; on a CPU, with ``--ir``, those of the
launches the op plans for an H100 (fake tensors), compiled for sm_90.

Layout, under the op's report folder::

    kernels/tk/<kernel>.py                          hand-written @triton.jit source
    kernels/tk/<kernel>/<hash>/<kernel>.{ttir,ttgir,llir,ptx,sass,json}   one compiled specialization
    kernels/<variant>/<dtype>/<shape>/output_code.py   the whole module (runs standalone)
    kernels/<variant>/<dtype>/<shape>/<stage file>     graph.py, post_grad_graph.py, fusion.txt, ... (stages.py)
    kernels/<variant>/<dtype>/<shape>/<kernel>.py|.cpp  one file per generated kernel
    kernels/<variant>/<dtype>/<shape>/<kernel>.{ttir,ttgir,llir,ptx,sass,json}  (GPU)
    kernels/index.json, index.md                    every kernel, its kind, lines, time per call
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import os
import pkgutil
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import ir as ir_mod, launches as launches_mod, limits as limits_mod, stages as stages_mod

LOWER_LEVELS = ir_mod.LEVELS

# The artifact handler lives in stages.py; these names stay for the code and tests that used them here.
_Collector = stages_mod.Collector
modules_from = stages_mod.modules_from
output_code_logs = stages_mod.inductor_logs


def _artifact_loggers():
    """The loggers of the output_code artifact."""
    return stages_mod.artifact_loggers(("output_code",))


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
    """``stem.ttir``, ``.ttgir``, ``.llir``, ``.ptx`` (``.sass`` where its cubin and cuobjdump are at hand) and
    ``.json`` of a CompiledKernel; the files written."""
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
    if asm.get("cubin"):
        sass, _ = ir_mod.sass_of(compiled)
        if sass:
            (folder / f"{stem}.{ir_mod.SASS}").write_text(sass)
            written.append(f"{stem}.{ir_mod.SASS}")
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
        if (folder / f"{name}.cubin").exists():
            self.asm["cubin"] = (folder / f"{name}.cubin").read_bytes()
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


# --------------------------------------------------------------------------
# The capture of one op's sweep.
# --------------------------------------------------------------------------


@dataclass
class Entry:
    """What was captured of one variant on one (dtype, shape): Inductor's modules (``side`` "generated"), or the
    launches of tk's kernels (``side`` "tk")."""

    variant: str
    dtype: str
    shape: list
    shape_label: str
    folder: str  # relative to the op folder
    modules: list = field(default_factory=list)  # [{file, source, lines}]
    kernels: list = field(default_factory=list)  # [{name, kind, language, lines, file, lower}]
    extern: list = field(default_factory=list)
    error: str | None = None
    side: str = "generated"
    stages: dict = field(default_factory=dict)  # stage -> {file, lines, source} or {source: why there is none}
    launches: list = field(default_factory=list)  # tk: what ran (Launch.to_json, with "ir" rows on a GPU)
    planned: dict | None = None  # tk on a CPU with --ir: the launches planned for an H100, compiled for sm_90


class Capture:
    """The capture of one op's sweep: Inductor's output code and stages per compiled variant and case, tk's
    launches per case, and (``ir``) the compiled levels of tk's kernels."""

    def __init__(self, op_dir: Path, spec, device: torch.device, ir: bool | None = None):
        self.op_dir = Path(op_dir)
        self.root = self.op_dir / "kernels"
        self.spec = spec
        self.device = device
        self.ir = device.type == "cuda" if ir is None else ir  # a GPU compiles nothing new: Triton's cache has it
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
        texts, how = stages_mod.stage_texts(collector)
        for stage, (file, _) in stages_mod.STAGES.items():
            if stage in texts:
                (folder / file).write_text(ir_mod.portable(texts[stage]))  # ops/gelu.py, not this checkout's path
                entry.stages[stage] = {"file": file, "lines": texts[stage].count("\n"), "source": how[stage]}
            else:
                entry.stages[stage] = {"source": how[stage]}

    @contextlib.contextmanager
    def watching_tk(self):
        """Inside (the tk variant's first call), every launch of tk's kernels is recorded; yields the list."""
        found: list = []
        with launches_mod.watching(found):
            yield found

    def store_tk(self, spec, variant, dtype, shape, found: list, call_again=None) -> None:
        """tk's launches of one case, and their compiled levels (never fails the comparison).  ``call_again``:
        a call of the variant, for a GPU whose native lane replayed the first call without the Python body."""
        entry = Entry(variant.name, limits_mod.dtype_name(dtype), list(shape), spec.describe(shape), "kernels/tk",
                      side="tk")  # fmt: skip
        try:
            if not found and call_again is not None and self.device.type == "cuda":
                with _python_bodies(), launches_mod.watching(found):
                    call_again()
            root = self.root / "tk"
            if self.device.type == "cuda":
                target = ir_mod.device_target(self.device)
                entry.launches = ir_mod.compile_all(found, target, root, self.op_dir) if self.ir else [
                    launch.to_json() for launch in found]  # fmt: skip
            else:
                entry.launches = [launch.to_json() for launch in found]
                if self.ir:
                    planned = launches_mod.planned_launches(spec, tuple(shape), dtype, launches_mod.H100)
                    target = ir_mod.target_of(launches_mod.H100)
                    entry.planned = {"gpu": launches_mod.H100.name, "target": target.label, "error": planned.error,
                                     "notes": planned.notes,
                                     "launches": ir_mod.compile_all(planned.launches, target, root, self.op_dir)}  # fmt: skip
        except Exception as e:  # noqa: BLE001 - a failed capture never fails the comparison
            entry.error = f"{type(e).__name__}: {e}".splitlines()[0][:500]
        self.entries.append(entry)

    def finish(self, doc: dict) -> None:
        """Write the hand-written kernels and the index (with profiler times from ``doc``)."""
        handwritten = store_handwritten(self.op_dir, self.spec, self.device)
        write_index(self.op_dir, self.spec, self.device, handwritten, [asdict(e) for e in self.entries], doc)


@contextlib.contextmanager
def _python_bodies():
    """Inside, eager CUDA calls of tk ops run their Python bodies (the native lane steps aside)."""
    try:
        paused = importlib.import_module("ops.runtime.native").paused
    except (ImportError, AttributeError):
        paused = contextlib.nullcontext
    with paused():
        yield


# --------------------------------------------------------------------------
# The hand-written side (a sweep split over GPUs writes it from its workers' parts).
# --------------------------------------------------------------------------


def store_handwritten(op_dir: Path, spec, device: torch.device, tag: str = "", sources: bool = True) -> list[dict]:
    """Write tk's kernel sources (unless ``sources`` is False: a worker of a split sweep, whose parent writes
    them); their index rows.  ``compiled`` is filled by ``write_index`` from the cases' launches (compiled
    levels are per launch: ``Capture.store_tk``); ``tag`` is kept for callers that name a worker."""
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
        rows.append({"name": name, "file": f"kernels/tk/{safe_name(name)}.py", "lines": source.count("\n") + 1,
                     "module": jit.fn.__module__, "compiled": []})  # fmt: skip
    return rows


def write_index(*args, **kwargs) -> None:
    """``kernels/index.json`` and ``index.md`` (capture_index.py)."""
    from .capture_index import write_index as write

    write(*args, **kwargs)
