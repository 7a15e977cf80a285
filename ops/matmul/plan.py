"""Which kernel takes a matmul, with which tile, split and layouts: ``choose_plan(meta) -> Plan``.

A call is first described (``describe``: shapes, strides, alignment, the
device's facts: a ``Meta``), then planned (``choose_plan``: a pure function of
the Meta and a ``Tuning``), then run (launch.py).  The designs, in the order
the plan tries them:

* EMPTY: C has no elements; nothing is launched.
* Split K (the pointer kernel with SPLIT_K > 1, then the slice sum): C has at
  most half as many tiles as the GPU has SMs.
* TMA: 2-D float16 / bfloat16 on Hopper or newer, at least one large tile per
  SM, operands a TMA descriptor can describe (or copied into rows it can, on
  problems large enough to pay for the copy), and K not split; C stored through
  pointers where its rows are not 16-byte aligned (a caller's `out`; see below).
* POINTER: everything else (batches, float32, float64, strided operands,
  older GPUs).

A new C on a GPU whose rows are not a whole number of 16-byte runs (N s not a
multiple of 16: an LM head's odd vocabulary) is made with each row padded to
16 bytes, its strides (N', 1) with N' > N, unless K is split; the kernels then
store it 16 bytes an access, the TMA kernel through a descriptor.  The result
is that (M, N) tensor, not contiguous (``Tuning.pad_c_rows``), as
torch.compile's is (Inductor's pad_mm).

On a GPU the autotuner picks the tile from kernels.py's lists (``CONFIGS``,
``TMA_CONFIGS``); the interpreter takes a fixed tile.  docs/ops/matmul.md has
the plan table with its measurements.
"""

import functools
from dataclasses import dataclass

import torch

from ..blocks.alignment import column_multiple
from ..blocks.elementwise import elementwise_config
from ..blocks.sizes import cdiv, next_power_of_2
from ..runtime import ByKind, DeviceFacts, device_facts, is_fake, tma_available

EMPTY, POINTER, TMA = "empty", "pointer", "tma"

# TMA's rule (hardware, not tuning): the base address and every stride but the unit one are multiples of 16 bytes.
TMA_ALIGNMENT = 16


@dataclass(frozen=True)
class Tile:
    """A fixed launch tile: C in BLOCK_M x BLOCK_N tiles, K walked BLOCK_K at a time, by programs of `warps` warps
    that pipeline `stages` K steps (one of the autotuner's configs, fixed: the harness's --configs sweep)."""

    block_m: int
    block_n: int
    block_k: int
    warps: int = 4  # Triton's defaults; the interpreter ignores both
    stages: int = 3

    def constexprs(self) -> dict:
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "BLOCK_K": self.block_k}

    def options(self) -> dict:
        return {"num_warps": self.warps, "num_stages": self.stages}


@dataclass(frozen=True)
class Tuning:
    """Every constant a matmul plan uses (measurements: docs/perf-notes.md, by version).  The fields
    without ``interpreter_`` are the GPU's; the interpreter's rules are the same scaled down to its tile
    and its few pretend SMs, so that CPU tests split K (and, told to, take the TMA kernel) at small sizes."""

    # The interpreter runs one Python loop iteration per program: few, large tiles (a CPU choice, not timed).
    # Its tl.dot multiplies bfloat16 operands as raw 16-bit integers, so they are upcast first; a product of
    # two half-precision numbers is exact in float32, so the result is the same as the tensor cores'.
    interpreter_tile: Tile = Tile(64, 64, 64)
    # The interpreter's pretend SMs (its "programs at once"): a few, so small problems split K and take TMA.
    interpreter_programs: int = 8
    # The interpreter's TMA launch stores the tile in two halves, the path the first TMA configs take (version 8);
    # warp specialization is a GPU compiler's choice, which the interpreter's plain loop does not have.
    interpreter_store_halves: bool = True
    interpreter_warp_specialize: bool = False

    # Grouped program order (op.py's docstring): GROUP_M rows of tiles a group, so that programs running at once
    # share B's tiles and a few of A's in L2.  Every launch takes it, fixed tile or autotuned; 1 is row-major
    # order, which the harness times beside it (the tk-row-major variant: the lesson of Triton's matmul tutorial).
    group_m: int = 8

    # Split K (docs/perf-notes.md, version 6): split when C has at most half as many tiles as the GPU has SMs,
    # counted with the tile the autotuner picks for small problems (64x128; 32 tiles at M16xN4096).
    split_tile: tuple[int, int] = (64, 128)
    # A slice at least this deep: a shorter one spends more on its partial sums' traffic than it saves
    # (version 6: M16xN4096xK4096 from 0.61x to 0.90x cuBLAS at 4 slices; version 10: split 2 with
    # 16x64x128 tiles ran within the spread of this rule's 4, not worth a change).
    min_split_k: int = 512
    max_split: int = 16  # slices at most (version 6)

    # TMA (version 8): at least one tile this size per SM (2048 x 2048 on an H100: 0.89x cuBLAS against the
    # pointer kernel's 0.81x); below, the persistent grid's large tiles leave SMs idle (1024^3, 64 tiles: the
    # TMA kernel at 0.60-0.68x against the pointer kernel's 0.84x, version 10).
    tma_min_tile: int = 128
    # The TMA kernel stores C through its descriptor where C's rows are this aligned (bytes), through masked
    # pointers elsewhere.  TMA_ALIGNMENT is the hardware's floor; the harness's tk-c-pointers variant raises it
    # to 128 (a cache line) to time the pointer store against TMA's on rows that are 16- but not 128-aligned.
    c_store_alignment: int = TMA_ALIGNMENT
    # A new C whose rows are not a whole number of TMA_ALIGNMENT-byte runs (N s not a multiple of 16: GPT-2's LM
    # head, N = 50257) gets rows padded to 16 bytes, strides (N', 1) (torch.empty_strided: not a view, so autograd
    # and in-place ops treat it as any other result), unless K is split.  The TMA kernel then stores it through a
    # descriptor, the pointer kernel 16 bytes an access.  torch.compile returns the same layout (Inductor's pad_mm:
    # the product of a padded weight, reinterpreted as (M, N) with row stride N').  Contiguous, the head's C went
    # through masked pointers one element an access: 8191x50257x768 at 0.45x compile's (perf-notes version 52).
    # The harness's tk-contiguous-c times that beside.  Off on the interpreter, where tests turn it on.
    pad_c_rows: ByKind[bool] = ByKind(cuda=True, cpu=False)
    # An operand no descriptor can describe (rows not 16-byte aligned: b (K, N) row-major with N odd, whose
    # 8191x50257x768 ran the pointer kernel at 0.26x cuBLAS, perf-notes version 47) is copied into rows that
    # are, and the TMA kernel reads the copy, where the GEMM's other side (M for b, N for a) is at least this.
    # The copy of b moves 2 K N s bytes against 2 M N K flops: about s F / (BW M) of the kernel's time, 440 / M
    # for 16-bit operands at 660 TFLOP/s over 3 TB/s (11% at 4096), where the TMA kernel ran 3x the pointer
    # kernel's rate on LM heads.  The copy (launch.py's aligned_copy, copy_) ran at 1.7 TB/s on unaligned rows
    # (H200, version 53), so about 780 / M; the pointer kernel ran 3-5x the TMA kernel's time (4095x50257x1024,
    # b row-major: 3.17 ms against compile's 0.67), so the copy pays from M near 250: the floor is 1024, with
    # room for a slower copy (it was 4096, which left 4095 tokens on the pointer kernel).  The interpreter
    # copies from its tile's size, so that CPU tests take it.
    operand_copy_min: int = 1024
    interpreter_operand_copy_min: int = 64
    # B described, its rows an odd multiple of 16 bytes apart (N = 5000 row-major: 10000 bytes; K = 3000 column-major:
    # 6000), slows the TMA kernel's loads of B; a's rows so apart cost nothing (perf-notes version 47).  H100, bf16,
    # one run (version 52), the kernel on B's rows copied `b_row_bytes` apart: 4096x5000x3072 231 us as it is, 198
    # at 32-byte rows, 191 at 64, 187.6 at 128 (cuBLAS 178.7); 4000x5000x3000 259 -> 187 (173); column-major at K =
    # 3000, 249 -> 187.  Such a B is copied (copy_rows_kernel) into rows padded to `b_row_bytes` where M is at least
    # realign_min: the copy moves 2 K N s bytes, about 565 / M of the kernel's time at 2.3 TB/s against 650 TFLOP/s,
    # under the 19-28% it saves from M = 3072.  Rows a multiple of 32 bytes apart are left (198 against 187.6 saves
    # less than the copy costs).
    b_row_bytes: int = 128
    realign_min: int = 3072
    interpreter_realign_min: int = 64


TUNING = Tuning()


@dataclass(frozen=True)
class Operand:
    """What a plan needs of a or b: shape and strides (2-D or 3-D) in elements, and where it starts."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    storage_offset: int  # elements from the start of the storage
    address_aligned: bool  # its address is TMA_ALIGNMENT-aligned (True where not read: see describe)


@dataclass(frozen=True)
class Meta:
    """One call of tk.matmul, as its plan sees it (built by ``describe``, or directly by a test)."""

    a: Operand
    b: Operand
    dtype: torch.dtype
    tf32_allowed: bool  # torch.backends.cuda.matmul.allow_tf32 at the call
    facts: DeviceFacts
    tma_descriptors: bool  # Triton can build TMA descriptors on this device (Hopper or newer, a Triton that has them)
    c_address_aligned: bool = True  # C starts on TMA_ALIGNMENT bytes (a new C does; a caller's `out` may not)
    c_new: bool = True  # C is made by the call (False: a caller's `out`, whose layout is given)

    @property
    def M(self) -> int:
        return self.a.shape[-2]

    @property
    def K(self) -> int:
        return self.a.shape[-1]

    @property
    def N(self) -> int:
        return self.b.shape[-1]

    @property
    def batched(self) -> bool:
        """Whether C is 3-D: either operand is."""
        return len(self.a.shape) == 3 or len(self.b.shape) == 3

    @property
    def batch(self) -> int:
        """Matrices in C: the batch of the 3-D operand(s) (op.py checked they agree), 1 for 2-D @ 2-D."""
        if len(self.a.shape) == 3:  # not `a's batch or b's`: a batch of 0 matrices is 0, not 1
            return self.a.shape[0]
        return self.b.shape[0] if len(self.b.shape) == 3 else 1


@dataclass(frozen=True)
class Layout:
    """How a TMA descriptor describes a 2-D operand: row-major, or column-major (described as the row-major
    matrix it is the transpose of), with the stride between its rows (columns)."""

    column_major: bool
    leading_stride: int


@dataclass(frozen=True)
class Multiples:
    """What the pointer kernel is told each size and stride is a multiple of: ``column_multiple``, the largest
    power of two up to 16 dividing it (1 tells nothing).  Triton's own specialization tells multiples of 16
    only, so rows 1000 elements apart looked unaligned: the kernel moved 2 bytes an access where 16 fit (the
    PTX of M1000xN1000xK1000 bfloat16 had only ``ld.global.b16`` and ``st.global.b16``; ops/blocks/alignment.py).
    A unit stride is 1 here (Triton specializes it to the constant 1), and a stride of 0 a multiple of 16."""

    m: int
    n: int
    k: int
    a: tuple[int, int, int]  # (batch, row, column) strides of a, b and C, as launch.py passes them
    b: tuple[int, int, int]
    c: tuple[int, int, int]
    c_slice: int  # the split-K workspace's slice stride

    def constexprs(self) -> dict:
        names = {"M": self.m, "N": self.n, "K": self.k, "C_SLICE": self.c_slice}
        for operand, strides in (("A", self.a), ("B", self.b), ("C", self.c)):
            names.update({f"{operand}{axis}": m for axis, m in zip("BRC", strides)})
        return {f"{name}_MULTIPLE": m for name, m in names.items()}


def pointer_multiples(meta: Meta, split: int, row: int) -> Multiples:
    """The Multiples of a pointer launch: a's and b's strides as given (a 2-D operand's batch stride 0), C's rows
    `row` apart (c_row_stride), its matrices M of them (its workspace slices, when K is split, a whole C apart)."""
    key = (meta.M, meta.N, meta.K, meta.batch, meta.batched, meta.a.strides, meta.b.strides, split, row)
    # A plan is made on every Python-path call: the cache saves ~5 µs of divisions a repeat.  Traced sizes
    # (SymInts, under torch.compile's dynamic shapes or opcheck) are not hashable: those are computed.
    plain = all(type(v) is int for v in (*key[:4], *meta.a.strides, *meta.b.strides))
    return _cached_multiples(*key) if plain else _multiples(*key)


def _multiples(M, N, K, batch, batched, a_strides, b_strides, split, c_row) -> Multiples:
    def operand(strides) -> tuple[int, int, int]:
        return tuple(column_multiple(s) for s in (strides if len(strides) == 3 else (0, *strides)))

    c_batch = M * c_row if batched else 0
    c_slice = M * N * batch if split > 1 else 0  # (K split: C is contiguous, c_row is N)
    return Multiples(
        column_multiple(M), column_multiple(N), column_multiple(K), operand(a_strides), operand(b_strides),
        (column_multiple(c_batch), column_multiple(c_row), 1), column_multiple(c_slice),
    )  # fmt: skip


_cached_multiples = functools.lru_cache(maxsize=1024)(_multiples)


@dataclass(frozen=True)
class Plan:
    """How one call runs: the design and every number its launches take."""

    design: str  # EMPTY, POINTER or TMA
    shape: tuple[int, ...]  # C's: (M, N), or (batch, M, N) when an operand is batched
    M: int
    N: int
    K: int
    batch: int
    tile: Tile | None = None  # a fixed tile (the interpreter); None: the autotuner picks one of kernels.py's configs
    upcast_operands: bool = False  # bfloat16 in the interpreter (see Tuning.interpreter_tile)
    group_m: int = 8  # rows of tiles a group in the programs' order (Tuning.group_m; 1: row-major)
    c_row_stride: int = 0  # elements from one of C's rows to the next: N, or N' for a new C padded (pad_c_rows)
    # The pointer kernel.
    multiples: Multiples | None = None  # what its sizes and strides are known to be multiples of
    allow_tf32: bool = False
    split: int = 1  # slices of K (1: not split), each a program of the grid's third axis
    accumulator: torch.dtype | None = None  # the workspace slices' dtype (split > 1): float32, float64 for float64
    sum_block: int = 0  # the slice sum's launch, by the elementwise rule (split > 1)
    sum_warps: int = 0
    # The TMA kernel.
    a_layout: Layout | None = None
    b_layout: Layout | None = None
    programs: int = 0  # the persistent grid's programs at most: the SMs (or fewer, when there are fewer tiles)
    c_pointers: bool = False  # C's rows are not TMA_ALIGNMENT-aligned: stored through masked pointers
    copy_a: bool = False  # the kernel reads a copy of a (b) whose rows are aligned (Tuning.operand_copy_min)
    copy_b: bool = False
    # b described but its rows an odd multiple of 16 bytes apart: copied, layout kept, into rows b_layout's
    # leading stride apart (Tuning.b_row_bytes) by copy_rows_kernel, on (rows, columns) tiles of realign_tile.
    realign_b: bool = False
    realign_tile: tuple[int, int, int] = (0, 0, 0)  # (BLOCK_R, BLOCK_C, warps)
    store_halves: bool = False  # with a fixed tile; autotuned configs carry their own
    warp_specialize: bool = False


def describe(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> Meta:
    """The Meta of a @ b (written into `out`, contiguous, where given): the only place a matmul asks the
    device, the call's settings or a pointer."""
    tma_descriptors = tma_available(a.device)
    return Meta(
        a=_operand(a, tma_descriptors),
        b=_operand(b, tma_descriptors),
        dtype=a.dtype,
        tf32_allowed=torch.backends.cuda.matmul.allow_tf32,
        facts=device_facts(a.device),
        tma_descriptors=tma_descriptors,
        c_address_aligned=out is None or _starts_aligned(_operand(out, tma_descriptors), out.element_size()),
        c_new=out is None,
    )


def _starts_aligned(operand: Operand, element_size: int) -> bool:
    """Whether a TMA descriptor may start at the operand: its address TMA_ALIGNMENT-aligned."""
    return operand.address_aligned and (operand.storage_offset * element_size) % TMA_ALIGNMENT == 0


def _operand(t: torch.Tensor, read_address: bool) -> Operand:
    """t as a plan sees it.  Its address matters to a TMA descriptor only, so it is read only on a device that
    has them, and only from a real CUDA tensor (a fake one, under tracing, has none); is_fake costs 1-3 µs a
    tensor on the host, which other devices are spared.  Storage from outside PyTorch's allocator (from_blob,
    DLPack) need not be aligned."""
    aligned = not (read_address and t.device.type == "cuda" and not is_fake(t) and t.data_ptr() % TMA_ALIGNMENT)
    return Operand(tuple(t.shape), tuple(t.stride()), t.storage_offset(), aligned)


def choose_plan(meta: Meta, tuning: Tuning = TUNING) -> Plan:
    """The plan of one call (see the module docstring for the order of the designs)."""
    if meta.M * meta.N * meta.batch == 0:
        return _plan(meta, EMPTY, tuning)
    split = split_k(meta, tuning)
    layouts = _tma_layouts(meta, split, tuning)
    if layouts is not None:
        return tma_plan(meta, *layouts, tuning=tuning)
    return pointer_plan(meta, split, tuning)


def programs_at_once(facts: DeviceFacts, tuning: Tuning = TUNING) -> int:
    """Programs that fill the device once: its SMs, or the interpreter's few pretend ones."""
    return facts.sm_count if facts.cuda else tuning.interpreter_programs


def split_k(meta: Meta, tuning: Tuning = TUNING) -> int:
    """How many slices K is split into: 1 (no split) unless C is too small to fill the GPU.

    Split when C has at most half as many tiles as there are SMs; then into
    as many slices as fill the SMs about once, each at least min_split_k
    deep, at most max_split of them."""
    if meta.facts.cuda:
        (tile_m, tile_n), min_split_k = tuning.split_tile, tuning.min_split_k
    else:
        tile = tuning.interpreter_tile
        (tile_m, tile_n), min_split_k = (tile.block_m, tile.block_n), tile.block_k
    tiles = cdiv(meta.M, tile_m) * cdiv(meta.N, tile_n) * meta.batch
    sms = programs_at_once(meta.facts, tuning)
    if tiles * 2 > sms:  # at least half the SMs busy already
        return 1
    return max(1, min(sms // tiles, meta.K // min_split_k, tuning.max_split))


def tma_layout(operand: Operand, element_size: int) -> Layout | None:
    """The layout of a 2-D operand for a TMA descriptor, or None when none can describe it: a unit stride,
    rows (columns) apart and not overlapping, the base and the leading stride TMA_ALIGNMENT-aligned."""
    if not _starts_aligned(operand, element_size):
        return None
    shape, strides = operand.shape, operand.strides
    for column_major, unit, leading in ((False, 1, 0), (True, 0, 1)):
        apart = strides[leading] >= shape[unit] and (strides[leading] * element_size) % TMA_ALIGNMENT == 0
        if strides[unit] == 1 and apart:
            return Layout(column_major, strides[leading])
    return None


def realigned_layout(meta: Meta, layout: Layout, tuning: Tuning = TUNING) -> Layout | None:
    """The layout of a copy of b with rows Tuning.b_row_bytes apart, where b's rows, as described, are an odd
    multiple of TMA_ALIGNMENT bytes apart and M is large enough to pay for the copy; None otherwise."""
    size = meta.dtype.itemsize
    floor = tuning.realign_min if meta.facts.cuda else tuning.interpreter_realign_min
    if (layout.leading_stride * size) % (2 * TMA_ALIGNMENT) == 0 or meta.M < floor:
        return None
    columns = meta.K if layout.column_major else meta.N  # the copied rows' length
    return Layout(layout.column_major, _aligned_row(columns, size, tuning.b_row_bytes))


def _tma_layouts(meta: Meta, split: int, tuning: Tuning) -> tuple[Layout, Layout, bool, bool] | None:
    """The layouts of a and b for the TMA kernel and whether each is read from an aligned copy, or None where
    the kernel does not apply: no TMA descriptors, batches, split K, 32- and 64-bit operands, small problems,
    an operand no descriptor describes on a problem too small to pay for its copy."""
    if split > 1 or len(meta.a.shape) != 2 or len(meta.b.shape) != 2:
        return None
    if meta.dtype not in (torch.float16, torch.bfloat16):
        return None
    size = meta.dtype.itemsize
    if not meta.tma_descriptors:  # (C's rows need not be aligned: tma_plan stores those through pointers)
        return None
    tile = tuning.tma_min_tile if meta.facts.cuda else tuning.interpreter_tile.block_m
    if cdiv(meta.M, tile) * cdiv(meta.N, tile) < programs_at_once(meta.facts, tuning):
        return None
    layout_a, layout_b = tma_layout(meta.a, size), tma_layout(meta.b, size)
    floor = tuning.operand_copy_min if meta.facts.cuda else tuning.interpreter_operand_copy_min
    copy_a, copy_b = layout_a is None and meta.N >= floor, layout_b is None and meta.M >= floor
    if copy_a:  # a row-major copy, its rows padded to TMA_ALIGNMENT
        layout_a = Layout(False, _aligned_row(meta.K, size))
    if copy_b:
        layout_b = Layout(False, _aligned_row(meta.N, size))
    return None if layout_a is None or layout_b is None else (layout_a, layout_b, copy_a, copy_b)


def _aligned_row(columns: int, element_size: int, alignment: int = TMA_ALIGNMENT) -> int:
    """Elements a row of `columns` takes when padded to whole `alignment`-byte runs."""
    return cdiv(columns * element_size, alignment) * alignment // element_size


def _plan(meta: Meta, design: str, tuning: Tuning = TUNING, **launch) -> Plan:
    """A plan of `design` for meta's problem; on the interpreter, with its fixed tile and bfloat16 upcast."""
    shape = (meta.batch, meta.M, meta.N) if meta.batched else (meta.M, meta.N)
    interpreted = not meta.facts.cuda
    return Plan(
        design, shape, meta.M, meta.N, meta.K, meta.batch,
        tile=tuning.interpreter_tile if interpreted else None,
        upcast_operands=interpreted and meta.dtype == torch.bfloat16,
        group_m=tuning.group_m,
        **{"c_row_stride": meta.N, **launch},  # contiguous unless the design's plan pads C (c_row_stride)
    )  # fmt: skip


def c_row_stride(meta: Meta, split: int, tuning: Tuning = TUNING) -> int:
    """C's row stride in elements (Tuning.pad_c_rows): N, or N padded to whole TMA_ALIGNMENT-byte runs for a new
    C on a device that pads, K not split (the slice sum walks C as one flat run).  A function of sizes and the
    device alone, never of addresses: a traced call plans it as the real one does, and the strides agree."""
    size = meta.dtype.itemsize
    if (meta.N * size) % TMA_ALIGNMENT and meta.c_new and split == 1 and tuning.pad_c_rows.on(meta.facts):
        return _aligned_row(meta.N, size)
    return meta.N


def _copy_tile(rows: int, columns: int, facts: DeviceFacts) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_C, warps) of copy_rows_kernel over rows x columns: the elementwise rule's block and warps
    for as many elements, as whole rows of a block of columns (at most the row, rounded up to a power of two)."""
    block, warps = elementwise_config(rows * columns, torch.device(facts.kind))
    block_c = min(block, next_power_of_2(columns))
    return block // block_c, block_c, warps


def pointer_plan(meta: Meta, split: int, tuning: Tuning = TUNING) -> Plan:
    """The pointer kernel with K in `split` slices (``split_k``'s count, or a test's)."""
    row = c_row_stride(meta, split, tuning)
    launch = {
        "allow_tf32": meta.dtype == torch.float32 and meta.tf32_allowed,
        "split": split,
        "c_row_stride": row,
        "multiples": pointer_multiples(meta, split, row),
    }
    if split > 1:  # slices of a workspace in the accumulator's dtype, summed into C by the elementwise rule
        sum_block, sum_warps = elementwise_config(meta.M * meta.N * meta.batch, torch.device(meta.facts.kind))
        accumulator = torch.float64 if meta.dtype == torch.float64 else torch.float32
        launch.update(accumulator=accumulator, sum_block=sum_block, sum_warps=sum_warps)
    return _plan(meta, POINTER, tuning, **launch)


def tma_plan(meta: Meta, a_layout: Layout, b_layout: Layout, copy_a: bool = False, copy_b: bool = False,
             tuning: Tuning = TUNING) -> Plan:  # fmt: skip
    """The TMA kernel on a persistent grid of one program per SM (reading aligned copies of a or b where told)."""
    launch = {"a_layout": a_layout, "b_layout": b_layout, "programs": programs_at_once(meta.facts, tuning)}
    launch.update(copy_a=copy_a, copy_b=copy_b)
    realigned = None if copy_b else realigned_layout(meta, b_layout, tuning)
    if realigned is not None:  # b's rows as described: N of K columns (column-major) or K of N
        rows, columns = (meta.N, meta.K) if b_layout.column_major else (meta.K, meta.N)
        launch.update(b_layout=realigned, realign_b=True, realign_tile=_copy_tile(rows, columns, meta.facts))
    launch["c_row_stride"] = row = c_row_stride(meta, 1, tuning)
    c_rows_aligned = (row * meta.dtype.itemsize) % tuning.c_store_alignment == 0
    launch["c_pointers"] = not (c_rows_aligned and meta.c_address_aligned)
    if not meta.facts.cuda:  # the fixed tile's flags; an autotuned config carries its own
        launch.update(store_halves=tuning.interpreter_store_halves, warp_specialize=tuning.interpreter_warp_specialize)
    return _plan(meta, TMA, tuning, **launch)
