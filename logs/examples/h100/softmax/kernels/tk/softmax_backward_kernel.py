@triton.jit
def softmax_backward_kernel(dy_ptr, y_ptr, dx_ptr, n_cols, inner, BLOCK_SIZE: tl.constexpr):
    """dx = y * (dy - sum(dy * y)), the whole row in one block."""
    start = _row_start(tl.program_id(0).to(tl.int64), n_cols, inner)
    cols = tl.arange(0, BLOCK_SIZE)
    dy = _load_row(dy_ptr, start, cols, n_cols, inner, 0.0)
    y = _load_row(y_ptr, start, cols, n_cols, inner, 0.0)
    _store_row(dx_ptr, start, cols, n_cols, inner, y * (dy - tl.sum(dy * y, axis=0)))
