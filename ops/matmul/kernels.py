"""matmul's Triton kernels: the pointer kernel (any strides, batches, split K), the TMA kernel, the split-K sum.

Each takes ACCUMULATE: C += A @ B, C read once in the epilogue and added to the float32 product before the
one rounding (cuBLAS's beta = 1: a weight gradient summed over chunks, ops/linear_cross_entropy).

Which problem takes which kernel, with which tile, is plan.py's; the math is in op.py's docstring.
The autotuner's lists (``CONFIGS``, ``TMA_CONFIGS``) stay beside the kernels they configure.
"""

import inspect

import triton
import triton.language as tl

from ..blocks.alignment import known_multiple


# GROUP_M, the programs' order, is no part of a config: it comes from the plan (Tuning.group_m) at every launch.
def _config(block_m, block_n, block_k, stages, warps):
    tile = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k}
    return triton.Config(tile, num_stages=stages, num_warps=warps)


# Tile shapes tried by the autotuner, per (M, N, K).  Large tiles feed Hopper's
# tensor cores (128x256x64 won on an H100); small ones keep skinny or small
# problems from leaving most SMs idle.  Shared memory per stage is
# (BLOCK_M + BLOCK_N) * BLOCK_K * element size: 128x256x64 bf16 is 48 KiB.
CONFIGS = [
    _config(128, 256, 64, 3, 8),
    _config(256, 128, 64, 3, 8),
    _config(128, 128, 64, 4, 8),
    _config(128, 128, 32, 4, 4),
    _config(64, 128, 64, 4, 4),
    _config(128, 64, 64, 4, 4),
    _config(64, 64, 64, 4, 4),
    _config(32, 64, 64, 4, 4),
]


@triton.jit
def _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of C's tile number ``tile`` in grouped order (see op.py's docstring)."""
    tiles_per_group = GROUP_M * num_pid_n
    first_pid_m = (tile // tiles_per_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile % tiles_per_group) % group_size_m
    pid_n = (tile % tiles_per_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn,
    stride_cb, stride_cm, stride_cn, stride_cs, SPLIT_K,
    ALLOW_TF32: tl.constexpr, UPCAST_OPERANDS: tl.constexpr, ACCUMULATE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    M_MULTIPLE: tl.constexpr, N_MULTIPLE: tl.constexpr, K_MULTIPLE: tl.constexpr, C_SLICE_MULTIPLE: tl.constexpr,
    AB_MULTIPLE: tl.constexpr, AR_MULTIPLE: tl.constexpr, AC_MULTIPLE: tl.constexpr,
    BB_MULTIPLE: tl.constexpr, BR_MULTIPLE: tl.constexpr, BC_MULTIPLE: tl.constexpr,
    CB_MULTIPLE: tl.constexpr, CR_MULTIPLE: tl.constexpr, CC_MULTIPLE: tl.constexpr,
):  # fmt: skip
    # Every size and stride restated as the multiple the plan knows it is (plan.py, Multiples): the alignment
    # analysis then sees rows that start on 16 bytes, and the masks and `% M` / `% N` wraps keep 16-byte runs.
    M, N, K = known_multiple(M, M_MULTIPLE), known_multiple(N, N_MULTIPLE), known_multiple(K, K_MULTIPLE)
    stride_ab, stride_am = known_multiple(stride_ab, AB_MULTIPLE), known_multiple(stride_am, AR_MULTIPLE)
    stride_ak, stride_bb = known_multiple(stride_ak, AC_MULTIPLE), known_multiple(stride_bb, BB_MULTIPLE)
    stride_bk, stride_bn = known_multiple(stride_bk, BR_MULTIPLE), known_multiple(stride_bn, BC_MULTIPLE)
    stride_cb, stride_cm = known_multiple(stride_cb, CB_MULTIPLE), known_multiple(stride_cm, CR_MULTIPLE)
    stride_cn, stride_cs = known_multiple(stride_cn, CC_MULTIPLE), known_multiple(stride_cs, C_SLICE_MULTIPLE)
    pid_m, pid_n = _grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)

    # Rows and columns past the edge wrap around (% M, % N): the loads stay in
    # bounds without a mask in the K loop, and the store below drops them.
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    # This program's share of the K steps: all of them unless K is split
    # (SPLIT_K > 1), when slice program_id(2) of C's partial sums is written.
    k_steps = tl.cdiv(K, BLOCK_K)
    steps_per_slice = tl.cdiv(k_steps, SPLIT_K)
    first_step = tl.program_id(2) * steps_per_slice
    last_step = tl.minimum(first_step + steps_per_slice, k_steps)
    offs_k = tl.arange(0, BLOCK_K)
    k_start = first_step.to(tl.int64) * BLOCK_K  # int64: k_start * stride passes 2**31 on large operands
    batch = tl.program_id(1).to(tl.int64)  # int64: a batch of matrices can pass 2**31 elements
    a_ptrs = a_ptr + batch * stride_ab + offs_m[:, None].to(tl.int64) * stride_am + (k_start + offs_k[None, :]) * stride_ak
    b_ptrs = b_ptr + batch * stride_bb + (k_start + offs_k[:, None]) * stride_bk + offs_n[None, :].to(tl.int64) * stride_bn

    if a_ptr.dtype.element_ty == tl.float64:  # resolved at compile time
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(first_step, last_step):
        # K is masked: a partial last step reads zeros, which add nothing.
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if UPCAST_OPERANDS:  # bfloat16 in the interpreter: see plan.py, Tuning.interpreter_tile
            a, b = a.to(tl.float32), b.to(tl.float32)
        # out_dtype names the accumulator's type: Triton 3.6 assumes float32 otherwise.
        if ALLOW_TF32:
            acc = tl.dot(a, b, acc, input_precision="tf32", out_dtype=acc.dtype)
        else:
            acc = tl.dot(a, b, acc, input_precision="ieee", out_dtype=acc.dtype)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptr += tl.program_id(2).to(tl.int64) * stride_cs  # the workspace slice, when K is split
    c_ptrs = c_ptr + batch * stride_cb + rows[:, None].to(tl.int64) * stride_cm + cols[None, :] * stride_cn
    c_mask = (rows[:, None] < M) & (cols[None, :] < N)
    if ACCUMULATE:  # (never with K split: the slice sum adds C there)
        acc += tl.load(c_ptrs, mask=c_mask, other=0.0).to(acc.dtype)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


# The autotuner's choice per shape is kept on disk where this Triton can (3.4 and later): a second
# process skips the sweep over the configs (seconds for each new shape).
_KEEP_CHOICE = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}
# GROUP_M is in the key: another program order (the harness's row-major lesson) tunes a tile of its own and
# never hands it to tk's grouped order.
# The operands' layouts are in the key too (which stride is the unit one, and how aligned the others are): an LM
# head's b as W.t() and as a contiguous (K, N) matrix are one (M, N, K) but load differently, and the choice of
# one is kept on disk for the other otherwise.
LAYOUT_KEY = ["AR_MULTIPLE", "AC_MULTIPLE", "BR_MULTIPLE", "BC_MULTIPLE"]
# C's row multiple too: a new C whose rows are padded (plan.py, Tuning.pad_c_rows) stores 16 bytes an access where
# a contiguous one of the same N stores one element, and is tuned apart.
MATMUL_KEY = ["M", "N", "K", "SPLIT_K", "GROUP_M", "ACCUMULATE", *LAYOUT_KEY, "CR_MULTIPLE"]  # (ACCUMULATE: the choices kept on disk)
matmul_kernel_autotuned = triton.autotune(configs=CONFIGS, key=MATMUL_KEY, **_KEEP_CHOICE)(matmul_kernel)
# The kernel that adds into C (ACCUMULATE) is tuned apart, with restore_value: the autotuner copies C before
# each timed run of a config and copies it back after (every run would otherwise add once more).  Those copies
# fall inside the timed calls (Triton's _bench), the same for every config; they are spared the calls that
# write a new C, and run on a shape's first call only.
matmul_kernel_accumulating = triton.autotune(
    configs=CONFIGS, key=MATMUL_KEY, restore_value=["c_ptr"], **_KEEP_CHOICE
)(matmul_kernel)


@triton.jit
def matmul_tma_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K, stride_a, stride_b, stride_c,
    A_COLUMN_MAJOR: tl.constexpr, B_COLUMN_MAJOR: tl.constexpr, C_POINTERS: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr, ACCUMULATE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    STORE_HALVES: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
):  # fmt: skip
    """C = A @ B for 2-D 16-bit operands on Hopper and newer: TMA loads, persistent grid.

    A tensor descriptor names a 2-D matrix (shape, row stride; the last stride
    must be 1) and the tile one copy moves.  The TMA unit then copies whole
    tiles between global and shared memory by itself: no per-thread address
    arithmetic, no registers held for pointers, and the bounds are checked in
    hardware (loads past the edge read zeros, which add nothing to a dot
    product; stores past the edge are dropped), so there are no masks.
    A column-major operand is described as the row-major matrix it is the
    transpose of, and each tile transposed after the load.

    C_POINTERS stores C through masked pointers instead of a descriptor: for a C
    whose rows are not 16-byte aligned (an LM head's N = 50257), which no
    descriptor can describe, while A and B still can (b = W.t() of the head's
    weight).  The K loop, where the time goes, is the same.
    """
    if A_COLUMN_MAJOR:
        a_desc = tl.make_tensor_descriptor(a_ptr, [K, M], [stride_a, 1], [BLOCK_K, BLOCK_M])
    else:
        a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [stride_a, 1], [BLOCK_M, BLOCK_K])
    if B_COLUMN_MAJOR:
        b_desc = tl.make_tensor_descriptor(b_ptr, [N, K], [stride_b, 1], [BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, [K, N], [stride_b, 1], [BLOCK_K, BLOCK_N])
    # STORE_HALVES writes the tile as two halves: half the shared memory for the
    # store, left to the load pipeline's stages.
    if not C_POINTERS:
        c_desc = tl.make_tensor_descriptor(c_ptr, [M, N], [stride_c, 1], [BLOCK_M, BLOCK_N // (1 + STORE_HALVES)])

    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    # Persistent grid: one program per SM, each taking every num_programs-th
    # tile.  flatten=True merges the tile loop and the K loop into one loop that
    # the compiler pipelines across tiles: the next tile's first loads are in
    # flight while this tile's result is rounded and stored.
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, tl.num_programs(0), flatten=True,
                         warp_specialize=WARP_SPECIALIZE):  # fmt: skip
        pid_m, pid_n = _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(k_steps):
            off_k = k * BLOCK_K
            if A_COLUMN_MAJOR:
                a = a_desc.load([off_k, off_m]).T
            else:
                a = a_desc.load([off_m, off_k])
            if B_COLUMN_MAJOR:
                b = b_desc.load([off_n, off_k]).T
            else:
                b = b_desc.load([off_k, off_n])
            if UPCAST_OPERANDS:  # bfloat16 in the interpreter: see plan.py, Tuning.interpreter_tile
                a, b = a.to(tl.float32), b.to(tl.float32)
            acc = tl.dot(a, b, acc)
        # ACCUMULATE reads C's tile here, after the K loop: a stall each tile that cost 0.7 ms at an LM head's
        # weight gradient (M 152064, N 3584, K 2048: 3.86 ms against 3.14 without; cuBLAS's addmm 3.48).  Read
        # through pointers before the loop instead, the tile held in registers across it, the kernel took 16.7 ms.
        if C_POINTERS:
            rows = off_m + tl.arange(0, BLOCK_M)
            cols = off_n + tl.arange(0, BLOCK_N)
            # int64: an LM head's C can pass 2**31 elements (16384 tokens x a 151936 vocabulary)
            c_ptrs = c_ptr + rows[:, None].to(tl.int64) * stride_c + cols[None, :]
            c_mask = (rows[:, None] < M) & (cols[None, :] < N)
            if ACCUMULATE:
                acc += tl.load(c_ptrs, mask=c_mask, other=0.0).to(tl.float32)
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)
        elif STORE_HALVES:
            if ACCUMULATE:  # the halves split in float32, each added to C's half before its rounding
                left, right = acc.reshape(BLOCK_M, 2, BLOCK_N // 2).permute(0, 2, 1).split()
                left += c_desc.load([off_m, off_n]).to(tl.float32)
                right += c_desc.load([off_m, off_n + BLOCK_N // 2]).to(tl.float32)
                left, right = left.to(c_ptr.dtype.element_ty), right.to(c_ptr.dtype.element_ty)
            else:  # rounded first: the split moves half as many bytes through registers
                c = acc.to(c_ptr.dtype.element_ty)
                left, right = c.reshape(BLOCK_M, 2, BLOCK_N // 2).permute(0, 2, 1).split()
            c_desc.store([off_m, off_n], left)
            c_desc.store([off_m, off_n + BLOCK_N // 2], right)
        else:
            if ACCUMULATE:
                acc += c_desc.load([off_m, off_n]).to(tl.float32)
            c_desc.store([off_m, off_n], acc.to(c_ptr.dtype.element_ty))


def _tma_config(block_m, block_n, block_k, stages, warps, store_halves=True, warp_specialize=False):
    meta = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k}
    meta.update(STORE_HALVES=store_halves, WARP_SPECIALIZE=warp_specialize)
    return triton.Config(meta, num_stages=stages, num_warps=warps)


# The configs that came out on top on an H100 (bf16 and fp16, 2048^3 to
# 8192^3; docs/perf-notes.md, version 8).  Shared memory per stage is
# (BLOCK_M + BLOCK_N) * BLOCK_K * 2 bytes, plus the store's staging tile:
# 3 stages of 128x256x64 and a 128x128 half take 176 KiB of Hopper's 227.
# 256x128 tiles, and 128x128 with 8 warps, lost by 3 to 10 points everywhere.
TMA_CONFIGS = [
    _tma_config(128, 256, 64, 3, 8),
    _tma_config(128, 256, 64, 4, 8),
    _tma_config(128, 256, 64, 3, 8, store_halves=False),
    _tma_config(128, 256, 64, 3, 8, warp_specialize=True),
    _tma_config(128, 128, 64, 5, 4, store_halves=False),
]


def distinct_kernels(configs: list, named_args: dict, **kwargs) -> list:
    """The configs that compile to different kernels for this call: with C stored through pointers
    (C_POINTERS) STORE_HALVES changes nothing, so of two configs that differ only there the autotuner
    times the first alone (one compile and one timing less on the first call of such a shape)."""
    if not kwargs.get("C_POINTERS", named_args.get("C_POINTERS")):
        return configs
    kept, seen = [], set()
    for config in configs:
        meta = tuple(sorted((k, v) for k, v in config.kwargs.items() if k != "STORE_HALVES"))
        kernel = (meta, config.num_warps, config.num_stages)
        if kernel not in seen:
            seen.add(kernel)
            kept.append(config)
    return kept


# The operands' and C's row strides too: b read from a realigned copy (Tuning.b_row_bytes) or as it is described,
# C padded or not, load and store differently for one (M, N, K), and each keeps a choice of its own.
TMA_KEY = ["M", "N", "K", "GROUP_M", "A_COLUMN_MAJOR", "B_COLUMN_MAJOR", "C_POINTERS", "ACCUMULATE",
           "stride_a", "stride_b", "stride_c"]  # fmt: skip
matmul_tma_kernel_autotuned = triton.autotune(
    configs=TMA_CONFIGS, key=TMA_KEY, prune_configs_by={"early_config_prune": distinct_kernels}, **_KEEP_CHOICE
)(matmul_tma_kernel)
matmul_tma_kernel_accumulating = triton.autotune(  # (as matmul_kernel_accumulating)
    configs=TMA_CONFIGS, key=TMA_KEY, prune_configs_by={"early_config_prune": distinct_kernels},
    restore_value=["c_ptr"], **_KEEP_CHOICE,
)(matmul_tma_kernel)


@triton.jit
def split_k_sum_kernel(
    partial_ptr, c_ptr, n_elements, SPLIT_K: tl.constexpr, ACCUMULATE: tl.constexpr, BLOCK_SIZE: tl.constexpr
):
    """c = the sum of SPLIT_K slices of n_elements partial sums, added in slice order (ACCUMULATE: that
    sum + c).  (s * n_elements stays far below 2**31: K is split only for small outputs.)"""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    acc = tl.load(partial_ptr + offsets, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(partial_ptr + s * n_elements + offsets, mask=mask, other=0.0)
    if ACCUMULATE:
        acc += tl.load(c_ptr + offsets, mask=mask, other=0.0).to(acc.dtype)
    tl.store(c_ptr + offsets, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def copy_rows_kernel(
    src_ptr, dst_ptr, n_rows, n_cols, src_stride, dst_stride,
    SRC_MULTIPLE: tl.constexpr, DST_MULTIPLE: tl.constexpr, COLS_MULTIPLE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """dst[r, c] = src[r, c] for n_rows rows of n_cols, rows src_stride and dst_stride elements apart, columns
    adjacent in both: an operand copied into rows a TMA descriptor reads faster (plan.py, Tuning.b_row_bytes).
    dst's columns past n_cols are left as they are: the kernel that reads the copy is told n_cols.  The strides
    and n_cols restated as the multiples they are (16 bytes in the cases the plan copies), so that each thread
    moves 16 bytes an access."""
    src_stride = known_multiple(src_stride, SRC_MULTIPLE)
    dst_stride = known_multiple(dst_stride, DST_MULTIPLE)
    n_cols = known_multiple(n_cols, COLS_MULTIPLE)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]  # int64: rows * stride > 2**31
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
    mask = (rows < n_rows) & (cols < n_cols)
    values = tl.load(src_ptr + rows * src_stride + cols, mask=mask)
    tl.store(dst_ptr + rows * dst_stride + cols, values, mask=mask)

