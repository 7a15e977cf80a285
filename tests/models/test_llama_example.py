"""examples/llama.py: the training step the harness times, for each variant, on the same weights."""

import pytest
import torch

pytest.importorskip("transformers")

from examples import llama  # noqa: E402  (needs transformers)


def test_the_tk_step_matches_pytorchs_on_the_same_weights():
    shape = llama.SPEC.shapes["cpu"][0]
    inputs = llama.make_inputs(shape, torch.float32, "cpu")
    expected = llama.train_step("torch")(*inputs)
    got = llama.train_step("tk")(*inputs)
    assert len(got) == len(expected) == 1 + len(inputs[3:])  # the loss, then a gradient per parameter
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    # the labels' padded tail is ignored: the loss is over the tokens before it
    _, ids, labels, *_ = inputs
    assert (labels == llama.IGNORE_INDEX).any() and not (labels == llama.IGNORE_INDEX).all()


def test_the_step_is_the_harness_spec_of_a_model():
    from compare.models import model_specs

    spec = model_specs()["llama"]
    assert spec.compile_tk and "liger" in spec.peers and spec.bound == "compute"
    assert spec.describe(spec.shapes["cuda"][0]) == "B4 T2048 H2048 L4 heads16/8 I5632 V128256"


def test_a_patch_is_put_back_and_brought_in_again_without_harming_its_own_classes():
    """Liger's patch, put back and set again around its step (examples/llama.py): names it changes in the
    module and in the module's own classes move both ways; a class the patch brings in keeps its methods
    (putting back its names once deleted Liger's RMS norm forward, and the next model failed)."""
    import types

    from examples.llama import changes_of, put_back

    class Norm:
        def forward(self):
            return "torch"

    class PatchNorm:  # the patch's own class
        def forward(self):
            return "patch"

    module = types.ModuleType("modeling_fake")
    module.Norm, module.helper = Norm, (lambda: "torch")

    def patch():
        module.Norm = PatchNorm  # a class of its own in the module's name
        module.helper = lambda: "patch"
        Norm.forward = lambda self: "patched torch"  # a method of the module's own class
        module.extra = "added"

    for _ in range(2):  # one model size, then the next, each patching anew
        changed = changes_of(patch, module)
        put_back(changed, 0)
        assert module.Norm is Norm and module.helper() == "torch" and Norm().forward() == "torch"
        assert not hasattr(module, "extra")
        assert PatchNorm().forward() == "patch"  # the patch's own class untouched
        put_back(changed, 1)
        assert module.Norm is PatchNorm and module.helper() == "patch" and Norm().forward() == "patched torch"
        assert module.extra == "added" and PatchNorm().forward() == "patch"
        put_back(changed, 0)
