"""The native lane: eager CUDA calls of a tk op replayed from C++ (see ``native.cpp``).

A tk op's body is Python, and on a small tensor the Python (the dispatcher's
trip into it, the checks, the allocation, the launch) costs more than the
kernel.  Trimming it has a floor (docs/perf-notes.md, version 10), so the
common case leaves Python altogether:

1. The op's kernel at ``AutogradCUDA`` and ``CUDA`` is C++.  It keys each
   call on its arguments' metadata and, for a key it has a plan for, allocates
   the outputs and launches the recorded Triton binaries itself.
2. A call with an unknown key runs the body through ``record``: the body runs
   as usual while every launch it makes through ``FastKernel`` and every
   PyTorch op it calls are watched.  If the body did nothing but allocate
   tensors, take views and launch binaries that PyTorch's C++ launcher could
   launch, the recording becomes a *description* (outputs, temporaries,
   launches, each pointer argument as input/output/temporary + byte offset),
   and the C++ side keeps it as a plan once two recordings of one key agree.
3. A call that needs a gradient, for an op whose backward is declared with
   ``register_formula`` (formula.py), gets a C++ autograd node: the forward
   runs below autograd (and is replayed as in 1), the node's backward calls
   the declared backward op through the dispatcher.
4. Everything else (another call that needs a gradient, a trace, a body that
   calls a PyTorch op such as ``.contiguous()`` on a strided input, a kernel
   Triton has to autotune first) takes the Python kernel it replaced, unchanged.

The extension is built with ``torch.utils.cpp_extension`` the first time
``ops`` is imported on a machine with a CUDA device (about 30-60 s, then
cached); ``TK_NATIVE=0`` turns the lane off.  Where it cannot be built, tk
warns once and keeps the Python path.
"""

import contextlib
import os
import shutil
import struct
import sys
import time
import warnings
from pathlib import Path

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from . import launch as _launch
from .direct import run_direct

_SOURCE = Path(__file__).with_name("native.cpp")
_INPUT, _OUTPUT, _TEMP, _VALUE = 0, 1, 2, 3  # a pointer's source, as native.cpp numbers them

_module = None
_tried = False


def module():
    """The built extension (built on the first call), or None where it is turned off or cannot be built."""
    global _module, _tried
    if _module is not None or _tried:
        return _module
    _tried = True
    if os.environ.get("TK_NATIVE", "1") == "0":
        return None
    try:
        from torch.utils import cpp_extension

        name = f"tk_native_{torch_tag()}"
        build = build_directory(name)
        clear_stale_lock(build)
        with build_tools_on_path():
            _module = cpp_extension.load(
                name=name, sources=[str(_SOURCE)], extra_cflags=["-O2"], build_directory=str(build)
            )
    except Exception as error:  # no compiler, no ninja, headers missing: the Python path still works
        warnings.warn(f"tk: the native lane could not be built, eager calls stay in Python ({error})", stacklevel=2)
    return _module


_BIN = os.path.dirname(sys.executable)

# A build takes about a minute; a lock older than this was left by a build that was killed.
STALE_LOCK_SECONDS = 15 * 60


def torch_tag() -> str:
    """torch's version as part of an extension's name: one build per torch, as the extension links
    against its C++ ABI."""
    return "".join(c if c.isalnum() else "_" for c in torch.__version__)


@contextlib.contextmanager
def build_tools_on_path():
    """This environment's own bin first on PATH while a build runs: ninja may come from there (the pip
    package), off PATH.  PATH is put back afterwards."""
    path = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([_BIN, path])
    try:
        yield
    finally:
        os.environ["PATH"] = path


def build_directory(name: str) -> Path:
    """Where cpp_extension would build ``name`` by itself (TORCH_EXTENSIONS_DIR or the user cache, one
    folder per Python and CUDA version, as the extension's ABI depends on both)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions"
    cuda = "cu" + torch.version.cuda.replace(".", "") if torch.version.cuda else "cpu"
    build = Path(root) / f"py{sys.version_info.major}{sys.version_info.minor}_{cuda}" / name
    build.mkdir(parents=True, exist_ok=True)
    return build


def clear_stale_lock(build: Path, max_age_s: float = STALE_LOCK_SECONDS, poll_s: float = 1.0) -> bool:
    """Wait while ``build/lock`` is young (another process building), and remove it once it is older than any
    build takes; True if one was removed.

    cpp_extension takes the lock for the length of a build and waits, without a
    time limit, for a lock it finds.  A build that was killed (a timeout, a
    machine that stopped) leaves the lock behind, and every later import of tk
    on that machine would wait forever; here the wait ends when the lock has
    aged past `max_age_s` (a live build removes it within about a minute)."""
    lock = build / "lock"
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return False
        if age >= max_age_s:
            break
        time.sleep(min(poll_s, max_age_s - age))
    warnings.warn(f"tk: removing {lock}, left {age / 60:.0f} min ago by a build that did not finish")
    lock.unlink(missing_ok=True)
    return True


def build_tools_present() -> bool:
    """A C++ compiler and ninja, which building the extension needs."""
    path = os.pathsep.join([_BIN, os.environ.get("PATH", "")])
    return shutil.which(os.environ.get("CXX", "c++")) is not None and shutil.which("ninja", path=path) is not None


def enabled_for_cuda() -> bool:
    """Whether tk ops register the native lane for CUDA (decided once, at import)."""
    return os.environ.get("TK_NATIVE", "1") != "0" and torch.cuda.is_available() and module() is not None


def register(namespace: str, name: str, body, fallback_autograd, fallback_backend, device: str = "cuda") -> None:
    """Put the native lane at ``Autograd<Device>`` and ``<Device>`` of ``namespace::name``.

    ``fallback_autograd(keyset, *args, **kwargs)`` and ``fallback_backend(*args, **kwargs)``
    are the Python kernels the lane stands in front of."""
    native = module()

    def recorder(keyset, *args, **kwargs):
        return record(body, args, kwargs)

    key = device.upper()
    native.register_lane(namespace, name, f"Autograd{key}", device, fallback_autograd, recorder)
    native.register_lane(
        namespace, name, key, device, lambda keyset, *args, **kwargs: fallback_backend(*args, **kwargs), recorder
    )


def register_autocast(namespace: str, name: str, device: str, policy: str) -> None:
    """At ``Autocast<Device>``, in C++, what ``policy`` says: cast ``namespace::name``'s floating inputs
    to float32 or to the autocast dtype, or set its dtype to float32 (see ``follow_autocast`` in
    autocast.py, whose Python kernel this replaces)."""
    module().register_autocast(namespace, name, device, policy)


def set_formula(namespace: str, name: str, description) -> None:
    """The backward of ``namespace::name`` as one call of another op, for its C++ autograd node
    (see ``register_formula`` in formula.py); None: calls needing a gradient go to Python."""
    refused = module().set_formula(namespace, name, description)
    if refused:
        raise ValueError(refused)


def stats() -> dict:
    """Per lane: plans kept, calls replayed from C++, calls that went to Python, autograd nodes made."""
    return {} if _module is None else _module.stats()


def clear() -> None:
    """Forget every plan.  A plan assumes the body's rules stay as they were when it
    was recorded: call this after changing one (a module constant, a patched helper)."""
    if _module is not None:
        _module.clear()


@contextlib.contextmanager
def paused():
    """Inside, every call runs the op's Python kernel (and nothing is recorded); plans are forgotten."""
    if _module is None:
        yield
        return
    _module.set_enabled(False)
    try:
        yield
    finally:
        _module.clear()
        _module.set_enabled(True)


# --------------------------------------------------------------------------
# Recording a body.
# --------------------------------------------------------------------------

_ALLOCATIONS = {
    torch.ops.aten.empty.memory_format,
    torch.ops.aten.empty_like.default,
    torch.ops.aten.empty_strided.default,
    torch.ops.aten.new_empty.default,
    torch.ops.aten.new_empty_strided.default,
}


class _Watch(TorchDispatchMode):
    """Sees every PyTorch op the body calls: allocations and views are fine, anything else is not replayable."""

    def __init__(self, recording):
        super().__init__()
        self.recording = recording

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _ALLOCATIONS:
            storage = out.untyped_storage()
            self.recording.allocated[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
        elif not func.is_view:
            self.recording.spoil(f"the body calls {func}")
        return out


class Recording:
    """What one run of a body did, as ``_launch`` reports it."""

    def __init__(self):
        self.launches = []  # (function, grid, threads, shared, overlapped, [(kind, value)]) with pointers still raw
        self.allocated = {}  # storage address -> (weak reference, bytes), for storages the body allocated
        self.spoiled = None  # why the run cannot be replayed
        self.kept = {}  # function handle -> compiled kernel: its binary must stay loaded

    def spoil(self, reason: str) -> None:
        if self.spoiled is None:
            self.spoiled = reason

    def launch(self, compiled, function, grid, warps, shared, types, values, overlapped=False) -> None:
        """A launch the body made; `overlapped`: as a programmatic dependent of the launch before it."""
        params = []
        for code, value in zip(types, values):
            if code != "O":
                params.append((_VALUE, _bits(code, value)))
            elif value is None:
                params.append((_VALUE, 0))  # a scratch buffer the binary does not use
            else:
                storage = value.untyped_storage()
                params.append(("ptr", (value.data_ptr(), storage.data_ptr())))
        self.kept[function] = compiled
        self.launches.append((function, grid, 32 * warps, shared, overlapped, params))

    def describe(self, args, out):
        """The description ``native.cpp`` builds a plan from, or None if this run cannot be replayed."""
        if self.spoiled is not None:
            return None
        outputs = out if isinstance(out, tuple) else (out,)
        if not all(_fresh(o, self.allocated) for o in outputs):
            return None
        tensors = {i: a for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
        in_use = [t.untyped_storage().data_ptr() for t in tensors.values() if t.numel()]
        if len(set(in_use)) < len(in_use):
            return None  # inputs that share memory: which one a pointer came from is ambiguous
        sources = [(_OUTPUT, j, o) for j, o in enumerate(outputs)] + [(_INPUT, i, a) for i, a in tensors.items()]
        storages = {t.untyped_storage().data_ptr(): (kind, index, t.data_ptr()) for kind, index, t in reversed(sources)}
        temps, launches = {}, []
        for function, grid, threads, shared, overlapped, params in self.launches:
            described = []
            for kind, value in params:
                if kind != "ptr":
                    described.append((kind, 0, value))
                    continue
                address, storage = value
                if storage in storages:
                    source, index, base = storages[storage]
                elif storage in self.allocated and self.allocated[storage][0].expired():
                    # allocated by the body and gone with it: a temporary, allocated afresh on replay
                    source, index, base = _TEMP, temps.setdefault(storage, len(temps)), storage
                else:
                    return None  # a buffer that outlives the call (a cache): not replayed
                described.append((source, index, address - base))
            launches.append((function, *grid, threads, shared, overlapped, described))
        temp_bytes = [0] * len(temps)
        for storage, index in temps.items():
            temp_bytes[index] = self.allocated[storage][1]
        _KEPT.update(self.kept)
        return list(outputs), temp_bytes, launches


_KEPT = {}  # every binary a plan launches (by function handle), so that its module is never unloaded


def record(body, args, kwargs):
    """Run ``body`` eagerly, watched: ``(its outputs, a description or None)``."""
    recording = Recording()
    previous = getattr(_launch.recording, "current", None)
    _launch.recording.current = recording
    try:
        with _Watch(recording):
            out = run_direct(body, args, kwargs)
    finally:
        _launch.recording.current = previous
    all_args = (*args, *kwargs.values())
    return out, recording.describe(all_args, out)


def _fresh(t, allocated) -> bool:
    """An output the C++ side can allocate the same way: a whole new storage, no view, no gradient."""
    if type(t) is not torch.Tensor or t._base is not None or t.requires_grad or t.storage_offset() != 0:
        return False
    storage = t.untyped_storage()
    if storage.data_ptr() not in allocated and t.numel() > 0:
        return False
    extent = 0 if t.numel() == 0 else 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return storage.nbytes() == extent * t.element_size()


def _bits(code: str, value) -> int:
    """An argument's bits as the signed 64-bit integer that fills its parameter slot."""
    if code == "f":
        return struct.unpack("<i", struct.pack("<f", value))[0]
    if code == "d":
        return struct.unpack("<q", struct.pack("<d", value))[0]
    value = int(value)
    return value - (1 << 64) if value >= 1 << 63 else value
