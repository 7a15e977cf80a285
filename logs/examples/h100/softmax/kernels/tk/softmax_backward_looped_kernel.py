@triton.jit
def softmax_backward_looped_kernel(
    dy_ptr, y_ptr, dx_ptr, n_cols, inner, BLOCK_SIZE: tl.constexpr, COL_MULTIPLE: tl.constexpr
):
    """Rows longer than a block: one pass for sum(dy * y), one to write dx."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    start = _row_start(tl.program_id(0).to(tl.int64), n_cols, inner)
    dot = _dot(dy_ptr, y_ptr, start, 0, n_cols, inner, BLOCK_SIZE)
    _write_dx(dy_ptr, y_ptr, dx_ptr, start, 0, n_cols, inner, dot, BLOCK_SIZE)
