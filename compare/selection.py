"""What a command line selects: op names, dtypes and shapes, parsed from their text (every command's).

A leaf of the harness: ``cli`` (``python -m compare``), ``ir`` (``python -m compare.ir``),
``overhead`` and ``ncu`` read their flags through it, so none of them imports another's command.
"""

from __future__ import annotations

import torch

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "uint8": torch.uint8,  # images (rgb_to_grayscale)
}
ALIASES = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp64": "float64", "double": "float64"}
DTYPES_HELP = (
    "comma-separated dtypes (float32, float16, bfloat16, float64, uint8 where the op takes it;"
    " aliases fp32, fp16, half, bf16, fp64, double)"
)


class UsageError(Exception):
    pass


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def valid_dtypes(spec) -> list[str]:
    return [str(d).replace("torch.", "") for d in DTYPES.values() if d in spec.tolerance]


def parse_dtypes(text: str, spec) -> list:
    out = []
    for name in _split(text):
        name = ALIASES.get(name.lower(), name.lower())
        if name not in DTYPES or DTYPES[name] not in spec.tolerance:
            valid = ", ".join(valid_dtypes(spec))
            raise UsageError(f"unknown dtype {name!r} for op {spec.name}; valid dtypes: {valid}")
        out.append(DTYPES[name])
    if not out:
        raise UsageError(f"no dtype given; valid dtypes for {spec.name}: {', '.join(valid_dtypes(spec))}")
    return out


# Named shape sets for --shapes: the op's own sweep, its calls in real models (ops/spec.py), or both (the default).
SHAPE_SETS = ("all", "sweep", "real")


def default_shapes(spec, device, which: str = "all") -> list[tuple]:
    """The op's shapes for `device`: its own sweep, then on a GPU its real-model shapes (which="all"); or one set."""
    sweep = list(spec.shapes.get(device.type) or spec.shapes.get("cpu") or [])
    real = list(spec.shapes.get("real", [])) if device.type == "cuda" else []
    if which == "real":
        return real or sweep
    return sweep if which == "sweep" else list(dict.fromkeys(sweep + real))


def parse_shapes(text: str, spec) -> list[tuple]:
    """Shapes from `text`: dims joined by 'x'.  A dim that is a word (matmul's `linear`: b = W.t()) is taken
    where the op's own shapes use that word in that place."""
    known = [shape for shapes in spec.shapes.values() for shape in shapes]
    words = {(i, d) for shape in known for i, d in enumerate(shape) if isinstance(d, str)}
    forms = {tuple(isinstance(d, str) for d in shape) for shape in known}  # where the words sit, by rank
    out = []
    for item in _split(text):
        dims = item.lower().split("x")
        try:
            shape = tuple(d if (i, d) in words else int(d) for i, d in enumerate(dims))
        except ValueError:
            raise UsageError(f"bad shape {item!r}: dims are integers joined by 'x', e.g. 4096x1024") from None
        if forms and tuple(isinstance(d, str) for d in shape) not in forms:
            raise UsageError(f"shape {item!r} of op {spec.name} needs {len(known[0])} dim(s), like {_examples(known)}")
        if any(isinstance(d, int) and d <= 0 for d in shape):
            raise UsageError(f"bad shape {item!r}: dims must be positive")
        out.append(shape)
    return out


def _examples(known: list[tuple]) -> str:
    """One shape of each form the op takes: `4096x1024`, or `64x48x80 or 8191x50257x768xlinear`."""
    first = {}
    for shape in known:
        first.setdefault(tuple(isinstance(d, str) for d in shape), "x".join(map(str, shape)))
    return " or ".join(first.values())


def default_dtypes(spec, device: torch.device) -> list:
    if device.type == "cuda":
        return list(spec.dtypes)
    # One dtype on CPU, so that a fresh machine finishes in about a minute.
    return [torch.float32] if torch.float32 in spec.tolerance else [spec.dtypes[0]]


def op_names(text: str, known: dict, what: str) -> list[str]:
    """The op names ``--op`` gives: names of ``known``, or 'all' (``known``'s ops); UsageError naming the valid ones."""
    import ops

    names = sorted(ops.SPECS) if text == "all" else _split(text)
    if not names:
        raise UsageError(f"no op given; {what}")
    for name in names:
        if name not in known:
            raise UsageError(f"unknown op {name!r}; {what}")
    return names
