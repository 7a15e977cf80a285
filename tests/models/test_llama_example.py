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
