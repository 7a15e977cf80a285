"""What tk's op bodies launch: each kernel, its grid, arguments, constexprs and launch options.

Every launch of an op body goes through the runtime's ``launcher(kernel, like)[grid](...)``,
called by that name in each ops module; ``watching`` replaces the name in every module
for the length of a block, so each launch is seen:

* ``watching(found)`` forwards every launch to the real launcher: the kernels still
  run, and ``found`` says which ran, with what (the harness's tk variant, on its first
  call);
* ``watching(found, launch=False)`` launches nothing: with fake tensors on a fake GPU
  (``fake_gpu``), ``planned_launches`` gives what a device would run for a shape, on any
  machine, which is what ``compare.ir`` compiles.

A ``Launch`` keeps the kernel object (to compile it again) and a plain description of
each argument: enough to rebuild Triton's specialization of it (``stand_ins``): a
pointer's dtype and whether it is 16-byte aligned, an integer's value.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

# --------------------------------------------------------------------------
# One launch.
# --------------------------------------------------------------------------

LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "launch_pdl", "launch_cooperative_grid")


def unwrapped(kernel) -> tuple[object, list[str]]:
    """The JITFunction under a kernel and the wrappers around it, outermost first ("autotune", "heuristics")."""
    from triton.runtime.autotuner import Autotuner, Heuristics

    wrappers = []
    while isinstance(kernel, (Autotuner, Heuristics)):
        wrappers.append("autotune" if isinstance(kernel, Autotuner) else "heuristics")
        kernel = kernel.fn
    return kernel, wrappers


def describe_arg(value):
    """A launch argument as JSON can hold it: a tensor's dtype, shape, strides and 16-byte alignment."""
    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype).replace("torch.", ""), "shape": list(value.shape),
                "strides": list(value.stride()), "aligned16": _aligned16(value)}  # fmt: skip
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def _aligned16(t: torch.Tensor) -> bool:
    """Whether the tensor's first element sits on 16 bytes.  A fake tensor has no address: its storage is
    taken as PyTorch's allocators place it (on 512 bytes), so its offset decides."""
    try:
        return t.data_ptr() % 16 == 0
    except (RuntimeError, NotImplementedError):
        return t.storage_offset() * t.element_size() % 16 == 0


@dataclass
class Launch:
    """One ``launcher(kernel, like)[grid](*args, **kwargs)`` of a body."""

    kernel: str  # the @triton.jit function's name
    module: str  # where it is defined
    wrappers: list[str]  # "autotune", "heuristics", outermost first
    grid: list | str  # the grid, or "callable" (autotuned: a function of the chosen config)
    args: dict  # parameter name -> describe_arg(value), positional and keyword, in the kernel's order
    constexprs: dict  # the constexpr parameters given: name -> value
    options: dict  # num_warps, num_stages, ... as launched
    chosen_config: dict | None = None  # autotuned: the config the autotuner chose (after the launch ran)
    configs: list = field(default_factory=list)  # autotuned: every config it may choose
    jit: object = field(default=None, repr=False, compare=False)  # the kernel object itself (not saved)
    wrapper: object = field(default=None, repr=False, compare=False)
    # Each tensor argument's storage (``storage_key``), to tell which arguments are the op's own inputs (not saved).
    storages: dict = field(default_factory=dict, repr=False, compare=False)

    def to_json(self) -> dict:
        """Everything but the kernel objects and the storages."""
        return {k: v for k, v in vars(self).items() if k not in ("jit", "wrapper", "storages")}

    @property
    def label(self) -> str:
        """The kernel and what distinguishes this launch of it: its constexprs and warps."""
        knobs = {**self.constexprs, **{k: v for k, v in self.options.items() if k == "num_warps"}}
        return self.kernel + (" " + " ".join(f"{k}={v}" for k, v in knobs.items()) if knobs else "")


def _config_dict(config) -> dict:
    if config is None:
        return {}
    if hasattr(config, "all_kwargs"):
        return {k: v for k, v in config.all_kwargs().items() if v is not None}
    return dict(getattr(config, "kwargs", {}))


def record(kernel, grid, args: tuple, kwargs: dict) -> Launch:
    """The Launch of ``kernel[grid](*args, **kwargs)``, before it runs."""
    jit, wrappers = unwrapped(kernel)
    names = list(jit.arg_names)
    given = dict(zip(names, args))
    given.update({k: v for k, v in kwargs.items() if k in names})
    constexpr_names = {p.name for p in jit.params if p.is_constexpr}
    configs = [_config_dict(c) for c in getattr(kernel, "configs", [])] if "autotune" in wrappers else []
    return Launch(
        kernel=jit.fn.__name__,
        module=jit.fn.__module__,
        wrappers=wrappers,
        grid="callable" if callable(grid) else [int(g) for g in grid],
        args={name: describe_arg(given[name]) for name in names if name in given},
        constexprs={k: describe_arg(v) for k, v in given.items() if k in constexpr_names},
        options={k: v for k, v in kwargs.items() if k in LAUNCH_OPTIONS},
        configs=configs,
        jit=jit,
        wrapper=kernel,
        storages={name: storage_key(v) for name, v in given.items() if isinstance(v, torch.Tensor)},
    )


def storage_key(t: torch.Tensor) -> int:
    """Which storage a tensor views (one number for every view of it, fake tensors too), while it lives."""
    return t.untyped_storage()._cdata


def _after(launch: Launch) -> None:
    """What only the launch itself tells: the autotuner's choice (and the grid it gave)."""
    best = getattr(launch.wrapper, "best_config", None) if "autotune" in launch.wrappers else None
    if best is not None:
        launch.chosen_config = _config_dict(best)


# --------------------------------------------------------------------------
# Watching a body's launches.
# --------------------------------------------------------------------------


class _Watched:
    """Stands in for ``launcher(kernel, like)``: records each launch, then makes it (or not)."""

    def __init__(self, kernel, inner, found: list[Launch]):
        self.kernel, self.inner, self.found = kernel, inner, found

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            seen = record(self.kernel, grid, args, kwargs)
            self.found.append(seen)
            if self.inner is None:
                return None
            result = self.inner[grid](*args, **kwargs)
            _after(seen)
            return result

        return launch


def _ops_modules() -> list:
    return [m for name, m in list(sys.modules.items()) if m is not None and (name == "ops" or name.startswith("ops."))]


@contextlib.contextmanager
def watching(found: list[Launch], launch: bool = True):
    """Inside, every launch an op body makes is appended to ``found``; made too, unless ``launch`` is False."""
    real = importlib.import_module("ops.runtime.launcher").launcher

    def watched(kernel, like):
        return _Watched(kernel, real(kernel, like) if launch else None, found)

    patched = [m for m in _ops_modules() if getattr(m, "launcher", None) is real]
    for m in patched:
        m.launcher = watched
    try:
        yield found
    finally:
        for m in patched:
            m.launcher = real


# --------------------------------------------------------------------------
# A fake GPU: what a body plans and launches for a device this machine does not have.
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class GPU:
    """The properties of a GPU a body may ask torch for (``torch.cuda.get_device_properties``)."""

    name: str
    capability: tuple[int, int]
    multi_processor_count: int
    shared_memory_per_multiprocessor: int
    shared_memory_per_block_optin: int
    l2_bytes: int
    total_memory: int
    regs_per_multiprocessor: int = 65536
    max_threads_per_multi_processor: int = 2048
    warp_size: int = 32

    def props(self) -> SimpleNamespace:
        return SimpleNamespace(
            name=self.name, major=self.capability[0], minor=self.capability[1],
            multi_processor_count=self.multi_processor_count, regs_per_multiprocessor=self.regs_per_multiprocessor,
            max_threads_per_multi_processor=self.max_threads_per_multi_processor,
            shared_memory_per_multiprocessor=self.shared_memory_per_multiprocessor,
            shared_memory_per_block_optin=self.shared_memory_per_block_optin, L2_cache_size=self.l2_bytes,
            total_memory=self.total_memory, warp_size=self.warp_size,
        )  # fmt: skip


# The H100 SXM the plans were measured on, as torch reports it (ops.runtime.H100 holds the same facts).
H100 = GPU("NVIDIA H100 80GB HBM3", (9, 0), 132, 233472, 232448, 50 * 2**20, 80 * 2**30)
GPUS = {"h100": H100}


def _clear_ops_caches() -> None:
    """Forget what the ops asked of a device (``device_facts`` and friends are cached per CUDA device)."""
    for m in _ops_modules():
        for value in list(vars(m).values()):
            if isinstance(value, functools._lru_cache_wrapper):
                value.cache_clear()


_ABSENT = object()


def _basic_index(t: torch.Tensor, index):
    """``t[index]`` for basic indexing (ints, slices, ``...``, None) through aten's view ops, or NotImplemented.

    A CPU build of torch refuses Python indexing of a fake CUDA tensor ("not linked with support for cuda
    devices": the indexing path asks for a device guard), while the view ops themselves are fine."""
    items = list(index) if isinstance(index, tuple) else [index]
    if not all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in items):
        return NotImplemented
    if Ellipsis in items:
        at = items.index(Ellipsis)
        used = sum(i is not None and i is not Ellipsis for i in items)
        items[at : at + 1] = [slice(None)] * (t.dim() - used)
    dim = 0
    for item in items:
        if item is None:
            t = t.unsqueeze(dim)
            dim += 1
        elif isinstance(item, int):
            t = torch.ops.aten.select.int(t, dim, item)
        else:
            start, stop, step = item.indices(t.shape[dim])
            t = torch.ops.aten.slice.Tensor(t, dim, start, max(stop, start), step)
            dim += 1
    return t


@contextlib.contextmanager
def fake_gpu(gpu: GPU = H100):
    """Inside, torch answers questions about CUDA device 0 as ``gpu`` would, and fake CUDA tensors report
    16-byte-aligned addresses (as PyTorch's allocator gives), so a body plans as on that device."""
    from torch._subclasses.fake_tensor import FakeTensor

    props = gpu.props()
    saved = [(torch.cuda, n, getattr(torch.cuda, n)) for n in
             ("get_device_properties", "get_device_capability", "is_current_stream_capturing", "current_device")]
    saved += [(torch._C, "_cuda_getDevice", getattr(torch._C, "_cuda_getDevice", _ABSENT)),  # absent in a CPU build
              (FakeTensor, "data_ptr", FakeTensor.data_ptr), (FakeTensor, "__getitem__", FakeTensor.__getitem__)]  # fmt: skip
    python_getitem = torch.Tensor.__getitem__

    def getitem(self, index):
        found = _basic_index(self, index) if self.device.type == "cuda" else NotImplemented
        return python_getitem(self, index) if found is NotImplemented else found

    torch.cuda.get_device_properties = lambda device=None: props
    torch.cuda.get_device_capability = lambda device=None: gpu.capability
    torch.cuda.is_current_stream_capturing = lambda: False
    torch.cuda.current_device = lambda: 0
    torch._C._cuda_getDevice = lambda: 0
    FakeTensor.data_ptr = lambda self: (1 << 20) + self.storage_offset() * self.element_size()
    FakeTensor.__getitem__ = getitem
    _clear_ops_caches()
    try:
        yield gpu
    finally:
        for owner, name, value in saved:
            if value is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
        _clear_ops_caches()


def _direct_flag():
    return importlib.import_module("ops.runtime.direct")._direct


def _addmm_out_dtype_fake_is_broken() -> bool:
    """Whether this torch's fake (and meta) addmm with ``out_dtype`` fails: torch 2.11 registers its plain addmm
    decomposition, ``addmm(self, mat1, mat2, beta=1, alpha=1)``, for every addmm overload, ``addmm.dtype`` and
    ``addmm.dtype_out`` included, so their positional ``out_dtype`` lands in ``beta`` ("addmm() got multiple values
    for argument 'beta'").  Fixed in pytorch/pytorch#179634 (torch 2.13 has it), which gives those overloads their
    own decomposition; read from the table, so the workaround below ends with the bug."""
    from torch._decomp import decomposition_table

    aten = torch.ops.aten
    plain = decomposition_table.get(aten.addmm.default)
    overloads = [getattr(aten.addmm, name, None) for name in ("dtype", "dtype_out")]
    return plain is not None and any(decomposition_table.get(o) is plain for o in overloads if o is not None)


@functools.cache
def _planning_mode_class() -> type:
    """The fake tensor mode the planner runs a body in.  Where torch's fake addmm with ``out_dtype`` is broken
    (``_addmm_out_dtype_fake_is_broken``), a FakeTensorMode that computes those two overloads as torch 2.13's
    decomposition does (an mm with a float32 output, plus beta times the input): linear cross entropy's eager GPU
    plan sums a 16-bit weight gradient with ``addmm(..., out_dtype=torch.float32)``, which a real GPU runs on any
    torch, but which stopped the planner at its first chunk on torch 2.11.  Only this mode's instances change."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if not _addmm_out_dtype_fake_is_broken():
        return FakeTensorMode
    aten = torch.ops.aten

    def addmm_out_dtype(self, mat1, mat2, out_dtype, *, beta=1, alpha=1, out=None):
        result = torch.mm(mat1, mat2, out_dtype=out_dtype)
        result = result if alpha == 1 else alpha * result
        if beta != 0:  # beta = 0: the input is not read (NaN in it stays out), as in addmm
            result = result + beta * self.to(out_dtype)
        if out is None:
            return result
        if out.shape != result.shape:
            out.resize_(result.shape)
        return out.copy_(result)

    class PlanningFakeTensorMode(FakeTensorMode):
        def dispatch(self, func, types, args=(), kwargs=None):
            if func in (aten.addmm.dtype, aten.addmm.dtype_out):
                with self:  # as FakeTensorMode runs a decomposition: its ops on fake tensors, in this mode
                    return addmm_out_dtype(*args, **(kwargs or {}))
            return super().dispatch(func, types, args, kwargs)

    return PlanningFakeTensorMode


@dataclass
class Planned:
    """What a body launched on a fake GPU; ``error``: where it stopped, if it did (the launches before it stand)."""

    launches: list[Launch]
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    input_storages: set = field(default_factory=set)  # storage_key of each tensor the op was given


def planned_launches(spec, shape: tuple, dtype: torch.dtype, gpu: GPU = H100, eager: bool = True) -> Planned:
    """What ``spec.tk`` launches for inputs of ``shape`` and ``dtype`` on ``gpu``, found on fake tensors (nothing
    runs, on any machine).  ``eager``: a call nothing traces (the harness's tk variant); False: a call traced by
    torch.compile, which may take another design.

    Autograd on fake CUDA tensors needs a CUDA device: a CPU build of torch aborts the process (a C++ error, no
    exception) when autograd records one, and a CUDA build on a machine without a GPU fails at the backward
    ("hasPrimaryContext expects a valid device index").  So without a device the body runs under
    ``torch.no_grad()``: an op timed with its backward (a training step) then stops at the backward, and its
    forward's launches are what is found."""
    planned = Planned([])
    direct = _direct_flag()
    previous = getattr(direct, "on", False)
    has_device = torch.cuda.is_available()  # before fake_gpu: whether this machine has a real one
    grad_mode = contextlib.nullcontext() if has_device else torch.no_grad()
    fake_mode = _planning_mode_class()(allow_non_fake_inputs=True)
    with fake_gpu(gpu), watching(planned.launches, launch=False), fake_mode, grad_mode:
        direct.on = eager
        try:
            inputs = spec.make_inputs(tuple(shape), dtype, torch.device("cuda"))
            planned.input_storages = {storage_key(t) for t in inputs if isinstance(t, torch.Tensor)}
            spec.tk(*inputs)
        except Exception as e:  # noqa: BLE001 - what was launched before stands; the error says where it stopped
            planned.error = f"{type(e).__name__}: {e}".splitlines()[0][:500]
            if not has_device:
                planned.notes.append("planned under torch.no_grad(): without a CUDA device torch cannot run autograd"
                                     " on fake CUDA tensors, so a call that takes gradients stops at its backward")  # fmt: skip
        finally:
            direct.on = previous
    return planned


# --------------------------------------------------------------------------
# Triton's specialization of a recorded launch.
# --------------------------------------------------------------------------

_DTYPES = {name: getattr(torch, name) for name in ("float16", "bfloat16", "float32", "float64", "int8", "int16",
                                                 "int32", "int64", "uint8", "bool", "float8_e4m3fn", "float8_e5m2")}  # fmt: skip


class _Pointer:
    """A tensor as Triton's specialization sees it: a dtype and an address (aligned, or 8 bytes off)."""

    def __init__(self, dtype: torch.dtype, aligned: bool):
        self.dtype = dtype
        self._address = (1 << 20) + (0 if aligned else 8)

    def data_ptr(self) -> int:
        return self._address


def stand_ins(launch: Launch) -> dict:
    """Each argument of the launch as Triton's specialization needs it: tensors become ``_Pointer``s."""
    out = {}
    for name, value in launch.args.items():
        if isinstance(value, dict) and "tensor" in value:
            out[name] = _Pointer(_DTYPES[value["tensor"]], value["aligned16"])
        else:
            out[name] = value
    return out
