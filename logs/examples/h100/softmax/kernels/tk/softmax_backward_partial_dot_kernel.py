@triton.jit
def softmax_backward_partial_dot_kernel(
    dy_ptr, y_ptr, dot_ptr, n_cols, inner, segment_len, BLOCK_SIZE: tl.constexpr, COL_MULTIPLE: tl.constexpr
):
    """Split rows, pass 1: sum(dy * y) over one segment of one row."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    row, segment = tl.program_id(0).to(tl.int64), tl.program_id(1)
    first, end = _segment(segment, segment_len, n_cols)
    dot = _dot(dy_ptr, y_ptr, _row_start(row, n_cols, inner), first, end, inner, BLOCK_SIZE)
    tl.store(dot_ptr + partial_at(row, segment, tl.num_programs(1)), dot)  # the grid is the scratch's shape
