@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn,
    stride_cb, stride_cm, stride_cn, stride_cs, SPLIT_K,
    ALLOW_TF32: tl.constexpr, UPCAST_OPERANDS: tl.constexpr,
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
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))
