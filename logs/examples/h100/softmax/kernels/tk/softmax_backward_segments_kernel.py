@triton.jit
def softmax_backward_segments_kernel(
    dy_ptr, y_ptr, dx_ptr, dot_ptr, n_cols, inner, segment_len,
    BLOCK_SIZE: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr, COL_MULTIPLE: tl.constexpr,
):  # fmt: skip
    """Split rows, pass 2: the row's dot is the sum of its partials; write dx for one segment."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    row, segment = _reversed_program()
    dot = tl.sum(_row_partials(dot_ptr, row, tl.num_programs(1), 0.0, SEGMENTS_BLOCK), axis=0)
    first, end = _segment(segment, segment_len, n_cols)
    _write_dx(dy_ptr, y_ptr, dx_ptr, _row_start(row, n_cols, inner), first, end, inner, dot, BLOCK_SIZE)
