"""The README's model example runs as written (on the CPU when there is no GPU)."""

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_model_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    example = next(b for b in blocks if "class Block" in b)
    if not torch.cuda.is_available():
        example = example.replace('.cuda()', '').replace('device="cuda"', 'device="cpu"')
    scope: dict = {}
    exec(compile(example, str(README), "exec"), scope)
    y, model = scope["y"], scope["model"]
    assert y.shape == (64, 512) and y.dtype == torch.half
    assert torch.allclose(y.float().sum(-1), torch.ones(64), atol=1e-2)  # softmax rows
    assert model.w.grad is not None and torch.isfinite(model.w.grad).all()
