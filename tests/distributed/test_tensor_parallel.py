"""A tiny HuggingFace Llama with tk's ops, trained on two CPU processes (gloo) as on one: tensor parallel with
sequence-parallel norms, and FSDP2.  The same model, data and steps on one process give the reference; the
losses of every step and the first step's gradients must match (float32).  tests/distributed/llama_parallel.py
builds the model and the plans; the ranks are started once for the module.
"""

from __future__ import annotations

import pytest
import torch
from llama_parallel import batches, fully_sharded, patched_llama, sequence_sharded_targets, tensor_parallel, train
from ranks import ranks_fixture

pytest.importorskip("transformers")

STEPS = 2


ranks = ranks_fixture(2)


def _compare(one: dict, many: dict, rtol: float, atol: float) -> None:
    torch.testing.assert_close(torch.tensor(many["losses"]), torch.tensor(one["losses"]), rtol=rtol, atol=atol)
    assert many["grads"].keys() == one["grads"].keys()
    for name, grad in one["grads"].items():
        torch.testing.assert_close(many["grads"][name], grad, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


def _sequence_sharded_norms(model) -> list:
    """Forward hooks that record what each patched RMS norm returned: (type, placements)."""
    seen = []

    def record(module, args, output):
        seen.append((type(output).__name__, tuple(getattr(output, "placements", ()))))

    for name, module in model.named_modules():
        if type(module).__name__ == "TkLlamaRMSNorm":
            module.register_forward_hook(record)
    return seen


def check_tensor_parallel(rank, summed: bool, labels_only: bool = False) -> dict:
    """TP=2 with sequence-parallel norms against one process: losses, gradients, what the norms returned
    and the loss's placements.  `labels_only`: the batches carry labels alone, as a training loop passes
    them, and the patched loss places its shifted targets as the hidden states are; otherwise they carry
    shift_labels already sharded."""
    from torch.distributed.tensor import Shard

    model = patched_llama()
    data = batches(STEPS, batch=2, seq=8, summed=summed)
    one = train(patched_llama(), data)
    parallel = tensor_parallel(model, rank.mesh)
    seen = _sequence_sharded_norms(parallel)
    if labels_only:
        parallel_data = [{k: v for k, v in b.items() if k != "shift_labels"} for b in data]
    else:
        parallel_data = sequence_sharded_targets(data, rank.mesh)
    many = train(parallel, parallel_data)
    _compare(one, many, rtol=1e-5, atol=1e-5)
    assert seen and all(s == ("DTensor", (Shard(1),)) for s in seen), seen
    return {"losses": many["losses"], "norms": len(seen), "loss": many["placements"]}


def check_fully_sharded(rank, compile: bool) -> dict:
    """FSDP2 over both ranks, each with its own half of the batch, against one process on the whole batch."""
    torch._dynamo.reset()
    model = patched_llama()
    data = batches(STEPS, batch=2, seq=8)
    one = train(patched_llama(), data)
    halves = [{k: v[rank.index :: 2] for k, v in batch.items()} for batch in data]
    many = train(fully_sharded(model, rank.mesh), halves, compile=compile)
    # Each rank's loss is its half's mean; FSDP2 averages the gradients over the ranks.  With the same
    # number of kept labels in each half, the mean of the halves' losses is the whole batch's.
    many["losses"] = [torch.tensor(loss) for loss in many["losses"]]
    return {"one": one, "many": many}


@pytest.mark.parametrize("labels_only", [False, True], ids=["shift_labels", "labels"])
@pytest.mark.parametrize("summed", [False, True], ids=["mean", "sum"])
def test_tensor_parallel_training_matches_one_process(ranks, summed, labels_only):
    from torch.distributed.tensor import Replicate

    results = ranks.run(check_tensor_parallel, summed, labels_only)
    assert results[0] == results[1]
    assert results[0]["norms"] == 5 * STEPS  # two norms a layer and the final one, each step
    # lm_head's weight is vocabulary-sharded: the loss is vocabulary-parallel (the final hidden states'
    # rows gathered, the weight kept sharded; tests/distributed/test_vocab_parallel.py), replicated.
    assert results[0]["loss"] == (Replicate(),)


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compile"])
def test_fully_sharded_training_matches_one_process(ranks, compile):
    results = ranks.run(check_fully_sharded, compile)
    one = results[0]["one"]
    many = {
        "losses": [float((a + b) / 2) for a, b in zip(results[0]["many"]["losses"], results[1]["many"]["losses"])],
        "grads": results[0]["many"]["grads"],
    }
    assert results[0]["many"]["grads"].keys() == results[1]["many"]["grads"].keys()
    _compare(one, many, rtol=1e-5, atol=1e-5)
