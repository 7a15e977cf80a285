"""The ``tk`` namespace's library fragment, and whether the native lane serves CUDA calls (decided once)."""

import torch

from . import native

NAMESPACE = "tk"
LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
NATIVE_CUDA = native.enabled_for_cuda()
