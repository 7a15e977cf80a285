"""Running tk's Triton kernels on CPU tensors through Triton's interpreter.

Triton interprets kernels (numpy executes each program of the grid) when
``TRITON_INTERPRET=1`` is set before ``triton`` is imported: ``@triton.jit``
then builds interpreted functions instead of compiled ones.  tk cannot rely
on that switch: the same process may run CUDA tensors (compiled kernels)
and CPU tensors (interpreted), and importing ``ops`` must not change how
other code's kernels are built.  So the CPU path builds the interpreted
version of a kernel itself.

One wrinkle: library functions such as ``tl.max`` or ``tl.sigmoid`` are
``@triton.jit`` functions too, and a compiled-mode jit function refuses to
be called from Python.  While an interpreted launch runs, such nested calls
are routed to the interpreter, exactly as ``TRITON_INTERPRET=1`` would do.

A second one: while it runs, the interpreter patches ``triton.language``, and
a Triton module imported for the first time in that window keeps the patched
objects for good.  Triton's code generator is such a module (its table of
builtins maps ``min`` to ``tl.core.builtin_min`` when it is imported), and the
interpreter's own argument conversion imports it lazily.  It is imported here,
before any launch, so that a CUDA compile after a CPU call still works.
"""

import contextlib
import threading

import numpy as np
import triton.compiler.code_generator  # noqa: F401  (imported before any patching: see the docstring)
from triton.language import core as tl_core
from triton.runtime import interpreter
from triton.runtime.jit import JITFunction

_lock = threading.Lock()
# id(jit function) -> (the jit function, its interpreted version).  The entry
# keeps the jit function alive, so that its id cannot be reused by another.
_functions: dict[int, tuple[JITFunction, interpreter.InterpretedFunction]] = {}


def _interpreted_function(kernel) -> interpreter.InterpretedFunction:
    """The interpreter's version of a jit function (autotuners are unwrapped)."""
    fn = kernel
    while not isinstance(fn, (JITFunction, interpreter.InterpretedFunction)):
        fn = fn.fn  # Autotuner and Heuristics keep the kernel they wrap in .fn
    if isinstance(fn, interpreter.InterpretedFunction):  # TRITON_INTERPRET=1 was set
        return fn
    found = _functions.get(id(fn))
    if found is None:
        found = _functions[id(fn)] = (fn, interpreter.InterpretedFunction(fn.fn))
    return found[1]


def _call_nested(jit_function, *args, **kwargs):
    """A jit function called from inside an interpreted kernel (``tl.max`` ...)."""
    return _interpreted_function(jit_function).rewrite()(*args, **kwargs)


def _sees_triton_core():
    """Its globals hold ``triton.language.core``: patching for it reaches the
    builtins that library functions such as ``tl.max`` call through ``core``."""
    return tl_core


@contextlib.contextmanager
def _nested_jit_calls_interpreted():
    with _lock:
        original = JITFunction.__call__
        JITFunction.__call__ = _call_nested
        core_patches = interpreter._patch_lang(_sees_triton_core)  # once per launch: patching is slow
        try:
            yield
        finally:
            core_patches.restore()
            JITFunction.__call__ = original


def _index(self) -> int:
    """A scalar's value as a Python int: range() bounds, indices.  The
    interpreter keeps scalars as 1-element arrays; Triton before 3.7 converts
    them with ``int(array)``, which NumPy 2.4 refuses for a 1-D array (every
    loop with a runtime bound failed on Triton 3.6).  This is Triton 3.9's own
    conversion."""
    return int(self.handle.data.squeeze())


_patch_lang_tensor = getattr(interpreter, "_patch_lang_tensor", None)
if _patch_lang_tensor is not None:

    def _patch_lang_tensor_with_index(tensor, scope):
        _patch_lang_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", _index)

    interpreter._patch_lang_tensor = _patch_lang_tensor_with_index


def bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """The bfloat16 nearest each of `values` (ties to even, as the GPU's cvt.rn.bf16), as uint16 bits.

    float32 input: round the bits at bit 16 (NaN kept quiet).  float64 input is rounded
    once, to 8 significant bits in float64 (every result is then a float32, exactly),
    not through float32, which would round twice."""
    if values.dtype == np.float64:
        with np.errstate(over="ignore", invalid="ignore"):
            mantissa, exponent = np.frexp(values)
            # below 2**-126 bfloat16 is subnormal: a fixed quantum of 2**-133
            exponent = np.maximum(exponent, -125)
            rounded = np.ldexp(np.rint(np.ldexp(values, 8 - exponent)), exponent - 8)
            values = rounded.astype(np.float32)  # exact, or inf past bfloat16's range
    bits = values.astype(np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x40), rounded).astype(np.uint16)


def bfloat16_values(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) as the float32 values they are, exactly."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


_cast_impl = getattr(getattr(interpreter, "InterpreterBuilder", None), "cast_impl", None)
if _cast_impl is not None:

    def _cast_bfloat16(self, src, dst_type):
        """Casts to and from bfloat16 done right; every other cast as the interpreter does it.

        numpy has no bfloat16: the interpreter keeps it as uint16 bits, converts them to
        and from float32 by truncating the mantissa (65504.0 became 65280, where the GPU
        rounds to the nearest, 65536), and any other pair (float64, float16, integers)
        with numpy's astype of the bits: float64 3.0 became the bfloat16 of bits 3 (about
        3e-40) and a bfloat16 read as float64 its bits as a number (Triton 3.6 to 3.9)."""
        src_type, dst_scalar = src.dtype.scalar, dst_type.scalar
        if dst_scalar == tl_core.bfloat16 and src_type != tl_core.bfloat16:
            values = src.data if src.data.dtype == np.float64 else src.data.astype(np.float32)
            return interpreter.TensorHandle(bfloat16_bits(values), dst_scalar)
        if src_type == tl_core.bfloat16 and dst_scalar != tl_core.bfloat16:
            values = bfloat16_values(src.data)
            return interpreter.TensorHandle(values.astype(interpreter._get_np_dtype(dst_type)), dst_scalar)
        return _cast_impl(self, src, dst_type)

    interpreter.InterpreterBuilder.cast_impl = _cast_bfloat16


class InterpretedKernel:
    """``kernel[grid](*args)`` on CPU tensors, run by Triton's interpreter.

    Launch options meant for the GPU compiler (num_warps, num_stages) are
    accepted and ignored.
    """

    def __init__(self, kernel):
        self.kernel = kernel  # kept alive: callers cache this object by id(kernel)
        self.function = _interpreted_function(kernel)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            with _nested_jit_calls_interpreted():
                return self.function.run(*args, grid=grid, warmup=False, **kwargs)

        return launch
