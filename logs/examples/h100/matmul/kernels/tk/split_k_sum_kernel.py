@triton.jit
def split_k_sum_kernel(partial_ptr, c_ptr, n_elements, SPLIT_K: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """c = the sum of SPLIT_K slices of n_elements partial sums, added in slice order.
    (s * n_elements stays far below 2**31: K is split only for small outputs.)"""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    acc = tl.load(partial_ptr + offsets, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(partial_ptr + s * n_elements + offsets, mask=mask, other=0.0)
    tl.store(c_ptr + offsets, acc.to(c_ptr.dtype.element_ty), mask=mask)
