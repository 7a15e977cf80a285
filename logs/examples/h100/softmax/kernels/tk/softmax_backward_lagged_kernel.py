@triton.jit
def softmax_backward_lagged_kernel(
    dy_ptr, y_ptr, dx_ptr, words_ptr, n_rows, n_cols, inner, n_segments, rows_at_once, max_spins,
    SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr, COL_MULTIPLE: tl.constexpr,
    OVERLAPPED: tl.constexpr, FRAME: tl.constexpr,
):
    """Rows held on chip across programs, publishing a round ahead (see
    softmax_forward_lagged_kernel): the next row's sum(dy * y) goes out
    before the wait for this row's words, then dx is written."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    segment, cols, first_row = program_segment(n_segments, SEGMENT)
    dy, y, dy_edge, y_edge = _publish_dot(dy_ptr, y_ptr, words_ptr, first_row, n_rows, segment, cols, n_cols, inner,
                                          n_segments, OVERLAPPED, SEGMENT, FRAME)  # fmt: skip
    for round in range(0, tl.cdiv(n_rows - first_row, rows_at_once)):
        row = first_row + round * rows_at_once
        next_row = row + rows_at_once
        dy_next, y_next, dy_edge_next, y_edge_next = _publish_dot(
            dy_ptr, y_ptr, words_ptr, next_row, n_rows, segment, cols, n_cols, inner, n_segments, False, SEGMENT, FRAME
        )
        words, published = row_words(words_ptr, row, n_segments, max_spins, SEGMENTS_BLOCK)
        if published:
            _, part_dot = unpack(words)
        else:
            part_dot = _segments_dot_here(dy_ptr, y_ptr, row, n_cols, inner, n_segments, SEGMENT, SEGMENTS_BLOCK, FRAME)
            # Read this segment again rather than keep it in registers through the loop above.
            dy, y, dy_edge, y_edge = _load_dy_y(
                dy_ptr, y_ptr, row, row + 1, segment, cols, n_cols, inner, SEGMENT, FRAME
            )
        dot = tl.sum(part_dot, axis=0)
        edge = dy_edge
        if FRAME:
            edge = _softmax_gradient(dy_edge, y_edge, dot)
        _store_segment(dx_ptr, row, segment, cols, n_cols, inner, _softmax_gradient(dy, y, dot), edge, SEGMENT, FRAME)
        dy, y, dy_edge, y_edge = dy_next, y_next, dy_edge_next, y_edge_next
