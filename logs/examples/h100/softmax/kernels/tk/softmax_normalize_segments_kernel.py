@triton.jit
def softmax_normalize_segments_kernel(
    x_ptr, y_ptr, max_ptr, sum_ptr, n_cols, inner, segment_len,
    BLOCK_SIZE: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr, COL_MULTIPLE: tl.constexpr,
):  # fmt: skip
    """Split rows, pass 2: combine the row's partials, then write one segment."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    row, segment = _reversed_program()
    seg_max = _row_partials(max_ptr, row, tl.num_programs(1), -float("inf"), SEGMENTS_BLOCK)
    seg_sum = _row_partials(sum_ptr, row, tl.num_programs(1), 0.0, SEGMENTS_BLOCK)
    row_max, row_sum = _combine_partials(seg_max, seg_sum)
    first, end = _segment(segment, segment_len, n_cols)
    _write_softmax(x_ptr, y_ptr, _row_start(row, n_cols, inner), first, end, inner, row_max, row_sum, BLOCK_SIZE)
