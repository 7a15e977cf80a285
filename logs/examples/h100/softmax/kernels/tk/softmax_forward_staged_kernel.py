@gluon.jit
def softmax_forward_staged_kernel(
    x_ptr, y_ptr, words_ptr, n_rows, n_cols, n_segments, rows_at_once, max_spins,
    SEGMENT: gl.constexpr, SEGMENTS_BLOCK: gl.constexpr, STAGES: gl.constexpr, VEC: gl.constexpr,
    OVERLAPPED: gl.constexpr,
):
    """Rows held on chip across programs, the next STAGES - 1 rounds' segments staged in shared memory.

    Program p owns segment p % n_segments of rows p // n_segments + k * rows_at_once.  A round:
    wait for its segment's copy, publish (max, sum) of the segment as one word, wait for the row's
    other words, combine, write y = exp(x - segment max) times one factor."""
    WARPS: gl.constexpr = gl.num_warps()
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])  # VEC elements = 16 bytes a thread
    small: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    stages = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [STAGES, SEGMENT], gl.SwizzledSharedLayout(1, 1, 1, [0]))

    pid = gl.program_id(0)
    segment = pid % n_segments
    first_row = pid // n_segments
    cols = segment * SEGMENT + gl.arange(0, SEGMENT, layout=layout)
    for early in gl.static_range(STAGES - 1):
        _copy_segment_in(stages.index(early), x_ptr, first_row + early * rows_at_once, n_rows, n_cols, cols)
    _wait_for_fill(OVERLAPPED)
    for round in range(0, gl.cdiv(n_rows - first_row, rows_at_once)):
        row = first_row + round * rows_at_once
        # The stage refilled now was read into registers a round ago, by every warp once all pass here.
        _cta_barrier()
        ahead = round + STAGES - 1
        _copy_segment_in(stages.index(ahead % STAGES), x_ptr, first_row + ahead * rows_at_once, n_rows, n_cols, cols)
        cp.wait_group(STAGES - 1)  # every copy but the STAGES - 1 newest has landed: this round's
        seg_max, numerator = _max_exp(_as_float32(stages.index(round % STAGES).load(layout), cols, n_cols, False))
        word = _pack_word(seg_max, gl.sum(numerator, axis=0))
        _publish_word(words_ptr, row.to(gl.int64) * n_segments + segment, word)
        words, published = _row_words(words_ptr, row, n_segments, max_spins, SEGMENTS_BLOCK, small)
        if published:
            part_max, part_sum = _unpack_word(words)
        else:  # waited too long (fewer programs resident than the grid): compute the row's partials here
            part_max, part_sum = _partials_here(x_ptr, row, n_cols, n_segments, SEGMENT, SEGMENTS_BLOCK, layout, small)
            # Read this segment again rather than keep its numerators in registers through that loop.
            x = gl.load(x_ptr + row.to(gl.int64) * n_cols + cols, mask=cols < n_cols, other=0.0)
            seg_max, numerator = _max_exp(_as_float32(x, cols, n_cols, False))
        row_max, row_sum = _combine(part_max, part_sum)
        y = numerator * _factor(seg_max, row_max, row_sum)
        gl.store(y_ptr + row.to(gl.int64) * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=cols < n_cols)
