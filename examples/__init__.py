"""Models built from tk ops, checked against the same models built from PyTorch ops."""
