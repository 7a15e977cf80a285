"""Hypothesis strategies shared by the plan property tests (tests/ops/test_*_plans.py): the calls a
plan must take, drawn without launching anything."""

import dataclasses

from hypothesis import strategies as st

from ops.runtime import H100, INTERPRETER

# Widths real models use (hidden sizes; GPT-2's, Llama's, Qwen2's, Gemma's vocabularies), odd ones near them.
NAMED_WIDTHS = [768, 1024, 2048, 2560, 3584, 4096, 5120, 8192, 11008, 14336, 32000, 50257, 51200, 128256]
NAMED_WIDTHS += [151936, 256000]
NAMED_WIDTHS += [1001, 3001, 4095, 5001, 7001, 8191, 20001, 70001]

# An H100, the same with few SMs (held grids that fit few rows) and with one (grids too small to hold some
# rows at all), an Ampere part (no Gluon), the interpreter.
DEVICES = st.sampled_from(
    [
        H100,
        dataclasses.replace(H100, sm_count=8),
        dataclasses.replace(H100, sm_count=1),
        dataclasses.replace(H100, capability=(8, 0)),
        INTERPRETER,
    ]
)

# (input, output) element sizes: a 16-bit input may come with a float32 output or gradient.
ELEMENT_SIZES = st.sampled_from([(2, 2), (2, 4), (4, 4), (8, 8)])


def row_lengths(least: int, most_log2: int, segments: tuple[int, ...]):
    """Row lengths from `least`: small ones, any up to 2^most_log2, each side of the powers of two
    (the blocks), the named widths, and a few columns short of whole `segments` (held rows whose
    frame passes into one more segment)."""
    edges = [1 << k for k in range(4, most_log2 + 1)]
    return st.one_of(
        st.integers(least, 300),
        st.integers(max(least, 1), 1 << most_log2),
        st.sampled_from(edges).flatmap(lambda b: st.sampled_from([b - 1, b, b + 1, b + 7])),
        st.sampled_from(NAMED_WIDTHS),
        st.tuples(st.integers(5, 400), st.sampled_from(segments), st.integers(1, 7)).map(lambda t: t[0] * t[1] - t[2]),
    )


def row_counts(least: int):
    """Row counts from `least`: few, many, and the odd token counts of real batches."""
    return st.one_of(
        st.integers(least, 64), st.integers(max(least, 1), 1 << 16), st.sampled_from([1000, 2047, 2048, 4095, 8191])
    )
