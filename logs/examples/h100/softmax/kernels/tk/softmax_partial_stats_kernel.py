@triton.jit
def softmax_partial_stats_kernel(x_ptr, max_ptr, sum_ptr, n_cols, inner, segment_len, BLOCK_SIZE: tl.constexpr):
    """Split rows, pass 1: the online (max, sum) of one segment of one row."""
    row, segment = tl.program_id(0).to(tl.int64), tl.program_id(1)
    first, end = _segment(segment, segment_len, n_cols)
    seg_max, seg_sum = _online_max_sum(x_ptr, _row_start(row, n_cols, inner), first, end, inner, BLOCK_SIZE)
    tl.store(max_ptr + _partial_at(row, segment), seg_max)  # the grid is the scratch's shape: in bounds
    tl.store(sum_ptr + _partial_at(row, segment), seg_sum)
