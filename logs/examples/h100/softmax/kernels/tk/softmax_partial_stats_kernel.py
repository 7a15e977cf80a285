@triton.jit
def softmax_partial_stats_kernel(
    x_ptr, max_ptr, sum_ptr, n_cols, inner, segment_len, BLOCK_SIZE: tl.constexpr, COL_MULTIPLE: tl.constexpr
):
    """Split rows, pass 1: the online (max, sum) of one segment of one row."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    row, segment = tl.program_id(0).to(tl.int64), tl.program_id(1)
    first, end = _segment(segment, segment_len, n_cols)
    seg_max, seg_sum = _online_max_sum(x_ptr, _row_start(row, n_cols, inner), first, end, inner, BLOCK_SIZE)
    at = partial_at(row, segment, tl.num_programs(1))  # the grid is the scratch's shape: in bounds
    tl.store(max_ptr + at, seg_max)
    tl.store(sum_ptr + at, seg_sum)
