"""How a tk op is registered: one Triton body, two homes.

Every op is written once, as a *body*: a Python function that checks its
arguments, allocates outputs and launches Triton kernels through
``launcher(kernel, tensor)``.  ``register_op`` then publishes it as
``torch.ops.tk.<name>``:

* **CUDA**: the op is a ``torch.library.triton_op``.  Under ``torch.compile``
  Inductor traces into the body, sees each kernel through ``wrap_triton`` and
  puts the hand-written kernel itself into the generated code (no graph
  break).
* **CPU** (and meta/fake tensors): traced calls reach an opaque
  ``torch.library.custom_op`` named ``tk::<name>_cpu`` whose kernels are the
  *same* Triton kernels executed by Triton's interpreter.  Inductor cannot
  compile a user Triton kernel for the CPU, so on CPU the compiled graph calls
  that opaque op; its fake implementation is the body with launches skipped.
* **Eager calls** on either device take a shortcut (``_register_eager``): the
  ``custom_op`` machinery around a Python op costs tens of microseconds per
  call, more than a small kernel runs.  So an eager call goes from the
  dispatcher's autograd key straight into the body, which launches the
  Triton kernels directly; one that needs a gradient runs the op's own
  autograd formula in a plain ``torch.autograd.Function`` around the body
  (on CUDA, a formula declared with ``register_formula`` runs in the native
  lane's C++ autograd node instead; see _native.py).
  Calls that are being traced (fake, functional or proxy tensors, a dispatch
  mode, ``torch.func``) take the full ``custom_op``/``triton_op`` path, so
  compiled graphs still see the ``triton_op``.

So the numbers a CPU test checks come from the very kernels that run on the
GPU, only interpreted (slowly) by numpy instead of compiled.
"""

import functools
import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake
from torch.library import triton_op, wrap_triton

try:  # the autograd kernel custom_op registers; the eager shortcut falls back to it
    from torch._library.autograd import make_autograd_impl
except ImportError:  # pragma: no cover - a torch without it keeps the plain triton_op path
    make_autograd_impl = None

from . import _native
from ._interpreter import InterpretedKernel
from ._launch import FastKernel, fast_kernel, spoil_recording

NAMESPACE = "tk"

# --------------------------------------------------------------------------
# Launching a kernel on whatever device the tensors live on.
# --------------------------------------------------------------------------


class _SkipLaunch:
    """Stands in for a kernel when the tensors are fake: shapes only, no data."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


_SKIP = _SkipLaunch()
_interpreted: dict[int, InterpretedKernel] = {}


_direct = threading.local()  # .on: this thread runs a body eagerly, launching kernels itself


def launcher(kernel, like: torch.Tensor):
    """What to index with a grid to launch ``kernel`` on ``like``'s device.

    CUDA: ``wrap_triton(kernel)``, which Inductor can trace, or, inside an
    eager shortcut, the kernel launched directly (see ``_launch.py``).
    CPU: the same kernel run by Triton's interpreter.  Fake or meta tensors:
    nothing runs.
    """
    if like.device.type == "cuda":
        if not getattr(_direct, "on", False):
            return wrap_triton(kernel)
        fast = fast_kernel(kernel)
        if not isinstance(fast, FastKernel):
            spoil_recording(f"{kernel} launches through Triton's own path")
        return fast
    if like.device.type == "meta" or is_fake(like):
        return _SKIP
    spoil_recording("a kernel run by Triton's interpreter")
    found = _interpreted.get(id(kernel))
    if found is None:
        found = _interpreted[id(kernel)] = InterpretedKernel(kernel)
    return found


def launching_directly() -> bool:
    """Whether this thread runs an op's body eagerly, launching kernels itself (not traced for Inductor)."""
    return getattr(_direct, "on", False)


def on_cuda(t: torch.Tensor) -> bool:
    return t.device.type == "cuda"


# --------------------------------------------------------------------------
# Argument checks shared by the ops: clear errors before any kernel runs.
# --------------------------------------------------------------------------

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
SUPPORTED_DEVICES = ("cuda", "cpu", "meta")


def check_tensor(op: str, arg: str, t, dtypes=FLOAT_DTYPES, ndims=None) -> None:
    """Raise TypeError/ValueError naming ``op``'s argument ``arg`` if ``t`` does not fit."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"tk.{op}: {arg} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"tk.{op}: {arg} has dtype {_name(t.dtype)}; supported: {_names(dtypes)}")
    if t.device.type not in SUPPORTED_DEVICES:
        raise ValueError(f"tk.{op}: {arg} is on device {t.device}; tk ops run on cuda and cpu")
    if ndims is not None and t.dim() not in ndims:
        want = " or ".join(str(n) for n in ndims)
        raise ValueError(f"tk.{op}: {arg} must be {want}-D, got a {t.dim()}-D tensor of shape {tuple(t.shape)}")


def result_dtype(op: str, arg: str, dtype: torch.dtype | None, default: torch.dtype) -> torch.dtype:
    """A ``dtype`` argument asking for a result's dtype: ``default`` if None, else a floating dtype."""
    if dtype is None:
        return default
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"tk.{op}: {arg} {_name(dtype)} is not a floating dtype; supported: {_names(FLOAT_DTYPES)}")
    return dtype


def reads_as_float32(x_dtype: torch.dtype, dtype: torch.dtype) -> bool:
    """Whether a result asked for in `dtype` can come from an x of `x_dtype` read as it is: a 16-bit
    x into float32.  tk's kernels compute 16-bit inputs in float32, so casting x first (what a
    `dtype` argument means in PyTorch, and autocast's cast) gives the same bits for 8 more
    bytes an element."""
    return dtype == torch.float32 and x_dtype in (torch.float16, torch.bfloat16)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _names(dtypes) -> str:
    return ", ".join(map(_name, dtypes))


def check_same(op: str, tensors: dict[str, torch.Tensor]) -> None:
    """All tensors on one device and of one dtype."""
    (first_name, first), *rest = tensors.items()
    for name, t in rest:
        if t.device != first.device:
            raise ValueError(f"tk.{op}: {first_name} is on {first.device} but {name} is on {t.device}")
        if t.dtype != first.dtype:
            raise TypeError(f"tk.{op}: {first_name} has dtype {first.dtype} but {name} has dtype {t.dtype}")


def is_dense(t: torch.Tensor) -> bool:
    """True if ``t``'s elements fill one contiguous span of memory (any order)."""
    return t.is_contiguous() or torch._prims_common.is_non_overlapping_and_dense_or_false(t)


# --------------------------------------------------------------------------
# Registration.
# --------------------------------------------------------------------------


def register_op(name: str, body: Callable) -> Any:
    """Publish ``body`` as ``torch.ops.tk.<name>`` (see the module docstring).

    ``body`` needs type hints (the schema is inferred from them) and must
    launch its kernels through ``launcher``.  Returns the op's CustomOpDef,
    on which autograd can be registered.
    """
    cpu_op = torch.library.custom_op(f"{NAMESPACE}::{name}_cpu", body, mutates_args=(), device_types="cpu")
    cpu_op.register_fake(body)

    @functools.wraps(body)
    def dispatch(*args, **kwargs):
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        if device.type == "cuda":
            return body(*args, **kwargs)
        return cpu_op(*args, **kwargs)

    op = triton_op(f"{NAMESPACE}::{name}", dispatch, mutates_args=())
    if make_autograd_impl is not None:
        _register_eager(name, op, body)
    _keep_formulas_in_step(name, op)
    return op


_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def _run_direct(body: Callable, args, kwargs):
    """Run ``body`` with its kernels launched straight through Triton."""
    previous = getattr(_direct, "on", False)
    _direct.on = True
    try:
        for a in args:
            if isinstance(a, torch.Tensor):
                index = a.get_device()  # -1 on the CPU
                if index >= 0 and index != torch._C._cuda_getDevice():
                    with torch.cuda.device(index):  # Triton launches on the current device
                        return body(*args, **kwargs)
                break
        return body(*args, **kwargs)
    finally:
        _direct.on = previous


def _register_eager(name: str, op, body: Callable) -> None:
    """Kernels that let eager calls skip ``custom_op``'s Python layers.

    * ``AutogradCUDA`` and ``AutogradCPU`` (more specific than the
      ``Autograd`` alias custom_op registers, so they win): when nothing
      traces the call, run it right here; the body itself if no input needs a
      gradient, else the op's autograd formula around the body
      (``_DirectAutograd``).  Traced calls go to custom_op's own autograd
      kernel, built the same way, as do calls with keyword-only arguments
      that need a gradient and ops with no formula.
    * ``CUDA`` and ``CPU``: where that autograd kernel redispatches to; runs
      the body directly too.

    Tracing never takes the shortcut: fake and functional tensors are
    subclasses (``type(t)`` is not ``torch.Tensor``), proxy tracing runs
    under a dispatch mode, and ``torch.func`` transforms are asked directly.
    """
    autograd_kernel = make_autograd_impl(op._opoverload, op)
    direct_autograd = _DirectAutograd(name, op, body)

    def eager_autograd(keyset, *args, **kwargs):
        route = _eager_route(args)
        if route is _PLAIN:
            return _run_direct(body, args, kwargs)
        if route is _GRAD and not kwargs and direct_autograd.ready():
            return direct_autograd(args)
        return autograd_kernel(keyset, *args, **kwargs)

    def eager_backend(*args, **kwargs):
        return _run_direct(body, args, kwargs)

    if _NATIVE_CUDA:  # C++ in front of both, replaying calls it has seen (see _native.py)
        _native.register(NAMESPACE, name, body, eager_autograd, eager_backend, "cuda")
    devices = ("CPU",) if _NATIVE_CUDA else ("CUDA", "CPU")
    for device in devices:
        _LIBRARY.impl(name, eager_autograd, f"Autograd{device}", with_keyset=True)
        _LIBRARY.impl(name, eager_backend, device)


_NATIVE_CUDA = _native.enabled_for_cuda()


class _DirectAutograd:
    """An op's registered autograd formula as a plain ``torch.autograd.Function`` around its body.

    custom_op's autograd kernel applies a generated Function too, but its
    forward goes back through the dispatcher (redispatch below autograd, then
    the backend kernel) and refills default arguments from the schema on every
    call; this one calls the body and the op's own ``setup_context`` and
    ``backward`` directly.  The formula is read from the op when the first
    call needs it, and again if it is re-registered.
    """

    def __init__(self, name: str, op, body: Callable):
        self.name, self.op, self.body = name, op, body
        # The dispatcher drops trailing arguments equal to their defaults;
        # setup_context expects every input, as with custom_op.
        self.defaults = tuple(p.default for p in inspect.signature(body).parameters.values())
        self.formula = None
        self.function = None

    def ready(self) -> bool:
        """True if the op has a formula (else custom_op's kernel says so at backward time).

        The formula lives in the attributes make_autograd_impl reads; a torch
        without them gets custom_op's kernel, not an error."""
        formula = (getattr(self.op, "_backward_fn", None), getattr(self.op, "_setup_context_fn", None))
        if formula[0] is None:
            return False
        if formula != self.formula:
            self.formula, self.function = formula, self._function(*formula)
        return True

    def __call__(self, args):
        return self.function.apply(*args, *self.defaults[len(args) :])

    def _function(self, backward: Callable, setup_context: Callable | None):
        body, op = self.body, self.op._opoverload

        # forward takes ctx and calls setup_context itself: a Function with a
        # separate setup_context staticmethod binds its arguments with
        # inspect.signature on every call, tens of microseconds.
        def forward(ctx, *inputs):
            if _NATIVE_CUDA and _first_device_type(inputs) == "cuda":
                output = op(*inputs)  # grad is off in here: the native lane can replay it
            else:
                output = _run_direct(body, inputs, {})
            if setup_context is not None:
                setup_context(ctx, inputs, output)
            return output

        members = {"forward": staticmethod(forward), "backward": staticmethod(backward)}
        return type(f"{self.name}_direct", (torch.autograd.Function,), members)


def _first_device_type(args) -> str | None:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device.type
    return None


_PLAIN, _GRAD, _TRACED = "plain", "grad", "traced"


def _eager_route(args) -> str:
    """How an eager call runs: ``_PLAIN`` (the body, no autograd), ``_GRAD``
    (an input needs a gradient) or ``_TRACED`` (torch.library's own path)."""
    if torch._C._len_torch_dispatch_stack() or torch.compiler.is_compiling() or _functorch_active():
        return _TRACED
    grad = torch.is_grad_enabled()
    route = _PLAIN
    for a in args:
        if isinstance(a, torch.Tensor):
            if type(a) not in _PLAIN_TENSORS:
                return _TRACED
            if grad and a.requires_grad:
                route = _GRAD
    return route


# A torch.func transform (grad, vmap) wraps the arguments: leave those to
# torch.library.  Looked up once: _eager_route runs on every eager call.
_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)


# --------------------------------------------------------------------------
# torch.autocast: the cast PyTorch makes for the op a tk op stands in for.
# --------------------------------------------------------------------------

LOWER_PRECISION = "lower_precision"  # floating inputs in the autocast dtype, as for torch.matmul
FLOAT32 = "float32"  # floating inputs in float32: PyTorch's float32 list, as for F.layer_norm on CUDA
# FLOAT32 but for the first input, which comes as it is, and an unset `dtype` argument
# set to float32: for ops whose kernels widen a 16-bit input themselves and write a
# float32 result, so that the copy a cast would make is never made.  torch.softmax on
# CUDA (PyTorch's fp32_set_opt_dtype, with no other input) and the norms (on the float32
# list: their weights and biases are cast, as FLOAT32 casts them; they are small).
FLOAT32_RESULT = "float32_result"
_POLICIES = (LOWER_PRECISION, FLOAT32, FLOAT32_RESULT)


def follow_autocast(name: str, policies: dict[str, str]) -> None:
    """Under ``torch.autocast``, cast ``tk.<name>``'s inputs as PyTorch casts its own op's.

    ``policies`` maps a device type to LOWER_PRECISION, FLOAT32 or
    FLOAT32_RESULT (for an op with a ``dtype`` argument, whose kernels widen
    the first input themselves), copied from the
    lists PyTorch keeps per device (aten/src/ATen/autocast_mode.cpp); a
    device type left out runs the inputs as they come, as PyTorch does for an
    op on neither list.  Without this, an autocast model breaks at its first tk
    op: ``tk.matmul`` of an activation autocast left in bfloat16 and a float32
    weight is a dtype mismatch.  As in PyTorch, float64 tensors and tensors on
    another device are not cast, and the cast is differentiable, so gradients
    reach float32 weights in float32.  The kernel sits at the
    ``Autocast<Device>`` key, which the dispatcher visits only while autocast
    is on: other calls pay nothing."""
    op = getattr(getattr(torch.ops, NAMESPACE), name).default
    for device_type, policy in policies.items():
        if policy not in _POLICIES:
            raise ValueError(f"tk.{name}: unknown autocast policy {policy!r} for {device_type}")
        if policy == FLOAT32_RESULT and _dtype_position(op) is None:
            raise ValueError(f"tk.{name}: autocast policy {policy!r} needs a `dtype` argument, and {op._schema} has none")
        if not torch._C._is_autocast_available(device_type):
            raise ValueError(f"tk.{name}: torch.autocast has no {device_type!r} device type")
        if device_type == "cuda" and _NATIVE_CUDA:  # the same casts in C++ (see _native.cpp)
            _native.register_autocast(NAMESPACE, name, device_type, policy)
            continue
        _LIBRARY.impl(name, _autocast_kernel(op, device_type, policy), autocast_key(device_type), with_keyset=True)


def autocast_key(device_type: str) -> str:
    """The dispatch key autocast kernels of ``device_type`` sit at: AutocastCUDA, AutocastCPU..."""
    return "Autocast" + torch._C._dispatch_key_for_device(device_type)


def _autocast_kernel(op, device_type: str, policy: str) -> Callable:
    """The casts in Python: cast (or set the dtype), then call ``op`` with autocast's key excluded,
    as PyTorch's kernels do."""
    key = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, autocast_key(device_type)))
    dtype_at = _dtype_position(op)

    def kernel(keyset, *args, **kwargs):
        dtype = torch.get_autocast_dtype(device_type) if policy == LOWER_PRECISION else torch.float32
        first = ()
        if policy == FLOAT32_RESULT:  # the first argument as it comes, a float32 result asked for
            args, kwargs = _set_float32_dtype(args, kwargs, dtype_at, device_type)
            first, args = args[:1], args[1:]
        args = [*first, *(_autocast(a, device_type, dtype) for a in args)]
        kwargs = {k: _autocast(v, device_type, dtype) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(key):
            return op(*args, **kwargs)

    return kernel


def _dtype_position(op) -> int | None:
    """Where ``op``'s ``dtype`` argument is, if it has one."""
    names = [a.name for a in op._schema.arguments]
    return names.index("dtype") if "dtype" in names else None


def _set_float32_dtype(args, kwargs, at: int, device_type: str):
    """FLOAT32_RESULT: if the first argument is a tensor autocast would cast and no dtype is
    given, ask for float32.  (The dispatcher leaves out trailing arguments at their defaults,
    so an unset dtype may be missing from ``args``.)"""
    if not (args and _eligible(args[0], device_type)):  # float64, another device: as given
        return args, kwargs
    if len(args) > at:
        if args[at] is None:
            args = (*args[:at], torch.float32, *args[at + 1 :])
    elif kwargs.get("dtype") is None:
        kwargs = {**kwargs, "dtype": torch.float32}
    return args, kwargs


def _autocast(value, device_type: str, dtype: torch.dtype):
    """An argument as autocast hands it to an op: floating tensors on its device in ``dtype``, float64 kept."""
    if _eligible(value, device_type):
        return value.to(dtype)
    return value


def _eligible(value, device_type: str) -> bool:
    """Whether autocast casts ``value``: a floating tensor on its device, not float64."""
    return (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dtype != torch.float64
        and value.device.type == device_type
    )


# --------------------------------------------------------------------------
# Backward formulas that are one call of another op.
# --------------------------------------------------------------------------

GRAD = "grad"  # the incoming gradient (of the op's one result)
RESULT = "result"  # the op's result, saved for the backward
_INCOMING, _ARGUMENT, _RESULT, _NEEDS, _DTYPE = 0, 1, 2, 3, 4  # tokens, numbered as _native.cpp numbers them
_NO_GRADIENT, _IS_INCOMING = -2, -1


def needs_grad(name: str) -> tuple[str, str]:
    """A backward argument: whether forward argument ``name`` needs a gradient (a bool)."""
    return ("needs_grad", name)


def dtype_of(name: str) -> tuple[str, str]:
    """A backward argument: the dtype of forward tensor argument ``name`` (saved, not the tensor)."""
    return ("dtype_of", name)


def register_formula(op, *, backward=None, arguments=(), gradients: dict[str, Any]) -> None:
    """Declare ``op``'s backward as one call ``backward(*arguments)`` of another tk op
    (both as ``register_op`` returns them).

    ``arguments`` lists what that op is called with: ``GRAD``, ``RESULT``, a
    forward argument by name (saved from the forward), ``needs_grad(name)`` or
    ``dtype_of(name)``.
    ``gradients`` maps each forward argument that gets a gradient to ``GRAD``
    (the incoming gradient itself) or to the index of the backward op's
    result that is its gradient.  For example, softmax's::

        register_formula(softmax, backward=softmax_backward,
                         arguments=(GRAD, RESULT, "dim", dtype_of("x")), gradients={"x": 0})

    One declaration serves both paths.  It registers the same formula in
    Python through ``op.register_autograd`` (traced calls, the CPU), and on
    CUDA hands it to the native lane, whose C++ autograd node runs it with no
    Python on either side of the call.  An op whose backward is more than
    that (cross_entropy's, with two results) calls ``register_autograd``
    itself.
    """
    formula = Formula(op._opoverload, None if backward is None else backward._opoverload, arguments, gradients)
    op.register_autograd(formula.backward, setup_context=formula.setup_context)
    if _NATIVE_CUDA:
        _native.set_formula(NAMESPACE, formula.op_name, formula.native_description())


class Formula:
    """A parsed ``register_formula`` declaration: its Python formula and the native lane's description."""

    def __init__(self, op, backward, arguments, gradients: dict[str, Any]):
        schema = op._schema
        if len(schema.returns) != 1:
            raise ValueError(f"{schema.name}: register_formula is for an op with one result; use register_autograd")
        self.op_name = schema.name.split("::")[-1]
        self.backward_op = backward
        names = [a.name for a in schema.arguments]
        position = {name: i for i, name in enumerate(names)}

        def token(a) -> tuple[int, int]:
            name = a[1] if isinstance(a, tuple) else a
            if name not in position and name not in (GRAD, RESULT):
                raise ValueError(f"{schema.name}: the formula names {name!r}, not one of its arguments {names}")
            if isinstance(a, tuple):
                return (_NEEDS if a[0] == "needs_grad" else _DTYPE), position[name]
            if a == GRAD:
                return _INCOMING, 0
            return (_RESULT, 0) if a == RESULT else (_ARGUMENT, position[a])

        self.tokens = [token(a) for a in arguments]
        for name in gradients:
            token(name)
        self.gradients = [gradients.get(name) for name in names]  # per forward argument
        self.tensors = [i for kind, i in self.tokens if kind == _ARGUMENT and _is_tensor(schema.arguments[i].type)]
        self.values = [i for kind, i in self.tokens if kind == _ARGUMENT and i not in self.tensors]
        self.saves_result = any(kind == _RESULT for kind, _ in self.tokens)
        self.dtypes = [i for kind, i in self.tokens if kind == _DTYPE]

    def setup_context(self, ctx, inputs, output):
        ctx.save_for_backward(*(inputs[i] for i in self.tensors), *((output,) if self.saves_result else ()))
        ctx.values = {i: inputs[i] for i in self.values}
        ctx.dtypes = {i: inputs[i].dtype for i in self.dtypes}

    def backward(self, ctx, grad):
        saved = ctx.saved_tensors
        kept = {**dict(zip(self.tensors, saved)), **ctx.values}

        def argument(kind, i):
            if kind == _INCOMING:
                return grad
            if kind == _RESULT:
                return saved[-1]
            if kind == _DTYPE:
                return ctx.dtypes[i]
            return ctx.needs_input_grad[i] if kind == _NEEDS else kept[i]

        results = () if self.backward_op is None else self.backward_op(*(argument(k, i) for k, i in self.tokens))
        results = results if isinstance(results, (tuple, list)) else (results,)
        return tuple(
            None if g is None or not ctx.needs_input_grad[i] else grad if g == GRAD else results[g]
            for i, g in enumerate(self.gradients)
        )

    def native_description(self) -> tuple:
        """(node name, backward op, tokens, gradient codes), as ``_native.cpp``'s ``formula_from`` reads it."""
        node_name = "Tk" + "".join(part.capitalize() for part in self.op_name.split("_")) + "Backward"
        backward_name = "" if self.backward_op is None else self.backward_op._schema.name
        codes = [_NO_GRADIENT if g is None else _IS_INCOMING if g == GRAD else int(g) for g in self.gradients]
        return node_name, backward_name, self.tokens, codes


def _is_tensor(schema_type) -> bool:
    """A ``Tensor`` or ``Tensor?`` argument."""
    return schema_type.isSubtypeOf(torch._C.OptionalType(torch._C.TensorType.get()))


def _keep_formulas_in_step(name: str, op) -> None:
    """A formula registered later with ``op.register_autograd`` replaces a declared one on both paths:
    the native lane forgets its copy, so calls needing a gradient go to the new Python formula."""
    if not _NATIVE_CUDA:
        return
    register_autograd = op.register_autograd

    @functools.wraps(register_autograd)
    def register_autograd_and_forget(*args, **kwargs):
        _native.set_formula(NAMESPACE, name, None)
        return register_autograd(*args, **kwargs)

    op.register_autograd = register_autograd_and_forget


# --------------------------------------------------------------------------
# The spec: what the comparison harness needs to know about an op.
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class OpSpec:
    """A declarative description of one op, read by ``compare`` and the tests.

    Shapes are op-specific tuples (numel for gelu, (rows, cols) for softmax,
    (M, N, K) for matmul); everything the harness does with one goes through
    the callables below, so the harness needs no op-specific code.
    """

    name: str
    tk: Callable  # the hand-written op: tk(*inputs)
    reference: Callable  # the PyTorch op it competes with, same call
    make_inputs: Callable[[tuple, torch.dtype, torch.device], tuple]
    bytes_moved: Callable[[tuple, torch.dtype], int]  # the fewest bytes a kernel must move
    flops: Callable[[tuple, torch.dtype], int]
    tolerance: dict[torch.dtype, float]  # max relative norm error vs float64
    shapes: dict[str, list[tuple]]  # default sweep per device type ("cuda", "cpu")
    describe: Callable[[tuple], str] = lambda shape: "x".join(map(str, shape))
    dtypes: tuple = (torch.bfloat16, torch.float16, torch.float32)
    bound: str = "memory"  # "memory": judged against copy bandwidth; "compute": against cuBLAS
    unfused: dict[str, Callable] = field(default_factory=dict)  # hand-written compositions
    peers: dict[str, Callable[[], Callable]] = field(default_factory=dict)  # name -> loader (may raise ImportError)
    peer_devices: tuple[str, ...] = ("cuda",)  # where the peers run (Liger's are Triton kernels for CUDA only)
    reference64: Callable | None = None  # float64 reference if `reference` cannot take float64 inputs
    compile_tk: bool = False  # also time torch.compile of `tk` (a model built from tk ops)
    kernel_modules: tuple[str, ...] = ()  # where the hand-written kernels live, if not in tk's own module


SPECS: dict[str, OpSpec] = {}


def register_spec(spec: OpSpec) -> OpSpec:
    if spec.name in SPECS:
        raise ValueError(f"op {spec.name!r} is registered twice")
    SPECS[spec.name] = spec
    return spec
