"""Math the kernels share."""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # exp(a) = exp2(a * log2(e))


@triton.jit
def exp(x):
    """exp(x).  In float32 (and narrower) as exp2(x * log2 e), which a GPU runs as one
    `ex2.approx.ftz`: tl.exp multiplies by the same constant but asks for `ex2.approx`
    without ftz, which costs three more instructions an element (a compare and two
    predicated multiplies) to return results under 2^-126 as subnormals.  Those come out
    0 here, every other result with the same bits.  float64 keeps tl.exp."""
    if x.dtype == tl.float64:  # resolved at compile time
        y = tl.exp(x)
    else:
        y = tl.math.exp2(x * LOG2E)
    return y


@triton.jit
def finite_or_zero(row_max):
    """The shift for exp() in an online sum of exps (softmax, logsumexp).  While every value seen
    is -inf, shift by 0 instead: exp(-inf - -inf) would be NaN and poison the sum."""
    return tl.where(row_max == -float("inf"), 0.0, row_max)
