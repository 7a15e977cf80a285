"""What the launch rules need to know about a device, asked once per device.

Rules pick constants by kind: "cuda" for the GPU, "cpu" for everything else
(Triton's interpreter on CPU tensors; also meta and fake tensors, which
never launch but go through the same rules while being traced).
"""

import functools

import torch


def kind(device: torch.device) -> str:
    """Which constants apply: "cuda", or "cpu" (the interpreter; also meta and fake CPU tensors)."""
    return "cuda" if device.type == "cuda" else "cpu"


@functools.cache
def sm_count(index: int | None) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count
