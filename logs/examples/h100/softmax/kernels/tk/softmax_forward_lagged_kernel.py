@triton.jit
def softmax_forward_lagged_kernel(
    x_ptr, y_ptr, words_ptr, n_rows, n_cols, inner, n_segments, rows_at_once, max_spins,
    SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr, COL_MULTIPLE: tl.constexpr, OVERLAPPED: tl.constexpr,
    FRAME: tl.constexpr,
):
    """Rows held on chip across programs, publishing a round ahead: the next
    row's (max, sum) goes out before the wait for this row's words.

    The wait for a row is the wait for its slowest program; here each
    program has a whole round of its own work (the next segment's loads,
    exp and sum) between publishing a row and needing that row's words, so
    the words are usually there when it looks.  The price is two segments'
    numerators in registers, which float32 affords on segments of 4096
    columns (16-bit rows: see plan.py's Tuning)."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    segment, cols, first_row = program_segment(n_segments, SEGMENT)
    seg_max, numerator, edge = _publish_max_sum(x_ptr, words_ptr, first_row, n_rows, segment, cols, n_cols, inner,
                                                n_segments, OVERLAPPED, SEGMENT, FRAME)  # fmt: skip
    for round in range(0, tl.cdiv(n_rows - first_row, rows_at_once)):
        row = first_row + round * rows_at_once
        next_row = row + rows_at_once
        next_max, next_numerator, next_edge = _publish_max_sum(
            x_ptr, words_ptr, next_row, n_rows, segment, cols, n_cols, inner, n_segments, False, SEGMENT, FRAME
        )
        _write_held_segment(x_ptr, y_ptr, words_ptr, row, segment, cols, n_cols, inner, n_segments, max_spins, seg_max,
                            numerator, edge, SEGMENT, SEGMENTS_BLOCK, FRAME)  # fmt: skip
        seg_max, numerator, edge = next_max, next_numerator, next_edge
