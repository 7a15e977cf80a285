"""Layer norm and RMS norm, one plan for both: ``torch.ops.tk.layer_norm``, ``torch.ops.tk.rms_norm`` and their backwards.

RMS norm is layer norm without the centering, so both ops launch the same
kernel bodies (CENTERED on or off) through the same plan and launches.  A
call goes checks -> plan -> launch -> runtime:

    layer_norm.py, rms_norm.py   each op's checks, forward/backward entry points and registration
    checks.py                    the argument checks both share
    plan.py                      the math, the designs, Tuning (every constant) and the plan of a call
    launch.py                    runs a plan: allocates, launches, decides nothing
    kernels.py                   Triton kernels that read rows from memory
    held.py                      the backward for long rows held on chip across programs
    spec.py                      what the comparison harness reads

docs/ops/norms.md maps the designs and which shapes take which.
"""

from . import layer_norm, rms_norm, spec  # noqa: F401  (register the ops and their specs)

__all__ = ["layer_norm", "rms_norm"]
