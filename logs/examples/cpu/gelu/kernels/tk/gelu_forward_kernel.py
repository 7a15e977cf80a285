@triton.jit
def gelu_forward_kernel(x_ptr, y_ptr, n_elements, APPROXIMATE_TANH: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    offsets = block_offsets(BLOCK_SIZE)
    # Whole blocks apart from the tail, so that any n gets 16-byte accesses (ops/blocks/elementwise.py).
    if in_whole_block(n_elements, BLOCK_SIZE):
        _forward_block(x_ptr, y_ptr, offsets, offsets < whole_blocks_end(n_elements, BLOCK_SIZE), APPROXIMATE_TANH)
    else:  # the last block hangs past the end
        _forward_block(x_ptr, y_ptr, offsets, offsets < n_elements, APPROXIMATE_TANH)
