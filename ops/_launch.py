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
"""

import torch

try:
    from triton import knobs
    from triton.runtime import driver
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction
except ImportError:  # pragma: no cover - an older Triton: always launch through Triton
    knobs = None

_INT32_MIN, _INT32_END = -(2**31), 2**31


# Grid and block arithmetic on the host.  triton.cdiv and
# triton.next_power_of_2 are constexpr functions that unwrap their arguments
# on every call, about 3 µs each: several per launch for a small op.
def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


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
    32-bit; a float's type only.  (One loop, no helper calls: this runs on
    every eager launch.)"""
    keys = []
    for a in args:
        if isinstance(a, torch.Tensor):
            keys.append((a.dtype, a.data_ptr() % 16 == 0))
        elif type(a) is int:
            keys.append((a == 1, a % 16 == 0, _INT32_MIN <= a < _INT32_END))
        elif type(a) is float:
            keys.append(float)  # always an fp32 argument
        else:
            return None  # None, bool, anything else: Triton's own path
    return (tuple(keys), tuple(kwargs.items()))


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
        self.binaries = {}  # key -> (compiled kernel, the arguments after the positional ones, config)
        self.current_stream = None  # the driver's, looked up at the first launch: `driver.active` is a lazy proxy

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._launch(grid, args, kwargs)

    def _launch(self, grid, args, kwargs):
        key = specialization_key(args, kwargs)
        if key is None or _hooks_in_use():
            return self.kernel[grid](*args, **kwargs)
        device = _current_device()
        if self.autotuner is not None:
            key = (key, device, tuple(self._value(name, args, kwargs) for name in self.autotuner.keys))
        else:
            key = (key, device)
        found = self.binaries.get(key)
        if found is None:
            compiled = self.kernel[grid](*args, **kwargs)  # Triton's own path: compile, autotune, launch
            self._remember(key, grid, args, kwargs, compiled)
            return compiled
        compiled, tail, config = found
        if callable(grid):  # autotuned: the grid depends on the chosen block sizes
            grid = grid({**dict(zip(self.params, args)), **kwargs, **config})
        compiled.run(
            grid[0],
            grid[1] if len(grid) > 1 else 1,
            grid[2] if len(grid) > 2 else 1,
            self.current_stream(device),
            compiled.function,
            compiled.packed_metadata,
            None,  # launch metadata and the two hooks: only for launch hooks, which take Triton's path
            None,
            None,
            *args,
            *tail,
        )
        return compiled

    def _value(self, name, args, kwargs):
        index = self.params.index(name)
        return args[index] if index < len(args) else kwargs[name]

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
        self.binaries[key] = (compiled, tuple(named[name] for name in rest), config)


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
