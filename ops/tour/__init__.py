"""The guided tour: the elementwise ops, each adding one idea to the one before.

Start at copy.py, then square.py, add.py and rgb_to_grayscale.py (then
ops/swiglu.py, a production op).  They are registered as ``torch.ops.tk.*`` like
every op, and tested like every op, but nothing imports them: the launch rule
they use lives in ops/blocks/elementwise.py.

gelu_cuda.py is the rung below Triton: ops/gelu.py's GELU in CUDA C++, one
thread per element.  It is no tk op and registers nothing: the gelu reports
time it as their ``cuda`` variant, built on first use where nvcc is.
"""

from . import add, copy, rgb_to_grayscale, square  # noqa: F401  (each registers its op and spec)
