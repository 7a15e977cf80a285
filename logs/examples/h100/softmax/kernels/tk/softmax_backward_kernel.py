@triton.jit
def softmax_backward_kernel(
    dy_ptr, y_ptr, dx_ptr, n_rows, n_cols, inner,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, COL_MULTIPLE: tl.constexpr,
):  # fmt: skip
    """dx = y * (dy - sum(dy * y)), a tile of BLOCK_M whole rows in one block.

    dy and y are loaded in their storage dtype and widened where they are used:
    each product dy * y and the sum in float32, dx in float32 from the stored
    values.  (The products were once rounded to the storage dtype, to keep
    float32 copies of a long 16-bit row out of the registers; that gave up to
    35x PyTorch's error on some rows, and the compiler keeps the widened values
    as short-lived as the rounded ones: the same registers and stack, sm_90.)
    The held backward takes its dot the same way."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    offsets, read, write = _tile(n_rows, n_cols, inner, BLOCK_M, BLOCK_N)
    dy = tl.load(dy_ptr + offsets, mask=read, other=0.0)
    y = tl.load(y_ptr + offsets, mask=read, other=0.0)
    dot = _segment_dot(dy, y)
    dx = _compute_dtype(y) * (_compute_dtype(dy) - dot[:, None])
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=write)
