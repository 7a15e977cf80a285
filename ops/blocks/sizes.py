"""Grid and block arithmetic on the host, shared by every op's plan."""


# triton.cdiv and triton.next_power_of_2 are constexpr functions that unwrap their arguments
# on every call, about 3 µs each: several per launch for a small op.
def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


def nearest_power_of_2(n: int) -> int:
    """The power of two nearest n in ratio (1 for n <= 1): 1792 -> 2048, 1280 -> 1024; a tie (n times
    sqrt(2) a power of two, never an integer) cannot happen."""
    upper = next_power_of_2(n)
    return upper // 2 if n > 1 and 2 * n * n < upper * upper else upper


def warps_for(elements: int, per_thread: int = 16) -> int:
    """num_warps for a block of `elements`: about `per_thread` a thread, 1 to 32 warps."""
    return min(max(elements // (32 * per_thread), 1), 32)


def rows_in_tile(n_rows, row_block: int, tile: int) -> int:
    """How many whole rows of `row_block` lanes a program stacks to fill about `tile` elements:
    a power of two (a tl.arange length), at least 1, and no more rows than there are, rounded up."""
    return next_power_of_2(at_most(n_rows, max(1, tile // row_block)))


def at_most(size, bound: int) -> int:
    """min(size, bound) as a Python int.

    Under torch.compile with dynamic shapes a size is symbolic, while block
    sizes and program counts must be plain ints.  Comparing the size with
    the bound (one guard) keeps a large dynamic size dynamic; only a size
    below the bound, which then decides the launch, is specialized."""
    return bound if size >= bound else int(size)
