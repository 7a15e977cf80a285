"""Launching a Triton kernel with less Python per call (eager CUDA calls only).

``kernel[grid](*args)`` goes through ``JITFunction.run``, which binds the
arguments, computes the *specialization* of each one (its dtype, whether a
pointer or an integer is divisible by 16, whether an integer equals 1), turns
that into a cache key, finds the compiled binary and launches it.  On the GPU
machines here that is about 21 µs of Python per launch, while the binary's own
launcher takes about 7 µs: for a small tensor, most of an op's time.

``FastKernel`` keeps Triton's answer.  The first call with a given
specialization goes through Triton as usual (compiling, autotuning) and
returns the compiled kernel; later calls with the same specialization call
its launcher directly.  The key reproduces everything Triton specializes on,
or more (more only costs an extra trip through Triton), so a binary is never
reused for arguments it was not compiled for: a misaligned pointer or an odd
size gets its own entry.  Anything unusual (None or bool arguments, launch
hooks that need Triton's path, a callable grid on a plain kernel) simply goes
through Triton.

Autotuned kernels are handled the same way, with the autotuner's own key (the
values of its ``key`` arguments) added to ours; the grid, a function of the
chosen config, is evaluated on each call.

The launch itself: Triton's launcher (``compiled.run``) is a Python method
around generated C that looks up each tensor's ``data_ptr`` through Python:
8 µs a launch on the H100 host we measured.  PyTorch ships a launcher for
Triton binaries written in C++, the one Inductor's generated code uses
(``torch._C._StaticCudaLauncher``): 6.5 µs there.  Given the binary's loaded
function, its block size, shared memory and the C types of its runtime
arguments, it launches; ``direct_launch_plan`` reads those from the compiled
kernel.  A binary that needs global scratch memory (a tensor descriptor
built inside the kernel is written there) gets it here, allocated for each
launch as Triton's launcher does.  A binary it cannot describe (profiling
scratch, clusters, cooperative launches, an argument type it does not
know), or a torch without that launcher, keeps Triton's.  A binary
compiled for programmatic dependent launch (``launch_pdl``) is launched by
Triton's launcher, which sets that launch attribute where PyTorch's sets
none, and is described all the same, so that the native lane replays it
with the attribute.
"""

import operator
import threading

import torch

try:
    from triton import knobs
    from triton.runtime import driver
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction
except ImportError:  # pragma: no cover - an older Triton: always launch through Triton
    knobs = None

try:  # private, so looked up with care: a torch without it launches through Triton
    _launch_kernel = torch._C._StaticCudaLauncher._launch_kernel
except AttributeError:
    _launch_kernel = None

_INT32_MIN, _INT32_END = -(2**31), 2**31

# The native lane's recorder (``_native.Recording``) while a body runs under it:
# each launch is reported to it, or spoils it if it does not go through
# PyTorch's C++ launcher (the only kind the native lane replays).
recording = threading.local()
recording.current = None


def spoil_recording(reason: str) -> None:
    current = getattr(recording, "current", None)
    if current is not None:
        current.spoil(reason)


def _hooks_in_use() -> bool:
    """Launch hooks (profilers) need Triton's own path: None, or an empty HookChain, means none."""
    for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def specialization_key(args, kwargs):
    """A hashable key at least as fine as Triton's cache key; None if an argument is not handled.

    What Triton specializes a runtime argument on: a tensor's dtype and whether
    its pointer is 16-byte aligned; an integer's being 1, a multiple of 16 and
    32-bit (here one small integer: -1 for 1, else multiple of 16 + 2 x 32-bit);
    a float's type only.  (One flat loop, no helper calls: this runs on every
    eager launch, with up to 18 arguments for a matmul.)"""
    key = []
    add = key.append
    for a in args:
        kind = type(a)
        if kind is int:
            add(-1 if a == 1 else (not a & 15) + 2 * (_INT32_MIN <= a < _INT32_END))
        elif kind is torch.Tensor or isinstance(a, torch.Tensor):
            add(a.dtype)
            add(not a.data_ptr() & 15)
        elif kind is float:
            add(float)  # always an fp32 argument
        else:
            return None  # None, bool, anything else: Triton's own path
    return (*key, *kwargs.items())


# The C type of each runtime argument, as the C++ launcher spells it
# (Python's argument-parsing codes): pointers are objects whose data_ptr it
# reads; 16-bit floats travel as fp32 arguments, as Triton passes them.
_C_TYPES = {"i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l", "u1": "I", "u8": "B", "u16": "H", "u32": "I",
            "u64": "K", "fp16": "f", "bf16": "f", "fp32": "f", "fp64": "d"}  # fmt: skip
# Buffers some binaries take after their arguments, passed as null when the
# binary needs none of it.  Global scratch is allocated per launch (bytes a
# program x programs); a binary that needs profiling scratch keeps Triton's
# launcher.
_SCRATCH = ("global_scratch_size", "profile_scratch_size")
_ALLOCATION_ALIGNMENT = 512  # what PyTorch's CUDA caching allocator guarantees


def direct_launch_plan(compiled, n_params: int):
    """``(function, warps, shared, C types, pick, scratch, overlapped, scratch bytes)`` for launching
    ``compiled`` through PyTorch's C++ launcher, or None where that launcher cannot: ``pick(all_arguments)``
    selects the runtime ones, in order; ``overlapped``: the binary is for programmatic dependent launch (see
    the module docstring); ``scratch bytes``: the global scratch each program needs (0: none)."""
    meta = compiled.metadata
    if getattr(meta, "num_ctas", 1) != 1 or getattr(meta, "launch_cooperative_grid", False):
        return None
    if getattr(meta, "cluster_dims", None) not in (None, (1, 1, 1)):
        return None
    if getattr(meta, "profile_scratch_size", 0):
        return None
    scratch_bytes = getattr(meta, "global_scratch_size", 0)
    if scratch_bytes and getattr(meta, "global_scratch_align", 1) > _ALLOCATION_ALIGNMENT:
        return None
    src = compiled.src
    names = list(src.signature)
    if len(names) != n_params:
        return None
    # Arguments Triton folded into the binary (constexprs, integers equal to 1) are not passed.
    folded = {names.index(k) if isinstance(k, str) else (k[0] if isinstance(k, tuple) else k) for k in src.constants}
    indices, types = [], []
    for index, name in enumerate(names):
        kind = src.signature[name]
        if kind == "constexpr" or index in folded:
            continue
        code = "O" if isinstance(kind, str) and kind.startswith("*") else _C_TYPES.get(kind)
        if code is None:
            return None  # a tensor descriptor, a tuple, a type this launcher does not take
        indices.append(index)
        types.append(code)
    scratch = tuple(None for name in _SCRATCH if hasattr(meta, name))
    types = "".join(types) + "O" * len(scratch)
    if len(indices) > 1:
        pick = operator.itemgetter(*indices)
    else:
        pick = (lambda a, i=indices[0]: (a[i],)) if indices else (lambda a: ())
    overlapped = bool(getattr(meta, "launch_pdl", False))
    if overlapped and scratch_bytes:  # Triton's launcher launches those, with scratch of its own
        return None
    return compiled.function, meta.num_warps, meta.shared, types, pick, scratch, overlapped, scratch_bytes


def _global_scratch(nbytes: int, device: int) -> torch.Tensor:
    """A launch's global scratch: fresh memory from PyTorch's allocator, freed once the launch is queued
    (the allocator hands it out again only to work queued after it on the stream)."""
    return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device))


def _report(compiled, function, grid, warps, shared, types, values, overlapped) -> None:
    """Tell the native lane's recorder, if one is watching, of a launch it can replay."""
    current = getattr(recording, "current", None)
    if current is not None:
        current.launch(compiled, function, grid, warps, shared, types, values, overlapped)


def _current_device() -> int:
    return torch._C._cuda_getDevice()  # what torch.cuda.current_device() returns, without its Python layers


class FastKernel:
    """``FastKernel(kernel)[grid](*args, **kwargs)`` launches like ``kernel[grid](...)``, faster after the first time."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.autotuner = kernel if isinstance(kernel, Autotuner) else None
        jit = kernel
        while not isinstance(jit, JITFunction):
            jit = jit.fn
        self.params = jit.arg_names
        # Where the autotuner's key arguments are: (position, name), read on every launch.
        self.tuned = [(self.params.index(name), name) for name in kernel.keys] if self.autotuner else []
        self.binaries = {}  # key -> (compiled kernel, the arguments after the positional ones, config, direct plan)
        self.current_stream = None  # the driver's, looked up at the first launch: `driver.active` is a lazy proxy

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._launch(grid, args, kwargs)

    def _launch(self, grid, args, kwargs):
        key = specialization_key(args, kwargs)
        if key is None or _hooks_in_use():
            spoil_recording("a launch through Triton's own path")
            return self.kernel[grid](*args, **kwargs)
        device = _current_device()
        if self.autotuner is not None:
            n = len(args)
            key = (key, device, tuple(args[i] if i < n else kwargs[name] for i, name in self.tuned))
        else:
            key = (key, device)
        found = self.binaries.get(key)
        if found is None:
            spoil_recording("a first launch (compiling or autotuning)")
            compiled = self.kernel[grid](*args, **kwargs)  # Triton's own path: compile, autotune, launch
            self._remember(key, grid, args, kwargs, compiled)
            return compiled
        compiled, tail, config, direct = found
        if callable(grid):  # autotuned: the grid depends on the chosen block sizes
            try:  # what a grid reads, as a rule: the config's block sizes (cheaper than naming every argument)
                grid = grid({**kwargs, **config})
            except KeyError:  # a grid that reads the arguments too
                grid = grid({**dict(zip(self.params, args)), **kwargs, **config})
        x, y, z = grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1
        stream = self.current_stream(device)
        if direct is not None:
            function, warps, shared, types, pick, scratch, overlapped, scratch_bytes = direct
            if scratch_bytes:  # as Triton's launcher does; the native lane records it as a temporary
                scratch = (_global_scratch(x * y * z * scratch_bytes, device), *scratch[1:])
            values = pick((*args, *tail)) + scratch
            if overlapped:  # PyTorch's launcher sets no launch attributes: Triton's sets the programmatic one
                self._run(compiled, x, y, z, stream, args, tail)
                _report(compiled, function, (x, y, z), warps, shared, types, values, overlapped)
                return compiled
            try:
                _launch_kernel(function, x, y, z, warps, shared, types, values, stream)
                _report(compiled, function, (x, y, z), warps, shared, types, values, overlapped)
                return compiled
            except (TypeError, ValueError, RuntimeError):  # refused: Triton's launcher from now on (its error, if any)
                self.binaries[key] = (compiled, tail, config, None)
        spoil_recording("a launch through Triton's launcher")
        return self._run(compiled, x, y, z, stream, args, tail)

    @staticmethod
    def _run(compiled, x, y, z, stream, args, tail):
        """Launch through Triton's launcher, which sets the binary's launch attributes."""
        # launch metadata and the two hooks: None, they are only for launch hooks, which take Triton's path
        compiled.run(x, y, z, stream, compiled.function, compiled.packed_metadata, None, None, None, *args, *tail)
        return compiled

    def _remember(self, key, grid, args, kwargs, compiled):
        """Keep the binary Triton chose, if a later call can be launched from it alone."""
        config = {}
        if self.autotuner is not None:
            best = getattr(self.autotuner, "best_config", None)
            if best is None or best.pre_hook is not None:
                return
            config = {k: v for k, v in best.all_kwargs().items() if k in self.params}
        elif callable(grid):
            return
        named = {**kwargs, **config}
        rest = self.params[len(args) :]
        if not all(name in named for name in rest):
            return  # a parameter left to its default: keep using Triton's path
        if getattr(compiled, "function", None) is None:
            return
        self.current_stream = driver.active.get_current_stream
        direct = None if _launch_kernel is None else direct_launch_plan(compiled, len(self.params))
        self.binaries[key] = (compiled, tuple(named[name] for name in rest), config, direct)


_fast: dict[int, object] = {}  # id(kernel) -> its FastKernel, or the kernel itself


def fast_kernel(kernel):
    """The ``FastKernel`` of ``kernel`` (one per kernel), or the kernel itself where the fast path does not apply.

    It applies to plain ``@triton.jit`` kernels and ``triton.autotune`` over one;
    other wrappers (``triton.heuristics``) compute arguments per call and keep
    Triton's path.  Called on every eager launch: the answer is cached.
    """
    found = _fast.get(id(kernel))
    if found is None:
        inner = kernel.fn if knobs is not None and isinstance(kernel, Autotuner) else kernel
        applies = knobs is not None and isinstance(inner, JITFunction)
        found = _fast[id(kernel)] = FastKernel(kernel) if applies else kernel
    return found
