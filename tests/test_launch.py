"""The fast launch path: its key must separate every argument Triton compiles differently."""

import contextvars

import pytest
import torch
import torch.nn.functional as F
import triton
from reference import assert_close

from ops import _device
from ops import gelu as gelu_module
from ops import matmul as matmul_module
from ops._launch import FastKernel, _hooks_in_use, fast_kernel, specialization_key


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
