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
from collections.abc import Callable
from typing import Any

import torch
from torch.library import triton_op

try:  # the autograd kernel custom_op registers; the eager shortcut falls back to it
    from torch._library.autograd import make_autograd_impl
except ImportError:  # pragma: no cover - a torch without it keeps the plain triton_op path
    make_autograd_impl = None

from . import native
from .direct import run_direct
from .formula import keep_formulas_in_step
from .library import LIBRARY, NAMESPACE, NATIVE_CUDA


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
    keep_formulas_in_step(name, op)
    return op




_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)



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
            return run_direct(body, args, kwargs)
        if route is _GRAD and not kwargs and direct_autograd.ready():
            return direct_autograd(args)
        return autograd_kernel(keyset, *args, **kwargs)

    def eager_backend(*args, **kwargs):
        return run_direct(body, args, kwargs)

    if NATIVE_CUDA:  # C++ in front of both, replaying calls it has seen (see _native.py)
        native.register(NAMESPACE, name, body, eager_autograd, eager_backend, "cuda")
    devices = ("CPU",) if NATIVE_CUDA else ("CUDA", "CPU")
    for device in devices:
        LIBRARY.impl(name, eager_autograd, f"Autograd{device}", with_keyset=True)
        LIBRARY.impl(name, eager_backend, device)



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
            if NATIVE_CUDA and _first_device_type(inputs) == "cuda":
                output = op(*inputs)  # grad is off in here: the native lane can replay it
            else:
                output = run_direct(body, inputs, {})
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


def is_traced(args) -> bool:
    """True if anything but eager PyTorch sees these arguments: torch.compile's tracing, a dispatch
    mode, a torch.func transform, or a tensor subclass (fake, functional, DTensor).  Code that may
    reuse a buffer in place asks this first: a trace keeps the reuse to itself."""
    return _eager_route(args) is _TRACED


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

