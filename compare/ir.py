"""Every compilation level of tk's kernels, for the launches a shape makes, on any machine.

``python -m compare.ir --op gelu`` (``make ir OP=gelu``): for each (dtype, shape) of the op's
sweep, the op's body runs on fake CUDA tensors of a fake H100 (``launches.planned_launches``):
nothing runs, but every launch is recorded with its arguments, constexprs and options, exactly
as the body would make it on that GPU.  Each launch is then compiled for the H100's target
(sm_90), which Triton does without a GPU, and each level is written:

    <out>/ir/<op>/<kernel>/<hash>/<kernel>.ttir     Triton IR (the kernel as Triton understood it)
                                      .ttgir    TritonGPU IR (layouts, pipelining, warps assigned)
                                      .llir     LLVM IR
                                      .ptx      PTX
                                      .sass     SASS, where cuobjdump exists (Triton ships one)
                                      .json     the launch (grid, constexprs, options), the
                                                compiled kernel's metadata (warps, stages,
                                                shared memory; registers and spills on a GPU)
    <out>/ir/<op>/index.json, index.md        per (dtype, shape): which kernels, which folder

``<hash>`` is the compiled kernel's own hash: shapes that launch the same specialization share
one folder.  An autotuned kernel is compiled once per config it may choose (the choice needs
the GPU), or for the config it chose where it ran (the harness, on a GPU).

The harness uses the same functions (``compile_launch``, ``write_levels``) for its report: the
launches its tk variant made on a GPU, or, with ``--ir`` on a CPU, the launches planned for an
H100 (``compare.capture``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import sysconfig
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from . import launches as launches_mod
from .files import write_atomic
from .launches import GPU, H100, Launch

LEVELS = ("ttir", "ttgir", "llir", "ptx")
SASS = "sass"


@dataclass(frozen=True)
class Target:
    """What to compile for: Triton's ``GPUTarget`` (backend, architecture, warp size)."""

    backend: str = "cuda"
    arch: int = 90
    warp_size: int = 32

    @property
    def label(self) -> str:
        return f"sm_{self.arch}" if self.backend == "cuda" else f"{self.backend} {self.arch}"

    def triton(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)


def target_of(gpu: GPU) -> Target:
    major, minor = gpu.capability
    return Target("cuda", 10 * major + minor, gpu.warp_size)


def device_target(device: torch.device) -> Target:
    major, minor = torch.cuda.get_device_capability(device)
    return Target("cuda", 10 * major + minor, 32)


# --------------------------------------------------------------------------
# Compiling one launch.
# --------------------------------------------------------------------------


def _runtime_options(jit, kwargs: dict) -> dict:
    """The options JITFunction.run adds to every launch (debug, instrumentation), as this Triton has them."""
    from triton import knobs

    out = {"debug": kwargs.get("debug", getattr(jit, "debug", None)) or knobs.runtime.debug}
    for name in ("instrumentation_mode", "fpsan_homomorphic_casts"):
        if hasattr(knobs.compilation, name):
            out[name] = getattr(knobs.compilation, name)
    return out


def launch_configs(launch: Launch) -> list[dict]:
    """The config sets to compile: the autotuner's choice where known, else every config; one empty set for a
    kernel that is not autotuned."""
    if "autotune" not in launch.wrappers:
        return [{}]
    if launch.chosen_config:
        return [launch.chosen_config]
    return launch.configs or [{}]


def _apply_heuristics(launch: Launch, named: dict) -> dict:
    """The constexprs ``triton.heuristics`` adds at launch, computed from the arguments as it does."""
    from triton.runtime.autotuner import Heuristics

    kernel, extra = launch.wrapper, {}
    while kernel is not None and kernel is not launch.jit:
        if isinstance(kernel, Heuristics):
            for name, rule in kernel.values.items():
                extra[name] = rule({**named, **extra})
        kernel = getattr(kernel, "fn", None)
    return extra


def compile_launch(launch: Launch, target: Target, config: dict | None = None):
    """``_compile_launch``, without Triton 3.9's warning (once per process) that its FP-fusion default will change:
    a compile for the report is not where a reader should meet it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
        return _compile_launch(launch, target, config)


def _compile_launch(launch: Launch, target: Target, config: dict | None = None):
    """Triton's CompiledKernel for ``launch`` (with ``config``'s constexprs and options, for an autotuned one),
    compiled for ``target``; the specialization (types, 16-byte divisibility, constexprs) is the one Triton's
    own launch computes from the same arguments."""
    import triton
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    jit = launch.jit
    named = launches_mod.stand_ins(launch)
    named.update(config or {})
    named.update(_apply_heuristics(launch, named))
    kwargs = {**{k: v for k, v in named.items() if k not in jit.arg_names}, **launch.options}
    kwargs.update({k: v for k, v in (config or {}).items() if k in launches_mod.LAUNCH_OPTIONS})
    kwargs.update(_runtime_options(jit, kwargs))
    call = {k: v for k, v in named.items() if k in jit.arg_names}
    backend = make_backend(target.triton())
    binder = create_function_from_signature(jit.signature, jit.params, backend)
    bound, specialization, options = binder(**call, **kwargs)
    options, signature, constexprs, attrs = jit._pack_args(backend, kwargs, bound, specialization, options)
    source = ASTSource
    if getattr(jit, "is_gluon", lambda: False)():  # a Gluon kernel (layouts its own): Gluon's source type
        from triton.experimental.gluon._runtime import GluonASTSource as source
    return triton.compile(source(jit, signature, constexprs, attrs), target=target.triton(), options=options.__dict__)


def compiled_info(compiled) -> dict:
    """What a CompiledKernel says about itself: warps, stages, shared memory, and on a GPU (where it can be
    loaded) registers and spills."""
    meta = compiled.metadata
    meta = meta._asdict() if hasattr(meta, "_asdict") else dict(getattr(meta, "__dict__", {}))
    keep = ("name", "hash", "num_warps", "num_stages", "num_ctas", "maxnreg", "shared", "target")
    info = {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v)) for k, v in meta.items() if k in keep}
    if torch.cuda.is_available():
        with contextlib.suppress(Exception):
            compiled._init_handles()
            info.update({k: getattr(compiled, k) for k in ("n_regs", "n_spills") if isinstance(getattr(compiled, k, None), int)})
    return info


def sass_of(compiled) -> tuple[str | None, str | None]:
    """(SASS, None) from the kernel's cubin through cuobjdump, or (None, why not)."""
    cubin = (getattr(compiled, "asm", None) or {}).get("cubin")
    if not cubin:
        return None, "no cubin"
    try:
        from triton.tools.disasm import get_sass

        return get_sass(cubin), None
    except Exception as e:  # noqa: BLE001 - no cuobjdump here, or one that refuses this architecture
        return None, f"{type(e).__name__}: {e}".splitlines()[0][:200]


_REPO = str(Path(__file__).resolve().parents[1]) + os.sep
_SITE = sysconfig.get_paths()["purelib"] + os.sep


def portable(text: str) -> str:
    """A level's text with this checkout's and the installed packages' folders left out of its source
    locations (``ops/gelu.py``, ``site-packages/triton/...``): the same on every machine."""
    text = text.replace(_REPO, "").replace(_SITE, "site-packages/")
    # Triton's cache keys a kernel by its source, not its file: a level compiled in another checkout
    # of the same code comes back with that checkout's folder.
    return _OTHER_CHECKOUT.sub("", text)


_OTHER_CHECKOUT = re.compile(r'(?<=")/[^"\n]*?/(?=(?:ops|compare|examples|tests)/[^"\n]*\.py")')




def specialization(launch: Launch, config: dict) -> dict:
    """What one compiled kernel stands for: its arguments as Triton specializes them (a pointer's dtype and
    16-byte alignment, an integer's divisibility by 16), its constexprs and options; no shape."""

    def kind(value):
        if isinstance(value, dict) and "tensor" in value:
            return f"*{value['tensor']}" + (" (16-byte aligned)" if value["aligned16"] else "")
        if isinstance(value, bool) or not isinstance(value, int):
            return value
        return 1 if value == 1 else ("int, a multiple of 16" if value % 16 == 0 else "int")

    constexprs = {**launch.constexprs, **{k: v for k, v in config.items() if k not in launches_mod.LAUNCH_OPTIONS}}
    return {"kernel": launch.kernel, "module": launch.module, "wrappers": launch.wrappers,
            "arguments": {k: kind(v) for k, v in launch.args.items() if k not in constexprs}, "constexprs": constexprs,
            "options": {**launch.options, **{k: v for k, v in config.items() if k in launches_mod.LAUNCH_OPTIONS}}}  # fmt: skip


def write_levels(compiled, launch: Launch, config: dict, root: Path, base: Path, sass: bool = True) -> dict:
    """``root/<kernel>/<hash>/<kernel>.<level>`` for each level and ``.json`` (the specialization and the
    compiled kernel's metadata); the row the indexes keep: folder (relative to ``base``), files, info."""
    info = compiled_info(compiled)
    folder = root / launch.kernel / str(info.get("hash", "unknown"))[:12]
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for level in LEVELS:
        text = compiled.asm.get(level)
        if isinstance(text, bytes):
            text = text.decode(errors="replace")
        if text:
            write_atomic(folder / f"{launch.kernel}.{level}", portable(text))
            files.append(f"{launch.kernel}.{level}")
    why_no_sass = "not asked for"
    if sass:
        text, why_no_sass = sass_of(compiled)
        if text:
            write_atomic(folder / f"{launch.kernel}.{SASS}", text)
            files.append(f"{launch.kernel}.{SASS}")
    about = {"specialization": specialization(launch, config), "compiled": info}
    if SASS not in {f.rsplit(".", 1)[1] for f in files}:
        about["no_sass"] = why_no_sass
    write_atomic(folder / f"{launch.kernel}.json", json.dumps(about, indent=1, default=str) + "\n")
    files.append(f"{launch.kernel}.json")
    return {"folder": str(folder.relative_to(base)), "files": files, "info": info, "config": config}


def _error_line(e: Exception) -> str:
    """One line for a kernel that did not compile.  Triton's CompilationError says where ("at 17:14:",
    the source line and a caret) and chains the error of the function it called: the line keeps the
    outermost place and the innermost cause."""
    inner = e
    while inner.__cause__ is not None:
        inner = inner.__cause__
    lines = [line.strip() for line in str(inner).splitlines() if line.strip() and set(line.strip()) != {"^"}]
    cause = f"{type(inner).__name__}: {lines[-1] if lines else ''}"
    if inner is e:
        return cause[:500]
    return f"{type(e).__name__} {str(e).strip().splitlines()[0]} {cause}"[:500]


def compile_all(found: list[Launch], target: Target, root: Path, base: Path, sass: bool = True) -> list[dict]:
    """Each launch compiled and written under ``root`` (per config of an autotuned one): a row per launch, with
    ``ir`` (one row of ``write_levels`` per config, folders relative to ``base``) or ``errors``."""
    rows = []
    for launch in found:
        row = {**launch.to_json(), "ir": [], "target": target.label}
        for config in launch_configs(launch):
            try:
                compiled = compile_launch(launch, target, config)
                row["ir"].append(write_levels(compiled, launch, config, root, base, sass))
            except Exception as e:  # noqa: BLE001 - one kernel that does not compile here leaves the others
                row.setdefault("errors", []).append(_error_line(e))
        rows.append(row)
    return rows


# --------------------------------------------------------------------------
# ``python -m compare.ir``: the levels of an op's kernels over its sweep.
# --------------------------------------------------------------------------


def op_ir(spec, cases: list[tuple], root: Path, gpu: GPU = H100, sass: bool = True, progress=print) -> dict:
    """Plan, compile and write every (dtype, shape) of ``cases`` for ``gpu``; the index (also written)."""
    target = target_of(gpu)
    index = {"op": spec.name, "gpu": gpu.name, "target": target.label, "cases": []}
    for dtype, shape in cases:
        label = f"{str(dtype).replace('torch.', '')} {spec.describe(shape)}"
        started = time.perf_counter()
        planned = launches_mod.planned_launches(spec, shape, dtype, gpu)
        rows = compile_all(planned.launches, target, root, root, sass)
        index["cases"].append({"dtype": str(dtype).replace("torch.", ""), "shape": list(shape),
                               "shape_label": spec.describe(shape), "launches": rows, "error": planned.error,
                               "notes": planned.notes})  # fmt: skip
        progress(f"{spec.name} {label}: {len(rows)} launch(es), {time.perf_counter() - started:.1f} s")
    root.mkdir(parents=True, exist_ok=True)
    write_atomic(root / "index.json", json.dumps(index, indent=1, default=str) + "\n")
    write_atomic(root / "index.md", index_markdown(index))
    return index


def index_markdown(index: dict) -> str:
    out = [f"# {index['op']}: tk's kernels, every level, for an {index['gpu']} ({index['target']})", ""]
    out += ["Planned on fake tensors of that GPU (the body runs, nothing launches), compiled by Triton for its"
            " target. Each folder holds the kernel's TTIR, TTGIR, LLIR, PTX (and SASS where cuobjdump exists) and"
            " a .json with the launch and the compiled kernel's metadata.", ""]  # fmt: skip
    for case in index["cases"]:
        out += [f"## {case['dtype']} {case['shape_label']}", ""]
        for row in case["launches"]:
            knobs = " ".join(f"{k}={v}" for k, v in {**row["constexprs"], **row["options"]}.items())
            out.append(f"- `{row['kernel']}` grid {row['grid']} {knobs}")
            for ir in row["ir"]:
                config = " ".join(f"{k}={v}" for k, v in ir["config"].items())
                levels = ", ".join(f"[{f.rsplit('.', 1)[1]}]({ir['folder']}/{f})" for f in ir["files"])
                regs = f"; {ir['info']['n_regs']} registers" if "n_regs" in ir["info"] else ""
                shared = f"{ir['info'].get('shared', '?')} B shared, {ir['info'].get('num_warps', '?')} warps{regs}"
                out.append(f"  - {('config ' + config + ': ') if config else ''}{levels} ({shared})")
            for error in row.get("errors", []):
                out.append(f"  - not compiled: {error}")
        if case["error"]:
            out.append(f"- the body stopped: {case['error']}")
        for note in case.get("notes", []):
            out.append(f"- note: {note}")
        out.append("")
    return "\n".join(out)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m compare.ir", description=(
        "Write TTIR, TTGIR, LLIR, PTX and SASS of an op's tk kernels for each shape, compiled for an H100"
        " (sm_90) on any machine: the launches are planned on fake tensors of that GPU."))  # fmt: skip
    p.add_argument("--op", default="gelu", help="op name, comma-separated names, or 'all' (default: gelu)")
    p.add_argument("--dtypes", "--dtype", default=None, help="comma-separated dtypes (default: the spec's first)")
    p.add_argument("--shapes", default=None, help="comma-separated shapes, or sweep|real|all (default: the GPU sweep)")
    p.add_argument("--gpu", default="h100", choices=sorted(launches_mod.GPUS), help="the GPU to plan for")
    p.add_argument("--out", default="logs", help="output root: writes <out>/ir/<op>/ (default: logs)")
    p.add_argument("--no-sass", action="store_true", help="skip SASS (cuobjdump)")
    return p


def main(argv=None) -> int:
    from . import selection as cli

    p = parser()
    args = p.parse_args(argv)
    import ops

    try:
        names = cli.op_names(args.op, ops.SPECS, f"known ops: {', '.join(sorted(ops.SPECS))}; or all")
        work = []
        for name in names:
            spec = ops.SPECS[name]
            dtypes = cli.parse_dtypes(args.dtypes, spec) if args.dtypes else [spec.dtypes[0]]
            if args.shapes is None or args.shapes in cli.SHAPE_SETS:
                shapes = cli.default_shapes(spec, torch.device("cuda"), args.shapes or "sweep")
            else:
                shapes = cli.parse_shapes(args.shapes, spec)
            work.append((spec, [(d, s) for d in dtypes for s in shapes]))
    except cli.UsageError as e:
        p.error(str(e))
    gpu = launches_mod.GPUS[args.gpu]
    for spec, cases in work:
        root = Path(args.out) / "ir" / spec.name
        index = op_ir(spec, cases, root, gpu, sass=not args.no_sass, progress=lambda m: print(m, flush=True))
        failed = sum(len(r.get("errors", [])) for c in index["cases"] for r in c["launches"])
        print(f"{spec.name}: {root}/index.md" + (f" ({failed} launch(es) not compiled: see it)" if failed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
