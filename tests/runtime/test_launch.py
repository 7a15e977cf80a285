"""The fast launch path: its key must separate every argument Triton compiles differently."""

import contextvars
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
import triton
from reference import assert_close

from ops.runtime import device as _device, launch as _launch
from ops import gelu as gelu_module
from ops.matmul import kernels as matmul_module
from ops.runtime.launch import FastKernel, _hooks_in_use, direct_launch_plan, fast_kernel, specialization_key


def _state():
    """Why the fast path might be off, for a failure message."""
    from triton import knobs

    return (
        f"hooks in use: {_hooks_in_use()} ({knobs.runtime.launch_enter_hook!r}, "
        f"{getattr(knobs.runtime.launch_enter_hook, 'calls', None)}), "
        f"dispatch modes: {torch._C._len_torch_dispatch_stack()}, grad: {torch.is_grad_enabled()}"
    )


def test_the_key_separates_what_triton_specializes_on():
    base = torch.empty(64, dtype=torch.float32)
    same = [
        ((base, 64), {"BLOCK": 128}),
        ((torch.empty(64, dtype=torch.float32), 48), {"BLOCK": 128}),  # another aligned tensor, another multiple of 16
    ]
    assert specialization_key(*same[0]) == specialization_key(*same[1])
    different = [
        ((base, 64), {"BLOCK": 128}),
        ((base[1:], 64), {"BLOCK": 128}),  # a pointer no longer 16-byte aligned
        ((base.half(), 64), {"BLOCK": 128}),  # another dtype
        ((base, 65), {"BLOCK": 128}),  # not a multiple of 16
        ((base, 1), {"BLOCK": 128}),  # Triton turns 1 into a constant
        ((base, 2**31), {"BLOCK": 128}),  # needs 64-bit integers
        ((base, 64), {"BLOCK": 256}),  # another constexpr
        ((base, 64), {"BLOCK": 128, "num_warps": 8}),  # another launch option
    ]
    keys = [specialization_key(*case) for case in different]
    assert len(set(keys)) == len(keys)


def test_arguments_it_does_not_model_keep_tritons_path():
    assert specialization_key((torch.empty(4), 0.5), {}) == specialization_key((torch.empty(4), 2.0), {})
    assert specialization_key((torch.empty(4), None), {}) is None
    assert specialization_key((torch.empty(4), True), {}) is None


def _compiled(signature, constants, **meta):
    """What direct_launch_plan reads of a compiled kernel (Triton 3.6's layout: constants keyed by index tuples)."""
    metadata = {"num_warps": 4, "shared": 1024, "num_ctas": 1, "global_scratch_size": 0, "profile_scratch_size": 0}
    return SimpleNamespace(
        function=1234, src=SimpleNamespace(signature=signature, constants=constants), metadata=SimpleNamespace(**{**metadata, **meta})
    )


def test_direct_launch_plan_passes_the_runtime_arguments_with_their_c_types():
    signature = {"x_ptr": "*bf16", "y_ptr": "*fp32", "n": "i32", "stride": "i64", "eps": "fp32", "one": "i32", "BLOCK": "constexpr"}
    compiled = _compiled(signature, {(5,): 1, (6,): 128})  # `one` was 1, folded into the binary like BLOCK
    function, warps, shared, types, pick, scratch, overlapped, scratch_bytes = direct_launch_plan(compiled, len(signature))
    assert (function, warps, shared, overlapped, scratch_bytes) == (1234, 4, 1024, False, 0)
    assert types == "OOilfOO" and scratch == (None, None)  # two null scratch buffers close the list
    x, y = torch.empty(2), torch.empty(2)
    assert pick((x, y, 10, 20, 0.5, 1, 128)) == (x, y, 10, 20, 0.5)
    # One runtime argument, and none: still tuples.
    assert direct_launch_plan(_compiled({"x_ptr": "*fp16", "B": "constexpr"}, {(1,): 8}), 2)[4]((x, 8)) == (x,)
    assert direct_launch_plan(_compiled({"B": "constexpr"}, {(0,): 8}), 1)[4]((8,)) == ()


def _remembered_gelu_binary(monkeypatch, launches, **meta):
    """A FastKernel for the gelu kernel holding one remembered binary (a stand-in with gelu's signature
    and metadata `meta`), on a pretend current device 0, with PyTorch's C++ launcher replaced by ``launches``."""
    signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n_elements": "i32", "APPROXIMATE_TANH": "constexpr", "BLOCK_SIZE": "constexpr"}
    compiled = _compiled(signature, {(3,): True, (4,): 1024}, **meta)
    compiled.triton_runs = []
    compiled.run = lambda *launch: compiled.triton_runs.append(launch)
    compiled.packed_metadata = "packed"
    monkeypatch.setattr(_launch, "_current_device", lambda: 0)
    monkeypatch.setattr(_launch, "_launch_kernel", launches)
    fast = FastKernel(gelu_module.gelu_forward_kernel)
    fast.current_stream = lambda device: 77
    x, y = torch.empty(3000), torch.empty(3000)
    kwargs = {"APPROXIMATE_TANH": True, "BLOCK_SIZE": 1024, "num_warps": 4}
    key = (specialization_key((x, y, 3000), kwargs), 0)
    fast.binaries[key] = (compiled, (True, 1024), {}, direct_launch_plan(compiled, len(fast.params)))
    return fast, compiled, key, (x, y, 3000), kwargs


def test_a_remembered_binary_launches_through_the_cpp_launcher(monkeypatch):
    calls = []
    fast, compiled, key, args, kwargs = _remembered_gelu_binary(monkeypatch, lambda *launch: calls.append(launch))
    assert fast[(3, 1, 1)](*args, **kwargs) is compiled
    (function, x, y, z, warps, shared, types, passed, stream), = calls
    assert (function, (x, y, z), warps, shared, types, stream) == (1234, (3, 1, 1), 4, 1024, "OOiOO", 77)
    assert passed == (*args, None, None) and not compiled.triton_runs


def test_a_binary_that_needs_global_scratch_gets_a_fresh_buffer_sized_by_its_grid(monkeypatch):
    """Device-side tensor descriptors (the TMA matmul) are written to global scratch, bytes a program:
    the C++ launcher gets a buffer of programs x bytes, allocated for each launch as Triton's does."""
    calls, allocated = [], []
    fast, compiled, key, args, kwargs = _remembered_gelu_binary(
        monkeypatch, lambda *launch: calls.append(launch), global_scratch_size=128, global_scratch_align=128
    )
    assert fast.binaries[key][3][-1] == 128

    def scratch(nbytes, device):
        allocated.append((nbytes, device))
        return torch.empty(nbytes, dtype=torch.uint8)

    monkeypatch.setattr(_launch, "_global_scratch", scratch)
    fast[(3, 2, 1)](*args, **kwargs)
    fast[(5, 1, 1)](*args, **kwargs)
    assert allocated == [(6 * 128, 0), (5 * 128, 0)]
    assert [launch[7][3].numel() for launch in calls] == [6 * 128, 5 * 128]  # the buffer, then a null profile scratch
    assert all(launch[7][4] is None and launch[7][:3] == args for launch in calls) and not compiled.triton_runs


def test_a_programmatic_dependent_binary_launches_through_triton_and_is_recorded_as_one(monkeypatch):
    """PyTorch's launcher sets no launch attributes, so a binary built with launch_pdl goes through
    Triton's, which sets it; the native lane's recorder still gets the launch, marked overlapped."""
    calls, recorded = [], []
    fast, compiled, key, args, kwargs = _remembered_gelu_binary(monkeypatch, lambda *launch: calls.append(launch),
                                                                launch_pdl=True)  # fmt: skip
    assert fast.binaries[key][3][6] is True  # overlapped
    recorder = SimpleNamespace(launch=lambda *launch: recorded.append(launch))
    monkeypatch.setattr(_launch.recording, "current", recorder, raising=False)
    assert fast[(3,)](*args, **kwargs) is compiled
    assert not calls and compiled.triton_runs == [(3, 1, 1, 77, 1234, "packed", None, None, None, *args, True, 1024)]
    (_, function, grid, warps, shared, types, values, overlapped), = recorded
    assert (function, grid, types, values, overlapped) == (1234, (3, 1, 1), "OOiOO", (*args, None, None), True)


def test_an_error_of_tritons_launcher_on_a_programmatic_dependent_binary_is_raised_once(monkeypatch):
    """Triton's launcher failing on such a binary is its own error, raised as it is: the launch is not
    tried again and the binary keeps its plan (it is not a refusal of PyTorch's launcher)."""
    fast, compiled, key, args, kwargs = _remembered_gelu_binary(monkeypatch, lambda *launch: None, launch_pdl=True)

    def fail(*launch):
        compiled.triton_runs.append(launch)
        raise RuntimeError("CUDA driver error: out of resources")

    compiled.run = fail
    with pytest.raises(RuntimeError, match="out of resources"):
        fast[(3,)](*args, **kwargs)
    assert len(compiled.triton_runs) == 1 and fast.binaries[key][3] is not None


def test_a_binary_the_cpp_launcher_refuses_goes_back_to_tritons_launcher(monkeypatch):
    refused = []

    def refuse(*launch):
        refused.append(launch)
        raise RuntimeError("CUDA driver error: invalid argument")

    fast, compiled, key, args, kwargs = _remembered_gelu_binary(monkeypatch, refuse)
    for _ in range(2):
        fast[(3,)](*args, **kwargs)
    assert len(refused) == 1 and fast.binaries[key][3] is None  # the plan is dropped after the refusal
    run = (3, 1, 1, 77, 1234, "packed", None, None, None, *args, True, 1024)
    assert compiled.triton_runs == [run, run]


@pytest.mark.parametrize(
    "signature, meta",
    [
        ({"x_ptr": "*fp16"}, {"profile_scratch_size": 64}),  # instrumented binaries
        ({"x_ptr": "*fp16"}, {"global_scratch_size": 64, "global_scratch_align": 1024}),  # more than torch aligns to
        ({"x_ptr": "*fp16"}, {"global_scratch_size": 64, "launch_pdl": True}),  # Triton's launcher: scratch of its own
        ({"x_ptr": "*fp16"}, {"launch_cooperative_grid": True}),
        ({"x_ptr": "*fp16"}, {"num_ctas": 2}),
        ({"x_ptr": "*fp16"}, {"cluster_dims": (2, 1, 1)}),
        ({"desc": "nvTmaDesc"}, {}),  # an argument type the C++ launcher does not take
    ],
)
def test_direct_launch_plan_leaves_what_it_cannot_launch_to_triton(signature, meta):
    assert direct_launch_plan(_compiled(signature, {}, **meta), len(signature)) is None


def test_one_fast_kernel_per_kernel_for_jit_and_autotuned_kernels():
    assert isinstance(fast_kernel(gelu_module.gelu_forward_kernel), FastKernel)
    assert fast_kernel(gelu_module.gelu_forward_kernel) is fast_kernel(gelu_module.gelu_forward_kernel)
    assert isinstance(fast_kernel(matmul_module.matmul_kernel_autotuned), FastKernel)


@pytest.mark.gpu
def test_fast_launches_on_aligned_and_misaligned_views_match_float64():
    """After a launch on an aligned tensor, a view one element in (not 16-byte
    aligned) must get its own binary, not the aligned one."""
    fast = fast_kernel(gelu_module.gelu_forward_kernel)
    fast.binaries.clear()
    x = torch.randn(100_003, device="cuda", dtype=torch.float16)
    for view in (x, x, x[1:], x[1:], x[3:-5], x[:4096], x[:4096]):
        y = torch.ops.tk.gelu(view, "tanh")
        assert_close(y, F.gelu(view.double(), approximate="tanh"), torch.float16)
    assert len(fast.binaries) >= 3, _state()  # aligned and odd size, misaligned, 4096 elements
    if _launch._launch_kernel is not None:  # torch's C++ launcher: every binary launches through it, none refused
        assert all(found[3] is not None for found in fast.binaries.values())


@pytest.mark.gpu
def test_binaries_launch_through_torchs_cpp_launcher_where_it_can():
    """Integers folded into the binary (a single row), float arguments (eps), an autotuned kernel, the TMA
    matmul (which needs global scratch): each launched twice (the second time from the remembered binary)
    and checked."""
    if _launch._launch_kernel is None:
        pytest.skip("this torch has no C++ launcher for Triton binaries")
    x = torch.randn(1, 3000, device="cuda")
    w, b = torch.randn(3000, device="cuda"), torch.randn(3000, device="cuda")
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        assert_close(torch.ops.tk.softmax(x, -1), torch.softmax(x.double(), -1), torch.float32)
        expected = F.layer_norm(x.double(), (3000,), w.double(), b.double(), eps=0.25)
        assert_close(torch.ops.tk.layer_norm(x, [3000], w, b, 0.25), expected, torch.float32)
        assert_close(torch.ops.tk.matmul(a[:100, :300], a[:300, :50]), a[:100, :300].double() @ a[:300, :50].double(), torch.bfloat16)
        assert_close(torch.ops.tk.matmul(a, a), a.double() @ a.double(), torch.bfloat16)
    fast = [f for f in _launch._fast.values() if isinstance(f, FastKernel)]
    plans = [(f.params, found[3]) for f in fast for found in f.binaries.values()]
    assert sum(plan is not None for _, plan in plans) >= 3, plans  # softmax, layer_norm, the pointer matmul
    tma = _launch._fast[id(matmul_module.matmul_tma_kernel_autotuned)].binaries.values()
    assert tma, "the TMA matmul was not launched"
    assert all(found[3] is not None and found[3][-1] > 0 for found in tma), [found[0].metadata for found in tma]
    # Other grids and layouts through the same remembered binaries: the scratch follows the grid.
    for m, n, k in [(2048, 4096, 256), (4096, 2048, 512)]:
        p, q = torch.randn(m, k, device="cuda", dtype=torch.bfloat16), torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            assert_close(torch.ops.tk.matmul(p, q.t()), p.double() @ q.t().double(), torch.bfloat16)


@pytest.mark.gpu
def test_fast_launches_of_the_autotuned_matmul_follow_each_shape():
    fast = fast_kernel(matmul_module.matmul_kernel_autotuned)
    for m, n, k in [(256, 256, 256), (300, 200, 100), (256, 256, 256), (300, 200, 100), (17, 1000, 64)]:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        assert_close(torch.ops.tk.matmul(a, b), a.double() @ b.double(), torch.bfloat16)
    assert fast.binaries, _state()


def test_scratch_allocator_is_set_only_where_none_is():
    """The TMA matmul needs a Triton allocator: tk sets its own where the default
    (which refuses) is current, and leaves a caller's own alone."""

    def current():
        return _device._allocator.get()

    def with_default():
        assert isinstance(current(), _device.NullAllocator)
        _device.set_scratch_allocator()
        return current()

    def with_callers_own():
        def own(size, alignment, stream):
            raise AssertionError("not called here")

        triton.set_allocator(own)
        _device.set_scratch_allocator()
        return current() is own

    assert contextvars.Context().run(with_default) is _device._scratch
    assert contextvars.Context().run(with_callers_own)
