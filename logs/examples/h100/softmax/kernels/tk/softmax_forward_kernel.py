@triton.jit
def softmax_forward_kernel(
    x_ptr, y_ptr, n_rows, n_cols, inner, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, COL_MULTIPLE: tl.constexpr
):
    """Rows that fit in one block: a tile of BLOCK_M whole rows (one, for long
    rows), each reduced on its own in registers; one read and one write."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    offsets, read, write = _tile(n_rows, n_cols, inner, BLOCK_M, BLOCK_N)
    x = _compute_dtype(tl.load(x_ptr + offsets, mask=read, other=-float("inf")))  # -inf lanes add exp(-inf) = 0
    numerator = exp(x - tl.max(x, axis=1)[:, None])  # subtracting the max keeps exp() from overflowing
    y = numerator / tl.sum(numerator, axis=1)[:, None]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=write)
