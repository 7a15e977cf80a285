"""Under torch.compile, PyTorch decides which arguments of each tk kernel the kernel writes, from the kernel's TTIR
(``wrap_triton``'s analysis), and writes those back into the graph's inputs.  An input it wrongly counts as
written costs a copy in every compiled graph, and fails the compile where the input is a view made inside a
custom Function: FSDP2 hands each unit its inputs through one, and two H100s met "Output 0 of AsStridedBackward0
is a view and is being modified inplace" (the norms' backward: its store's address came back from the helper that
had loaded x).  Here every launch a traced call of each op plans for an H100 is analysed as PyTorch analyses it:
none may write one of the op's inputs, and the analysis must not give up (it then counts every argument written).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import triton

import ops
from compare import launches

analysis = pytest.importorskip("torch._higher_order_ops.triton_kernel_wrap")
try:
    from triton.backends.compiler import GPUTarget
except ImportError:  # pragma: no cover
    pytest.skip("this Triton cannot compile for a GPU target", allow_module_level=True)

DTYPES = (torch.bfloat16, torch.float32)


@pytest.fixture(scope="module")
def hopper_driver():
    """PyTorch's analysis asks Triton's active driver for its target: an H100's, on any machine."""
    with pytest.MonkeyPatch.context() as patch:  # restored as it was after the module (None on a CPU machine)
        patch.setattr(triton.runtime.driver, "_active", SimpleNamespace(get_current_target=lambda: GPUTarget("cuda", 90, 32)))
        yield


def written(launch: launches.Launch, gave_up: list) -> set[str]:
    """The arguments PyTorch counts as written by the launch (its first config, if autotuned)."""
    kwargs = dict(launch.args)
    for name, value in launch.args.items():
        if isinstance(value, dict) and "tensor" in value:
            kwargs[name] = torch.empty(16, dtype=getattr(torch, value["tensor"]))
    config = launch.configs[0] if launch.configs else {}
    kwargs.update({k: v for k, v in config.items() if k not in launches.LAUNCH_OPTIONS})
    with pytest.MonkeyPatch.context() as patch:  # its warning when it gives up: "assuming every input is mutated"
        patch.setattr(analysis.log, "warning", lambda message, *args, **kw: gave_up.append(message))
        if hasattr(analysis, "identify_accessed_tensors"):  # torch 2.13
            accessed = analysis.identify_accessed_tensors(launch.jit, kwargs, {})
            return {dep.name for dep in accessed.read_writes.writes}
        return set(analysis.identify_mutated_tensors(launch.jit, kwargs, {}))  # torch 2.11


# Where torch on a machine without a GPU stops a planned call after its first launches (fake CUDA tensors): the
# backward under the no_grad planning takes on a CPU build (compare/launches.py), and GEMMs it cannot plan.
CPU_BUILD_STOPS = ("does not require grad", "not linked with support for cuda", "hasPrimaryContext")


def check_traced_launches(spec, shape: tuple, dtype: torch.dtype) -> None:
    """Every launch of a traced call of ``spec.tk`` on inputs of ``shape``: analysed, and writing none of them."""
    planned = launches.planned_launches(spec, shape, dtype, eager=False)
    assert planned.launches and planned.input_storages, (shape, dtype, planned.error)
    if planned.error is not None:  # the launches before the stop are analysed; no other stop is accepted
        assert not torch.cuda.is_available() and any(s in planned.error for s in CPU_BUILD_STOPS), planned.error
    for launch in planned.launches:
        gave_up: list = []
        inputs = {name for name in written(launch, gave_up) if launch.storages[name] in planned.input_storages}
        assert not gave_up, (launch.kernel, shape, dtype, gave_up)
        assert not inputs, f"{launch.kernel} at {shape} {dtype}: PyTorch counts {sorted(inputs)} as written"


@pytest.mark.parametrize("op", sorted(ops.SPECS))
def test_no_traced_launch_writes_an_input_of_its_op(hopper_driver, op):
    shapes = ops.SPECS[op].shapes["cuda"]
    for shape in {shapes[0], shapes[len(shapes) // 2], shapes[-1]}:
        for dtype in DTYPES:
            check_traced_launches(ops.SPECS[op], shape, dtype)


# Rows off 16-byte boundaries, planned for an H100, whose frames' addresses the harness's aligned shapes never
# reach: the forward's framed tile (1001 and 3001 columns); the backward's framed two sweeps (layer norm at 50257
# columns, w read from its shifted copies) and framed held rows (20001).
FRAMED_NORM_SHAPES = {
    "layer_norm": [(4096, 1001), (999, 3001)],
    "rms_norm": [(4096, 1001), (999, 3001)],
    "layer_norm_backward": [(64, 50257), (999, 20001)],
}


@pytest.mark.parametrize("op", sorted(FRAMED_NORM_SHAPES))
def test_no_traced_launch_of_a_framed_norm_writes_its_inputs(hopper_driver, op):
    for shape in FRAMED_NORM_SHAPES[op]:
        for dtype in DTYPES:
            check_traced_launches(ops.SPECS[op], shape, dtype)


def _three(shape, dtype, device):
    return tuple(torch.randn(shape, dtype=dtype, device=device) for _ in range(3))


def _loss_with_gradients(shape, dtype, device):
    rows, hidden, vocab = shape
    x, weight = torch.randn(rows, hidden, dtype=dtype, device=device), torch.randn(vocab, hidden, dtype=dtype, device=device)
    return x, weight, torch.randint(0, vocab, (rows,), device=device), None, -100, "mean", 0.0, True, True, False


# Ops a model's backward calls that the harness does not time on their own (no spec): the gated MLPs' backward,
# and the fused loss's forward asked for its gradients (it writes them in place of each chunk's logits; on a CPU
# build the fake-CUDA GEMM after its first launch stops the call, and that launch is the one analysed).
UNTIMED = {
    "swiglu_backward": (lambda *a: torch.ops.tk.swiglu_backward(*a), _three, (4095, 11008)),
    "geglu_backward": (lambda *a: torch.ops.tk.geglu_backward(*a), _three, (4095, 11008)),
    "linear_cross_entropy gradients": (lambda *a: torch.ops.tk.linear_cross_entropy_forward(*a), _loss_with_gradients,
                                       (4095, 2048, 50257)),
}  # fmt: skip


@pytest.mark.parametrize("op", sorted(UNTIMED))
def test_no_traced_launch_of_a_backward_writes_its_inputs(hopper_driver, op):
    call, make_inputs, shape = UNTIMED[op]
    for dtype in DTYPES:
        check_traced_launches(SimpleNamespace(tk=call, make_inputs=make_inputs), shape, dtype)
