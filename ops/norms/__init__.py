"""Layer norm and RMS norm over one engine: ``torch.ops.tk.layer_norm``, ``torch.ops.tk.rms_norm`` and their backwards.

RMS norm is layer norm without the centering, so both ops launch the same
kernel bodies (CENTERED on or off) through the same engine:

    layer_norm.py, rms_norm.py   each op's registration and argument handling
    checks.py                    the argument checks both share
    engine.py                    the designs, and which rows take which (both ops)
    kernels.py                   Triton kernels that read rows from memory
    held.py                      the backward for long rows held on chip across programs
    spec.py                      what the comparison harness reads
"""

from . import layer_norm, rms_norm, spec  # noqa: F401  (register the ops and their specs)

__all__ = ["layer_norm", "rms_norm"]
