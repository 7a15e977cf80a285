"""Matrix multiplication C = A @ B, 2-D or batched 3-D, any strides.

Each program computes one BLOCK_M x BLOCK_N tile of C, walking K in
BLOCK_K steps and accumulating in float32 (float64 for float64 inputs).

Grouped ("swizzled") program order: programs are numbered so that GROUP_M
consecutive programs cover a column of tiles before moving right.  Programs
that run at the same time then share the same B tiles and a few A tiles in
L2, instead of each streaming its own row of A and a whole sweep of B.

Split K: when C has too few tiles to fill the GPU (a handful of rows, as in
decoding, or the small weight gradients of a training step, whose K is the
number of tokens), each tile's K loop is split over SPLIT_K programs, the
grid's third axis.  Each writes its partial sum, in float32, to a slice of a
workspace; a second kernel adds the slices in a fixed order and rounds once.
No atomics: the result is the same bits on every run.

Hopper and newer GPUs: 2-D float16 and bfloat16 problems big enough to fill
the GPU go to a second kernel, ``matmul_tma_kernel``: tiles are copied by the
TMA unit from tensor descriptors instead of pointer arithmetic, and a
persistent grid (one program per SM) walks the tiles, overlapping one tile's
store with the next one's loads.  Everything else, and older GPUs, take the
pointer kernel described first.

Precision: float16 and bfloat16 use the tensor cores with a float32
accumulator.  float32 follows PyTorch's switch: exact IEEE products unless
``torch.backends.cuda.matmul.allow_tf32`` is True, then TF32 (10-bit
mantissa products, much faster).  float64 runs on the CPU only (for
gradcheck): Triton's tl.dot has no float64 path on CUDA.
"""

import torch

from ..blocks.elementwise import elementwise_config, elementwise_grid
from ..blocks.sizes import cdiv
from ..runtime import (
    GRAD,
    LOWER_PRECISION,
    check_same,
    check_tensor,
    follow_autocast,
    is_fake,
    kind,
    launcher,
    needs_grad,
    on_cuda,
    register_formula,
    register_op,
    set_scratch_allocator,
    sm_count,
    tma_available,
)
from .kernels import (
    matmul_kernel,
    matmul_kernel_autotuned,
    matmul_tma_kernel,
    matmul_tma_kernel_autotuned,
    split_k_sum_kernel,
)

# The interpreter runs one Python loop iteration per program: few, large tiles.
# Its tl.dot multiplies bfloat16 operands as raw 16-bit integers, so they are
# upcast first; a product of two half-precision numbers is exact in float32,
# so the result is the same as the tensor cores' (float32 accumulation).
_CPU_BLOCKS = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}

# Split K (see the module docstring): when C has at most half as many tiles
# as the GPU has SMs, counted with the tile the autotuner picks for small
# problems, K is split so that tiles * SPLIT_K about fills them once, into
# slices of at least _MIN_SPLIT_K: a shorter slice would spend more on its
# partial sums' traffic than it saves.  At most _MAX_SPLIT slices.  The
# interpreter gets the same rule scaled down (its tile, a few "SMs"), so that
# CPU tests split small problems too.
_SPLIT_TILE = {"cuda": (64, 128), "cpu": (_CPU_BLOCKS["BLOCK_M"], _CPU_BLOCKS["BLOCK_N"])}
_MIN_SPLIT_K = {"cuda": 512, "cpu": _CPU_BLOCKS["BLOCK_K"]}
_CPU_PROGRAMS = 8
_MAX_SPLIT = 16


def _batched_view(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch stride, row stride, column stride); batch stride 0 for a 2-D operand."""
    if t.dim() == 2:
        return 0, t.stride(0), t.stride(1)
    return t.stride(0), t.stride(1), t.stride(2)


def _check_shapes(a: torch.Tensor, b: torch.Tensor) -> int:
    """The batch size; a clear error when the shapes do not multiply."""
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"tk.matmul: a has shape {tuple(a.shape)} and b has shape {tuple(b.shape)}: "
            f"inner dimensions {a.shape[-1]} and {b.shape[-2]} differ"
        )
    batch_a = a.shape[0] if a.dim() == 3 else None
    batch_b = b.shape[0] if b.dim() == 3 else None
    if batch_a is not None and batch_b is not None and batch_a != batch_b:
        raise ValueError(f"tk.matmul: batch sizes differ: a has {batch_a}, b has {batch_b}")
    if batch_a is not None:  # not `batch_a or batch_b`: a batch of 0 matrices is 0, not 1
        return batch_a
    return 1 if batch_b is None else batch_b


def _programs_at_once(device: torch.device) -> int:
    """Programs that fill the device once: its SMs, or the interpreter's few pretend ones."""
    return sm_count(device.index) if kind(device) == "cuda" else _CPU_PROGRAMS


def _split_k(M: int, N: int, K: int, batch: int, device: torch.device) -> int:
    """How many slices K is split into: 1 (no split) unless C is too small to fill the GPU."""
    where = kind(device)
    tile_m, tile_n = _SPLIT_TILE[where]
    tiles = cdiv(M, tile_m) * cdiv(N, tile_n) * batch
    sms = _programs_at_once(device)
    if tiles * 2 > sms:  # at least half the SMs busy already
        return 1
    return max(1, min(sms // tiles, K // _MIN_SPLIT_K[where], _MAX_SPLIT))


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    check_tensor("matmul", "a", a, ndims=(2, 3))
    check_tensor("matmul", "b", b, ndims=(2, 3))
    check_same("matmul", {"a": a, "b": b})
    batch = _check_shapes(a, b)
    if a.dtype == torch.float64 and on_cuda(a):
        raise TypeError("tk.matmul: float64 is supported on CPU tensors only (Triton's tl.dot has no float64 path on CUDA)")
    if on_cuda(a) and batch > 65535:  # the batch is the grid's second axis, at most 65535 programs on CUDA
        raise ValueError(f"tk.matmul: a batch of {batch} matrices is more than a CUDA grid holds (65535); split the batch")
    M, K = a.shape[-2:]
    N = b.shape[-1]
    batched = a.dim() == 3 or b.dim() == 3
    c = torch.empty((batch, M, N) if batched else (M, N), dtype=a.dtype, device=a.device)
    if c.numel() == 0:
        return c
    split = _split_k(M, N, K, batch, a.device)
    layouts = _tma_layouts(a, b, M, N, split)
    if layouts is not None:
        _launch_tma(a, b, c, *layouts)
        return c
    if split == 1:
        out, slice_stride = c, 0
    else:  # the tiles go to slices of a workspace in the accumulator's dtype, summed into c below
        accumulator = torch.float64 if a.dtype == torch.float64 else torch.float32
        out = torch.empty((split, *c.shape), dtype=accumulator, device=a.device)
        slice_stride = c.numel()
    # c is new and contiguous, so each workspace slice has c's strides.
    strides = (*_batched_view(a), *_batched_view(b), *_batched_view(c), slice_stride, split)
    allow_tf32 = a.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    if on_cuda(a):

        def grid(meta):
            return (cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"]), batch, split)

        launcher(matmul_kernel_autotuned, a)[grid](
            a, b, out, M, N, K, *strides, ALLOW_TF32=allow_tf32, UPCAST_OPERANDS=False
        )
    else:
        blocks = _CPU_BLOCKS
        grid = (cdiv(M, blocks["BLOCK_M"]) * cdiv(N, blocks["BLOCK_N"]), batch, split)
        upcast = a.dtype == torch.bfloat16
        launcher(matmul_kernel, a)[grid](
            a, b, out, M, N, K, *strides, ALLOW_TF32=allow_tf32, UPCAST_OPERANDS=upcast, **blocks
        )
    if split > 1:
        _sum_slices(out, c, split)
    return c


# --------------------------------------------------------------------------
# When the TMA kernel runs, and its launch.
# --------------------------------------------------------------------------

# The TMA kernel takes a problem with at least as many 128x128 tiles as the GPU
# has SMs (2048 x 2048 on an H100); below that its persistent grid's large
# tiles leave SMs idle, and the pointer kernel's smaller ones do better.  The
# interpreter's rule is scaled down like split K's, for the CPU tests.
_TMA_MIN_TILE = {"cuda": 128, "cpu": _CPU_BLOCKS["BLOCK_M"]}
_TMA_BYTES_ALIGNED = 16  # base address and every stride but the unit one


def _tma_layout(t: torch.Tensor) -> tuple[bool, int] | None:
    """(column-major?, leading stride) when a TMA descriptor can describe the 2-D matrix t, else None."""
    size = t.element_size()
    if (t.storage_offset() * size) % _TMA_BYTES_ALIGNED:
        return None
    if t.device.type == "cuda" and not is_fake(t) and t.data_ptr() % _TMA_BYTES_ALIGNED:
        return None  # storage from outside PyTorch's allocator (from_blob, DLPack) need not be aligned
    for column_major, unit, leading in ((False, 1, 0), (True, 0, 1)):
        # Rows (columns, if column-major) apart, not overlapping, 16-byte aligned.
        apart = t.stride(leading) >= t.shape[unit] and (t.stride(leading) * size) % _TMA_BYTES_ALIGNED == 0
        if t.stride(unit) == 1 and apart:
            return column_major, t.stride(leading)
    return None


def _tma_layouts(a: torch.Tensor, b: torch.Tensor, M: int, N: int, split: int):
    """The layouts of a and b for the TMA kernel, or None where it does not apply:
    pre-Hopper GPUs, batches, split K, 32- and 64-bit operands, small problems."""
    if split > 1 or a.dim() != 2 or b.dim() != 2 or a.dtype not in (torch.float16, torch.bfloat16):
        return None
    if not tma_available(a.device) or (N * a.element_size()) % _TMA_BYTES_ALIGNED:  # N: C's row stride
        return None
    tile = _TMA_MIN_TILE[kind(a.device)]
    if cdiv(M, tile) * cdiv(N, tile) < _programs_at_once(a.device):
        return None
    layout_a, layout_b = _tma_layout(a), _tma_layout(b)
    return None if layout_a is None or layout_b is None else (layout_a, layout_b)


def _launch_tma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, layout_a, layout_b) -> None:
    (a_column_major, stride_a), (b_column_major, stride_b) = layout_a, layout_b
    M, K = a.shape
    N = b.shape[1]
    args = (a, b, c, M, N, K, stride_a, stride_b, c.stride(0))
    flags = {"A_COLUMN_MAJOR": a_column_major, "B_COLUMN_MAJOR": b_column_major}
    programs = _programs_at_once(a.device)

    def grid(meta):  # the persistent grid: one program per SM, or fewer when there are fewer tiles
        return (min(programs, cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"])),)

    if on_cuda(a):
        set_scratch_allocator()
        launcher(matmul_tma_kernel_autotuned, a)[grid](*args, **flags, UPCAST_OPERANDS=False)
    else:
        launcher(matmul_tma_kernel, a)[grid(_CPU_BLOCKS)](
            *args, **flags, UPCAST_OPERANDS=a.dtype == torch.bfloat16, STORE_HALVES=True, WARP_SPECIALIZE=False,
            **_CPU_BLOCKS,
        )  # fmt: skip


def _sum_slices(partial: torch.Tensor, c: torch.Tensor, split: int) -> None:
    """c (contiguous) = the sum of partial's split slices."""
    n = c.numel()
    block, warps = elementwise_config(n, c.device)
    launcher(split_k_sum_kernel, c)[elementwise_grid(n, block)](
        partial, c, n, SPLIT_K=split, BLOCK_SIZE=block, num_warps=warps
    )


matmul = register_op("matmul", _matmul)
# Under autocast, as torch.matmul on either device: operands in the autocast dtype.
follow_autocast("matmul", {"cuda": LOWER_PRECISION, "cpu": LOWER_PRECISION})


def _matmul_backward(
    grad: torch.Tensor, a: torch.Tensor, b: torch.Tensor, a_grad: bool, b_grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dA, dB) = (dC @ B^T, A^T @ dC), summed over the batch where an operand was shared
    by every batch.  dA (dB) is an empty tensor unless a_grad (b_grad): an op cannot
    return None.  Both products are this module's matmul body, on transposed views."""
    for name, t in (("grad", grad), ("a", a), ("b", b)):
        check_tensor("matmul_backward", name, t, ndims=(2, 3))
    check_same("matmul_backward", {"grad": grad, "a": a, "b": b})
    batch = _check_shapes(a, b)
    batched = a.dim() == 3 or b.dim() == 3
    expected = (batch, a.shape[-2], b.shape[-1]) if batched else (a.shape[-2], b.shape[-1])
    if tuple(grad.shape) != expected:
        raise ValueError(f"tk.matmul_backward: grad has shape {tuple(grad.shape)}, the product's is {expected}")
    grad_a, grad_b = grad.new_empty(0), grad.new_empty(0)
    if a_grad:
        if a.dim() == 2 and b.dim() == 3:  # a was shared by every batch: sum over it
            grad_a = _matmul(grad.transpose(0, 1).reshape(grad.shape[1], -1), b.transpose(1, 2).reshape(-1, b.shape[1]))
        else:
            grad_a = _matmul(grad, b.transpose(-1, -2))
    if b_grad:
        if b.dim() == 2 and a.dim() == 3:  # b was shared by every batch
            grad_b = _matmul(a.reshape(-1, a.shape[-1]).t(), grad.reshape(-1, grad.shape[-1]))
        else:
            grad_b = _matmul(a.transpose(-1, -2), grad)
    return grad_a, grad_b


matmul_backward = register_op("matmul_backward", _matmul_backward)
register_formula(
    matmul,
    backward=matmul_backward,
    arguments=(GRAD, "a", "b", needs_grad("a"), needs_grad("b")),
    gradients={"a": 0, "b": 1},
)
