@triton.jit
def matmul_tma_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K, stride_a, stride_b, stride_c,
    A_COLUMN_MAJOR: tl.constexpr, B_COLUMN_MAJOR: tl.constexpr, C_POINTERS: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr,
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
        c = acc.to(c_ptr.dtype.element_ty)
        if C_POINTERS:
            rows = off_m + tl.arange(0, BLOCK_M)
            cols = off_n + tl.arange(0, BLOCK_N)
            # int64: an LM head's C can pass 2**31 elements (16384 tokens x a 151936 vocabulary)
            c_ptrs = c_ptr + rows[:, None].to(tl.int64) * stride_c + cols[None, :]
            tl.store(c_ptrs, c, mask=(rows[:, None] < M) & (cols[None, :] < N))
        elif STORE_HALVES:
            left, right = c.reshape(BLOCK_M, 2, BLOCK_N // 2).permute(0, 2, 1).split()
            c_desc.store([off_m, off_n], left)
            c_desc.store([off_m, off_n + BLOCK_N // 2], right)
        else:
            c_desc.store([off_m, off_n], c)
