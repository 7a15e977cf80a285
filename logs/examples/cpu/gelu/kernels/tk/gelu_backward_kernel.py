@triton.jit
def gelu_backward_kernel(
    grad_ptr, x_ptr, dx_ptr, n_elements, APPROXIMATE_TANH: tl.constexpr, BLOCK_SIZE: tl.constexpr
):
    offsets = block_offsets(BLOCK_SIZE)
    if in_whole_block(n_elements, BLOCK_SIZE):  # see gelu_forward_kernel
        whole = offsets < whole_blocks_end(n_elements, BLOCK_SIZE)
        _backward_block(grad_ptr, x_ptr, dx_ptr, offsets, whole, APPROXIMATE_TANH)
    else:
        _backward_block(grad_ptr, x_ptr, dx_ptr, offsets, offsets < n_elements, APPROXIMATE_TANH)
