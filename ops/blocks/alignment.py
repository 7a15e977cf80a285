"""Telling Triton that rows start aligned when their length is not a multiple of 16.

Triton specializes each integer argument on whether it is a multiple of 16,
and its alignment analysis knows nothing else about it.  A kernel that finds
row r at r * n_cols therefore knows that every row starts on a 16-element
boundary when n_cols is a multiple of 16; for any other n_cols it assumes
nothing and loads and stores one element at a time.  A row of 1000 bfloat16
columns (8 x 125) then moves 2 bytes an access where 16 would do (the PTX has
``ld.global.b16`` where ``ld.global.v4.b32`` fits), and the row masks
(``cols < n_cols``) split the same way.

The remedy costs one integer op a program: the launcher passes COL_MULTIPLE,
the largest power of two up to 16 that divides the row length, and the kernel
restates the length with ``known_multiple``: n // COL_MULTIPLE * COL_MULTIPLE,
the same number, in a form the analysis reads as a multiple of COL_MULTIPLE
(a product with a constant).  ``tl.multiple_of`` does not do this: it marks
tensors, and leaves a scalar argument as it was (Triton 3.6 and 3.9).
"""

import triton
import triton.language as tl

_MOST = 16  # what Triton's own specialization already tells for multiples of 16


def column_multiple(*lengths: int) -> int:
    """The largest power of two, at most 16, that divides every one of `lengths` (row lengths, row strides)."""
    bits = _MOST
    for n in lengths:
        bits |= int(n)  # the lowest bit set in any of them, or in 16, is the answer
    return bits & -bits


@triton.jit
def known_multiple(n, MULTIPLE: tl.constexpr):
    """n, known to the compiler as a multiple of MULTIPLE (which must divide n)."""
    if MULTIPLE > 1:
        n = n // MULTIPLE * MULTIPLE
    return n
