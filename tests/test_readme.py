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


def test_readme_patch_example_runs():
    """The HuggingFace example, as written: a tiny Llama patched, its loss through tk's fused linear
    cross entropy, and a backward (on the CPU: tk's kernels through the interpreter)."""
    import pytest

    pytest.importorskip("transformers")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    example = next(b for b in blocks if "ops.patch(model)" in b)
    scope: dict = {}
    exec(compile(example, str(README), "exec"), scope)
    model, loss = scope["model"], scope["loss"]
    assert torch.isfinite(loss) and model.lm_head.weight.grad is not None
    assert type(model.model.norm).__name__.startswith("Tk")  # patched
