"""The variants of one op: everything that computes it, built from its spec.

Nothing here knows an op by name: the list comes from the spec's fields
(``reference``, ``unfused``, ``tk``, ``tk_plans``, ``peers``), so a new op in ``ops/`` is
compared without touching this package.

Kinds, in the order they appear in reports:

* ``eager``          the PyTorch reference (``spec.reference``);
* ``unfused``        hand-written compositions (``spec.unfused``);
* ``compile``        ``torch.compile`` of the reference and of each composition,
                     default mode;
* ``max-autotune``   the same with ``mode="max-autotune-no-cudagraphs"`` (opt-in);
* ``tk``             the hand-written Triton op;
* ``tk-plan``        its kernels under another plan than the op's choice (``spec.tk_plans``): what one
                     design choice is worth (matmul's row-major program order), a lesson beside tk, not a rival;
* ``compile-tk``     ``torch.compile`` of ``spec.tk``, where the spec asks for it
                     (a model built from tk ops: what Inductor adds around them);
* ``peer``           another library's op, when it imports and runs on the device (``spec.peers``, ``spec.peer_devices``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

KINDS = ("eager", "unfused", "compile", "max-autotune", "tk", "tk-plan", "compile-tk", "peer")
TK_KINDS = ("tk", "tk-plan", "compile-tk")  # the kinds that run tk's kernels: in Triton's interpreter on a CPU


class VariantSkipped(Exception):
    """A peer that cannot run here (a library not installed, a CUDA build without nvcc, a GPU one on the CPU): the variant is left out, not failed."""


@dataclass(frozen=True)
class Variant:
    name: str
    kind: str
    source: Callable  # the eager function this variant runs or compiles
    compile_mode: str | None = None  # set for the torch.compile kinds
    peer_loader: Callable[[], Callable] | None = None
    peer_devices: tuple[str, ...] = ()  # the device types a peer runs on

    @property
    def compiled(self) -> bool:
        return self.compile_mode is not None

    def interpreted(self, device: torch.device) -> bool:
        """tk on a CPU runs in Triton's interpreter: its time is no performance figure."""
        return self.kind in TK_KINDS and device.type != "cuda"

    def build(self, device: torch.device) -> Callable:
        """The callable to time.  Compiled variants get a fresh ``torch.compile``
        wrapper on every call, so that each shape compiles for itself."""
        if self.kind == "peer":
            if device.type not in self.peer_devices:  # before importing a library that could not run here
                raise VariantSkipped(f"runs on {', '.join(self.peer_devices)} only, not on {device.type}")
            try:
                return self.peer_loader()
            except ImportError as e:
                raise VariantSkipped(f"unavailable ({e})") from e
        if not self.compiled:
            return self.source
        options = None
        if device.type == "cpu":
            # Makes Inductor's C++ kernels visible to torch.profiler, which counts them.
            options = {"cpp.enable_kernel_profile": True}
        mode = None if self.compile_mode == "default" else self.compile_mode
        return torch.compile(self.source, mode=mode, dynamic=False, options=options)


def _compiled_name(prefix: str, eager_name: str) -> str:
    """compile + eager-unfused -> compile-unfused; other names get a suffix."""
    if eager_name.startswith("eager-"):
        return prefix + eager_name[len("eager") :]
    return f"{prefix}-{eager_name}"


def all_variants(spec, max_autotune: bool = False) -> list[Variant]:
    """Every variant the spec allows, in report order."""
    out = [Variant("eager", "eager", spec.reference)]
    out += [Variant(name, "unfused", fn) for name, fn in spec.unfused.items()]
    sources = [("eager", spec.reference), *spec.unfused.items()]
    for prefix, kind, mode in (("compile", "compile", "default"), ("compile-max-autotune", "max-autotune", "max-autotune-no-cudagraphs")):
        if kind == "max-autotune" and not max_autotune:
            continue
        for eager_name, fn in sources:
            name = prefix if eager_name == "eager" else _compiled_name(prefix, eager_name)
            out.append(Variant(name, kind, fn, compile_mode=mode))
    out.append(Variant("tk", "tk", spec.tk))
    out += [Variant(name, "tk-plan", fn) for name, fn in spec.tk_plans.items()]
    if spec.compile_tk:
        out.append(Variant("compile-tk", "compile-tk", spec.tk, compile_mode="default"))
    out += [Variant(name, "peer", None, peer_loader=loader, peer_devices=spec.peer_devices) for name, loader in spec.peers.items()]
    return out


def select(variants: list[Variant], wanted: list[str] | None) -> list[Variant]:
    """Keep the variants named in ``wanted``, by name or by kind (``compile`` keeps
    every default-mode compiled variant).  Unknown names raise ValueError."""
    if not wanted:
        return variants
    names = {v.name for v in variants}
    unknown = [w for w in wanted if w not in names and w not in KINDS]
    if unknown:
        raise ValueError(
            f"unknown variant(s) {', '.join(unknown)}; this op has: {', '.join(v.name for v in variants)}"
            f" (or a kind: {', '.join(KINDS)})"
        )
    return [v for v in variants if v.name in wanted or v.kind in wanted]
