"""What the launch rules need to know about a device, asked once per device.

Rules pick constants by kind: "cuda" for the GPU, "cpu" for everything else
(Triton's interpreter on CPU tensors; also meta and fake tensors, which
never launch but go through the same rules while being traced).
"""

import functools
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch
import triton
import triton.language as tl

try:  # where Triton keeps the current allocator (3.4 to 3.9 at least); private, so looked up with care
    from triton.runtime._allocation import NullAllocator, _allocator
except ImportError:  # pragma: no cover
    NullAllocator = _allocator = None


def kind(device: torch.device) -> str:
    """Which constants apply: "cuda", or "cpu" (the interpreter; also meta and fake CPU tensors)."""
    return "cuda" if device.type == "cuda" else "cpu"


T = TypeVar("T")

_REGISTER_UNIT = 256  # registers a warp is given at a time
_WARPS_PER_PLACEMENT = 4  # warps placed on an SM's schedulers at a time, one each


@dataclass(frozen=True)
class DeviceFacts:
    """What a plan may know about the device it launches on: the one input of a plan besides the tensors.

    A plan reads the device only through this, so a test can plan for an H100
    (``H100``) on a machine without a GPU, and the same facts give the same plan.
    ``kind`` is "cuda" for a GPU and "cpu" for Triton's interpreter (also meta
    and fake CPU tensors, which never launch); the interpreter's other fields
    stay 0."""

    kind: str
    sm_count: int = 0
    capability: tuple[int, int] = (0, 0)
    registers_per_sm: int = 65536  # 32-bit registers: 64K on every NVIDIA GPU since Maxwell
    threads_per_sm: int = 2048
    shared_per_sm: int = 0  # bytes
    # Peak DRAM bandwidth in GB/s, from the driver's memory clock and bus width (0: not known).  The elementwise
    # rule keeps more bytes in flight on faster memory (ops/blocks/elementwise.py, loaded_bytes_a_thread).
    memory_gbps: int = 0

    @property
    def cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def hopper(self) -> bool:
        """sm_90 or newer: TMA descriptors, programmatic dependent launch, Gluon's kernels here."""
        return self.cuda and self.capability[0] >= 9

    def resident_programs_per_sm(self, num_warps: int, registers: int, shared: int = 0) -> int:
        """How many programs of num_warps warps, each thread capped at `registers`, one SM runs at once.

        The limits that bind for register-heavy kernels: the register file and
        the threads an SM holds; for a program using `shared` bytes of shared
        memory, also the SM's shared memory, of which the driver reserves 1 KiB
        per program.

        The register file is split over the SM's four schedulers, and warps are
        placed on them in fours: a warp takes its registers in units of 256, and
        the warps that fit round down to a multiple of 4.  At 144 registers a
        thread 65536 // 4608 = 14 warps, but 12 run: a plan of 14 one-warp
        programs an SM left rows whose programs never all ran at once (the layer
        norm probe of docs/perf-notes.md, version 38)."""
        threads = 32 * num_warps
        warp_registers = -(-registers * 32 // _REGISTER_UNIT) * _REGISTER_UNIT
        warps = self.registers_per_sm // warp_registers // _WARPS_PER_PLACEMENT * _WARPS_PER_PLACEMENT
        fits = min(warps // num_warps, self.threads_per_sm // threads)
        if shared:
            fits = min(fits, self.shared_per_sm // (shared + 1024))
        return fits

    def programs_at_once(self, num_warps: int, registers: int, programs_per_sm: int, shared: int = 0) -> int:
        """A persistent grid: `programs_per_sm` programs an SM, or as many as fit, on every SM."""
        return min(programs_per_sm, self.resident_programs_per_sm(num_warps, registers, shared)) * self.sm_count


@dataclass(frozen=True)
class ByKind(Generic[T]):
    """A plan constant with one value for the GPU and one for Triton's interpreter (DeviceFacts.kind).

    The interpreter has no registers, only a Python cost per program and per step: its values keep
    the programs few and the blocks large."""

    cuda: T
    cpu: T

    def on(self, facts: DeviceFacts) -> T:
        return self.cuda if facts.cuda else self.cpu

    def __getitem__(self, kind: str) -> T:
        return self.cuda if kind == "cuda" else self.cpu


INTERPRETER = DeviceFacts("cpu")

# The H100 (SXM, 80 GB) the plans were measured on, as torch reports it: tests plan for it on any machine.
H100 = DeviceFacts("cuda", sm_count=132, capability=(9, 0), shared_per_sm=233472, memory_gbps=3352)
# The H200 (141 GB, HBM3e), the same SMs on faster memory.
H200 = DeviceFacts("cuda", sm_count=132, capability=(9, 0), shared_per_sm=233472, memory_gbps=4814)


def device_facts(device: torch.device) -> DeviceFacts:
    """The facts of `device` (asked once per CUDA device; the interpreter's for anything else)."""
    if device.type != "cuda":
        return INTERPRETER
    return _cuda_facts(device.index)


@functools.cache
def _cuda_facts(index: int | None) -> DeviceFacts:
    if not torch.cuda.is_available():  # fake CUDA tensors, traced (export, compile) on a host without a GPU
        return H100
    props = torch.cuda.get_device_properties(index)
    return DeviceFacts(
        "cuda",
        sm_count=props.multi_processor_count,
        capability=(props.major, props.minor),
        registers_per_sm=getattr(props, "regs_per_multiprocessor", 65536),  # where torch does not report it
        threads_per_sm=props.max_threads_per_multi_processor,
        shared_per_sm=props.shared_memory_per_multiprocessor,
        memory_gbps=_memory_gbps(index),
    )


def _memory_gbps(index: int | None) -> int:
    """Peak DRAM bandwidth (GB/s) as Triton's driver reports the memory (``triton.testing.get_dram_gbps``: clock x
    bus width x 2 transfers a clock); 0 where a driver does not say."""
    try:
        import triton.testing

        return int(triton.testing.get_dram_gbps(index))  # (None: the current device)
    except Exception:  # a driver without the properties: the rule's base case
        return 0


@functools.cache
def sm_count(index: int | None) -> int:
    return _cuda_facts(index).sm_count


def resident_programs_per_sm(index: int | None, num_warps: int, registers: int, shared: int = 0) -> int:
    """``DeviceFacts.resident_programs_per_sm`` of CUDA device `index`."""
    return _cuda_facts(index).resident_programs_per_sm(num_warps, registers, shared)


@functools.cache
def cuda_capability(index: int | None) -> tuple[int, int]:
    """(major, minor) of a CUDA device, asked once: launchers read it on every call."""
    return _cuda_facts(index).capability


@functools.cache
def tma_available(device: torch.device) -> bool:
    """Whether kernels may use TMA tensor descriptors on ``device``: a Hopper or newer GPU, and a Triton that has them."""
    return device_facts(device).hopper and hasattr(tl, "make_tensor_descriptor")


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
