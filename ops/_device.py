"""What the launch rules need to know about a device, asked once per device.

Rules pick constants by kind: "cuda" for the GPU, "cpu" for everything else
(Triton's interpreter on CPU tensors; also meta and fake tensors, which
never launch but go through the same rules while being traced).
"""

import functools

import torch
import triton
import triton.language as tl

try:  # where Triton keeps the current allocator (3.4 to 3.9 at least); private, so looked up with care
    from triton.runtime._allocation import NullAllocator, _allocator
except ImportError:  # pragma: no cover
    NullAllocator = _allocator = None

from ._launch import cdiv


def kind(device: torch.device) -> str:
    """Which constants apply: "cuda", or "cpu" (the interpreter; also meta and fake CPU tensors)."""
    return "cuda" if device.type == "cuda" else "cpu"


@functools.cache
def sm_count(index: int | None) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


_REGISTER_UNIT = 256  # registers a warp is given at a time
_WARPS_PER_PLACEMENT = 4  # warps placed on an SM's schedulers at a time, one each


@functools.cache
def resident_programs_per_sm(index: int | None, num_warps: int, registers: int, shared: int = 0) -> int:
    """How many programs of num_warps warps, each thread capped at `registers`, one SM runs at once.

    The limits that bind for register-heavy kernels: the register file (64K
    32-bit registers on every NVIDIA GPU since Maxwell, where torch does not
    report it) and the threads an SM holds; for a program using `shared`
    bytes of shared memory, also the SM's shared memory, of which the driver
    reserves 1 KiB per program.

    The register file is split over the SM's four schedulers, and warps are
    placed on them in fours: a warp takes its registers in units of 256, and
    the warps that fit round down to a multiple of 4.  At 144 registers a
    thread 65536 // 4608 = 14 warps, but 12 run: a plan of 14 one-warp
    programs an SM left rows whose programs never all ran at once (the layer
    norm probe of docs/perf-notes.md, version 38)."""
    props = torch.cuda.get_device_properties(index)
    register_file = getattr(props, "regs_per_multiprocessor", 65536)
    threads = 32 * num_warps
    warp_registers = cdiv(registers * 32, _REGISTER_UNIT) * _REGISTER_UNIT
    warps = register_file // warp_registers // _WARPS_PER_PLACEMENT * _WARPS_PER_PLACEMENT
    fits = min(warps // num_warps, props.max_threads_per_multi_processor // threads)
    if shared:
        fits = min(fits, props.shared_memory_per_multiprocessor // (shared + 1024))
    return fits


@functools.cache
def cuda_capability(index: int | None) -> tuple[int, int]:
    """(major, minor) of a CUDA device, asked once: launchers read it on every call."""
    return torch.cuda.get_device_capability(index)


@functools.cache
def tma_available(device: torch.device) -> bool:
    """Whether kernels may use TMA tensor descriptors on ``device``: a Hopper or newer GPU, and a Triton that has them."""
    if device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9 and hasattr(tl, "make_tensor_descriptor")


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def set_scratch_allocator() -> None:
    """Give Triton an allocator for the global scratch memory some kernels need, unless one is set.

    A tensor descriptor built inside a kernel (``tl.make_tensor_descriptor``)
    is written to a small global buffer per program, which Triton's launcher
    asks an allocator for at each launch.  Triton's default allocator refuses;
    Inductor sets its own before launching compiled code, and a caller's own
    allocator is left alone.  The setting is per thread (a context variable).
    """
    if _allocator is None or isinstance(_allocator.get(), NullAllocator):
        triton.set_allocator(_scratch)
