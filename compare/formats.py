"""Numbers as people read them, in every page the harness writes.

Each formatter takes ``None`` (a value that does not exist: a failed
variant's time, a speed-up without a baseline) and gives an empty cell.
"""

from __future__ import annotations

import math


def fmt_time(ms: float | None) -> str:
    """Milliseconds as µs, ms or s, with about three significant digits."""
    if ms is None:
        return ""
    if ms < 1:
        return f"{ms * 1e3:.1f} µs" if ms < 0.1 else f"{ms * 1e3:.0f} µs"
    if ms < 1000:
        return f"{ms:.3g} ms" if ms < 100 else f"{ms:.0f} ms"
    return f"{ms / 1e3:.2f} s"


def fmt_number(x: float | None, digits: int = 3) -> str:
    """``digits`` significant digits; whole numbers, with thousands separators, from 10^(digits-1) up."""
    if x is None:
        return ""
    if x == 0 or abs(x) >= 10 ** (digits - 1):
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def fmt_ratio(x: float | None) -> str:
    """A speed-up: 1.25x."""
    return "" if x is None else f"{x:.2f}x"


def fmt_share(x: float | None) -> str:
    """A fraction as a whole percentage: 0.873 -> 87%."""
    return "" if x is None else f"{100 * x:.0f}%"


def fmt_error(x: float | None) -> str:
    """A relative error, in scientific notation (inf where the output was not finite)."""
    if x is None:
        return ""
    return "inf" if math.isinf(x) else f"{x:.1e}"


def fmt_bytes(n: int) -> str:
    """A size in decimal units: 8 kB, 268 MB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def fmt_megabytes(n: int) -> str:
    """A size in MB: whole from 1 MB up, two decimals below."""
    return f"{n / 1e6:,.0f}" if n >= 1e6 else f"{n / 1e6:.2f}"


def fmt_microseconds(ms: float | None) -> str:
    """Milliseconds as µs with two decimals (the summary's CUDA-graph times)."""
    return "" if ms is None else f"{1e3 * ms:.2f}"


def fmt_text(value) -> str:
    """Any other value (a count, a name) as its plain text."""
    return "" if value is None else str(value)


def device_label(environment: dict) -> str:
    """The device a report ran on, as its pages name it."""
    return environment.get("gpu") or f"CPU ({environment.get('cpu')})"
