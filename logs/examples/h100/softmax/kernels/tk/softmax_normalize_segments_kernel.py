@triton.jit
def softmax_normalize_segments_kernel(
    x_ptr, y_ptr, max_ptr, sum_ptr, n_cols, inner, segment_len, BLOCK_SIZE: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr
):
    """Split rows, pass 2: combine the row's partials, then write one segment."""
    row, segment = _reversed_program()
    seg_max = _row_partials(max_ptr, row, -float("inf"), SEGMENTS_BLOCK)
    seg_sum = _row_partials(sum_ptr, row, 0.0, SEGMENTS_BLOCK)
    row_max = tl.max(seg_max, axis=0)
    # Rescale each segment's sum from its own max to the row's, as the online
    # sum does.  A segment of -inf only (and a padding lane) has max -inf and
    # sum 0: exp(-inf - M) = 0 keeps it out.  An all -inf row has M = -inf:
    # exp(-inf - -inf) is NaN, so S and the row are NaN, as in torch.softmax.
    row_sum = tl.sum(seg_sum * tl.exp(seg_max - row_max), axis=0)
    first, end = _segment(segment, segment_len, n_cols)
    _write_softmax(x_ptr, y_ptr, _row_start(row, n_cols, inner), first, end, inner, row_max, row_sum, BLOCK_SIZE)
