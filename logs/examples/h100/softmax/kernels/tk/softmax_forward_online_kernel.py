@triton.jit
def softmax_forward_online_kernel(x_ptr, y_ptr, n_cols, inner, BLOCK_SIZE: tl.constexpr, COL_MULTIPLE: tl.constexpr):
    """Rows longer than a block: online max and sum, then a second pass to write."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    start = _row_start(tl.program_id(0).to(tl.int64), n_cols, inner)
    row_max, row_sum = _online_max_sum(x_ptr, start, 0, n_cols, inner, BLOCK_SIZE)
    _write_softmax(x_ptr, y_ptr, start, 0, n_cols, inner, row_max, row_sum, BLOCK_SIZE)
