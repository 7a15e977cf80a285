"""The size rules of ops/blocks/sizes.py that plans share."""

import math

from ops.blocks.sizes import nearest_power_of_2, next_power_of_2


def test_nearest_power_of_2_is_nearest_in_ratio():
    """Against the power of two of the rounded base-2 logarithm, for every n up to 2**14; the chunk
    rule's cases named."""
    for n in range(1, 1 << 14):
        want = 1 << round(math.log2(n))
        assert nearest_power_of_2(n) == want, n
        assert nearest_power_of_2(n) in (next_power_of_2(n), next_power_of_2(n) // 2)
    assert [nearest_power_of_2(n) for n in (0, 1, 1024, 1280, 1448, 1449, 1792, 2048)] == [1, 1, 1024, 1024, 1024, 2048, 2048, 2048]
