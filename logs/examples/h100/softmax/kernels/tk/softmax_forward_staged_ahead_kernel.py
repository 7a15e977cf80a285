@gluon.jit
def softmax_forward_staged_ahead_kernel(
    x_ptr, y_ptr, words_ptr, n_rows, n_cols, n_segments, rows_at_once, max_spins,
    SEGMENT: gl.constexpr, SEGMENTS_BLOCK: gl.constexpr, STAGES: gl.constexpr, VEC: gl.constexpr,
    OVERLAPPED: gl.constexpr, FULL: gl.constexpr = False,
):
    """Rows held on chip across programs, publishing a round ahead; segments in shared memory.

    Program p owns segment p % n_segments of rows p // n_segments + k * rows_at_once, as above.
    Round r: publish row r + 1's (max, sum) from its staged segment, wait for row r's words (published
    a round ago), write row r's y from its staged segment, and refill that stage with row r + STAGES."""
    WARPS: gl.constexpr = gl.num_warps()
    CHUNK: gl.constexpr = VEC * 32 * WARPS  # one 16-byte piece a thread
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    small: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    stages = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [STAGES, SEGMENT], gl.SwizzledSharedLayout(1, 1, 1, [0]))

    pid = gl.program_id(0)
    segment = pid % n_segments
    first_row = pid // n_segments  # below n_rows: the grid has at most n_rows rows at once
    cols = segment * SEGMENT + gl.arange(0, SEGMENT, layout=layout)
    for early in gl.static_range(STAGES):
        _copy_segment_in(stages.index(early), x_ptr, first_row + early * rows_at_once, n_rows, n_cols, cols)
    cp.wait_group(STAGES - 1)  # the first row's copy has landed
    seg_max, seg_sum = _segment_max_sum(stages.index(0), x_ptr, segment, n_cols, SEGMENT, CHUNK, layout, FULL)
    _wait_for_fill(OVERLAPPED)
    _publish_word(words_ptr, first_row.to(gl.int64) * n_segments + segment, _pack_word(seg_max, seg_sum))
    for round in range(0, gl.cdiv(n_rows - first_row, rows_at_once)):
        row = first_row + round * rows_at_once
        next_row = row + rows_at_once
        cp.wait_group(STAGES - 2)  # the next row's copy has landed; later ones may be in flight
        next_stage = stages.index((round + 1) % STAGES)
        next_max, next_sum = _segment_max_sum(next_stage, x_ptr, segment, n_cols, SEGMENT, CHUNK, layout, FULL)
        if next_row < n_rows:
            _publish_word(words_ptr, next_row.to(gl.int64) * n_segments + segment, _pack_word(next_max, next_sum))
        words, published = _row_words(words_ptr, row, n_segments, max_spins, SEGMENTS_BLOCK, small)
        if published:
            part_max, part_sum = _unpack_word(words)
        else:  # waited too long: compute the row's partials here
            part_max, part_sum = _chunked_partials_here(x_ptr, row, n_cols, n_segments, SEGMENT, SEGMENTS_BLOCK, CHUNK,
                                                        layout, small, FULL)  # fmt: skip
        row_max, row_sum = _combine(part_max, part_sum)
        factor = _factor(seg_max, row_max, row_sum)
        stage = stages.index(round % STAGES)
        y_row = y_ptr + row.to(gl.int64) * n_cols
        for c in gl.static_range(SEGMENT // CHUNK):
            y = _exp(_read_chunk(stage, x_ptr, segment, c, n_cols, SEGMENT, CHUNK, layout, FULL) - _shift(seg_max)) * factor
            chunk_cols = _chunk_cols(segment, c, SEGMENT, CHUNK, layout)
            gl.store(y_row + chunk_cols, y.to(y_ptr.dtype.element_ty), mask=chunk_cols < n_cols)
        _cta_barrier()  # every warp has read this stage: refill it
        _copy_segment_in(stage, x_ptr, first_row + (round + STAGES) * rows_at_once, n_rows, n_cols, cols)
        seg_max = next_max
