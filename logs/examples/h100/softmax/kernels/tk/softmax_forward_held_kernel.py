@triton.jit
def softmax_forward_held_kernel(
    x_ptr, y_ptr, words_ptr, n_rows, n_cols, inner, n_segments, rows_at_once, max_spins,
    SEGMENT: tl.constexpr, SEGMENTS_BLOCK: tl.constexpr, LOAD_NEXT: tl.constexpr, COL_MULTIPLE: tl.constexpr,
    OVERLAPPED: tl.constexpr, FRAME: tl.constexpr,
):
    """Rows held on chip across programs: publish (max, sum) of the segment, wait, write y
    (the plan's PUBLISH_THEN_WAIT).

    The segment's exp(x - segment max), computed for its sum, is kept rather
    than x: after the wait y is that times one factor, exp(segment max - row
    max) / row sum, with no second exp over the segment.  LOAD_NEXT: when the
    next round's segment is loaded (plan.py, Tuning.load_before_partial_segments), to stream in while this
    round works and waits: "before_partial" or "during_wait".  FRAME: rows framed at a 16-byte
    boundary (see above)."""
    n_cols = known_multiple(n_cols, COL_MULTIPLE)
    segment, cols, first_row = program_segment(n_segments, SEGMENT)
    x, edge = _load_x(x_ptr, first_row, n_rows, segment, cols, n_cols, inner, SEGMENT, FRAME)
    wait_for_fill(OVERLAPPED)
    for round in range(0, tl.cdiv(n_rows - first_row, rows_at_once)):
        row = first_row + round * rows_at_once
        next_row = row + rows_at_once
        if LOAD_NEXT == "before_partial":
            x_next, edge_next = _load_x(x_ptr, next_row, n_rows, segment, cols, n_cols, inner, SEGMENT, FRAME)
        seg_max, numerator, edge = _segment_max_exp(x, edge, FRAME)
        publish(words_ptr, partial_at(row, segment, n_segments), pack(seg_max, _numerators_sum(numerator, edge, FRAME)))
        if LOAD_NEXT == "during_wait":
            x_next, edge_next = _load_x(x_ptr, next_row, n_rows, segment, cols, n_cols, inner, SEGMENT, FRAME)
        _write_held_segment(x_ptr, y_ptr, words_ptr, row, segment, cols, n_cols, inner, n_segments, max_spins, seg_max,
                            numerator, edge, SEGMENT, SEGMENTS_BLOCK, FRAME)  # fmt: skip
        x, edge = x_next, edge_next
