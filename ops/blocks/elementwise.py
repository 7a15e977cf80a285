"""The elementwise launch rule every flat kernel shares: block size, warps, grid, element order.

The guided tour (ops/tour/copy.py) explains each piece as it is first used;
gelu, swiglu, matmul's split-K sum and the tour's kernels all launch by it.
"""

import functools
import math

import torch
import triton
import triton.language as tl

from ..runtime import DeviceFacts, device_facts, is_dense
from .sizes import cdiv, next_power_of_2


def elements_per_thread(t: torch.Tensor, inputs: int = 1) -> int:
    """Elements a thread for a kernel that reads `inputs` tensors like t on t's device (``per_thread_for``)."""
    return per_thread_for(device_facts(t.device), t.element_size(), inputs)


@functools.lru_cache(maxsize=256)  # on every eager Python-path call: a lookup, not a logarithm
def per_thread_for(facts: DeviceFacts, element_size: int, inputs: int) -> int:
    """Elements a thread for a kernel that reads `inputs` tensors of `element_size` bytes, every SM full.

    A thread loads ``loaded_bytes_a_thread`` bytes in all, shared out among
    the inputs (each share a power of two, at least 8 bytes: a 4-byte load of
    two bf16 values cost 10 points of copy, perf notes version 35).  A
    one-input kernel takes at least 8 elements: float32 at 4 and at 8 ran
    level on an H100 (version 35b) and on an H200 (version 60), and 8 is what
    the sweep was measured with.  On an H100 (16 bytes): 8 elements of one
    16-bit input, 4 of each of two or three, 2 of each float32 input of two or
    three.  On an H200 (32 bytes): 16, 8, 4; float32 8, 4, 2.  (A one-byte
    input, tk.copy of uint8, takes 16 on an H100: 16-byte loads; it took 8
    before version 60, unmeasured either way.)"""
    share = max(_MIN_LOAD_BYTES, _power_of_2_at_most(loaded_bytes_a_thread(facts) // inputs))
    elements = max(share // element_size, 1)
    return max(elements, 8) if inputs == 1 else elements


# The bytes the rule was measured to want at the H100's bandwidth (3.35 TB/s peak): 16 a thread, all inputs
# together (perf notes, versions 35 and 35b).
_BASE_LOADED_BYTES, _BASE_GBPS = 16, 3352
_MIN_LOAD_BYTES = 8
_MAX_DOUBLINGS = 1  # 32 bytes: the H200's, the largest count measured


def loaded_bytes_a_thread(facts: DeviceFacts) -> int:
    """Bytes a thread loads, all inputs together, for the memory to stay busy with every SM full.

    Little's law: the bytes in flight an SM needs grow with the bandwidth
    (the SMs, their threads and the latency stay).  16 bytes at the H100's
    3.35 TB/s, doubled for each doubling of the device's peak bandwidth,
    rounded to the nearest power of two: 32 on an H200 (4.8 TB/s), where
    bf16 kernels ran 3-8 points of copy faster for it (two inputs: swiglu
    99.0 -> 102.2%, the tanh GELU backward 93.7 -> 101.7%; one input: the tanh
    GELU 94.2 -> 97.1%; perf notes, version 60) and three inputs kept 8 bytes
    of each (103.0% against 102.5% at 16).  At most 32 bytes, the most
    measured (a faster memory than the H200's gets the H200's count).  A
    device that reports no bandwidth, and the interpreter, take the base."""
    if not facts.cuda or facts.memory_gbps <= 0:
        return _BASE_LOADED_BYTES
    doublings = min(max(round(math.log2(facts.memory_gbps / _BASE_GBPS)), 0), _MAX_DOUBLINGS)
    return _BASE_LOADED_BYTES << doublings


def _power_of_2_at_most(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def elementwise_config(n: int, device: torch.device, per_thread: int = 8) -> tuple[int, int]:
    """(BLOCK_SIZE, num_warps) for a kernel over n elements.

    GPU: programs of 8 warps (256 threads), each thread taking ``per_thread``
    elements, or fewer where that would leave fewer than _MIN_PROGRAMS
    programs: one element a thread below 2**18 elements, two below 2**19,
    four below 2**20, and so on: ``per_thread`` once it leaves 512 programs
    (8 from 2**20, 16 from 2**21; earlier when it asks for fewer).

    * Large tensors: the count a kernel asks for is ``per_thread_for``'s,
      the bytes a thread must keep in flight for the device's memory with
      every SM full, shared out among its inputs; past that, shorter
      programs measured faster.  ``per_thread`` defaults to the H100's
      one-input count.
    * Small tensors are bound by latency, not bandwidth: what counts is how
      many SMs share the work and how much math each thread does in a row.
      Blocks of 1024 on 4 warps (the rule before version 36) left a float32
      erf GELU backward of 2**16 elements on 64 programs at 0.8x the speed of
      Inductor's kernel; one element a thread on 256 programs runs at 1.0-1.3x
      (CUDA-graph time on an H100; perf notes, version 36).

    Every block is a power of two, as tl.arange requires.

    CPU (Triton's interpreter): every program costs Python time, so one
    program takes as much as it can: the whole tensor up to 2**16 elements.
    """
    if per_thread < 1 or per_thread & (per_thread - 1):
        raise ValueError(f"elementwise_config: per_thread must be a power of two, got {per_thread}")
    if device.type != "cuda":
        return min(next_power_of_2(max(n, 1)), 1 << 16), 1
    # Doubled while the programs stay _MIN_PROGRAMS or more.  Comparisons only: under
    # torch.compile with dynamic shapes n is symbolic, and each one guards a threshold,
    # where arithmetic on n would pin the compiled graph to a narrow range of sizes.
    taken = 1
    while taken < per_thread and n >= 2 * taken * _THREADS * _MIN_PROGRAMS:
        taken *= 2
    return _THREADS * taken, _THREADS // 32


_THREADS = 256  # a program's threads (8 warps) on a GPU
_MIN_PROGRAMS = 512  # about 4 an SM on an H100


def elementwise_grid(n: int, block: int) -> tuple[int]:
    """One program per block, the last one partial: ceil(n / block) programs."""
    return (cdiv(n, block),)


def walk_in_one_order(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors, ready to be read as flat arrays in the same element order.

    An elementwise kernel pairs the i-th value in memory of each tensor, so
    the tensors must lay their elements out alike.  A dense tensor (its
    elements fill one span of memory: contiguous, transposed, channels-last,
    ...) is one flat array; tensors of equal strides list the same elements
    in the same order.  Anything else (a slice with gaps, a broadcast view,
    tensors of different layouts) is copied once to the standard layout.
    """
    first = tensors[0]
    if is_dense(first) and all(t.stride() == first.stride() for t in tensors[1:]):
        return tensors
    return tuple(t.contiguous() for t in tensors)



@triton.jit
def to_compute_dtype(x):
    """float64 stays float64; float32, float16 and bfloat16 compute in float32.

    The test is on the dtype, known at compile time, so each compiled kernel
    keeps only one branch.  float16 has 10 bits of mantissa and bfloat16 7:
    sums and products done at that precision lose far more than one rounding.
    """
    if x.dtype != tl.float64:
        x = x.to(tl.float32)
    return x


# --------------------------------------------------------------------------
# Whole blocks apart from the tail.  Triton tells the compiler that an integer
# argument is a multiple of 16 only when it is; the mask `offsets < n` of any
# other n changes from element to element as far as the compiler can tell, so
# every access of the kernel is one element wide (2 bytes for bfloat16: 41% of
# copy bandwidth at n = 10^8 + 7 on an H100, where n = 2^26 ran at 98%).  A
# program whose block lies wholly inside the tensor masks with n rounded down
# to whole blocks instead, a multiple of BLOCK the compiler can see: its loads
# and stores are 16 bytes wide.  Only the last program, cut by the end of the
# tensor, masks with n itself.  A kernel calls its body twice, once per branch:
#
#     offsets = block_offsets(BLOCK_SIZE)
#     if in_whole_block(n, BLOCK_SIZE):
#         body(..., offsets, offsets < whole_blocks_end(n, BLOCK_SIZE))
#     else:
#         body(..., offsets, offsets < n)
# --------------------------------------------------------------------------


@triton.jit
def block_offsets(BLOCK_SIZE: tl.constexpr):
    """This program's int64 offsets (int64 before the multiply: pid * BLOCK_SIZE passes 2**31 on
    tensors of 2**31 elements or more)."""
    return tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)


@triton.jit
def whole_blocks_end(n, BLOCK_SIZE: tl.constexpr):
    """n rounded down to whole blocks: the same number for every program, and a visible multiple of BLOCK_SIZE."""
    return n // BLOCK_SIZE * BLOCK_SIZE


@triton.jit
def in_whole_block(n, BLOCK_SIZE: tl.constexpr):
    """Whether this program's block lies wholly inside the n elements."""
    return tl.program_id(0).to(tl.int64) * BLOCK_SIZE < whole_blocks_end(n, BLOCK_SIZE)
