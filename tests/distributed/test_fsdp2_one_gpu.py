"""FSDP2 under torch.compile on one GPU: a one-rank NCCL mesh, so that a single-GPU machine can run it.

On two H100s (torch 2.11) the compiled FSDP2 run of the tk-patched Llama failed while AOTAutograd traced
its joint graph: "Output 0 of AsStridedBackward0 is a view and is being modified inplace. This view was
created inside a custom Function (or because an input was returned as-is)", raised at the copy that
applies an input's mutation.  FSDP2 eager and TP=2 compiled matched one GPU there, and the same compiled
FSDP2 run passes on the CPU (gloo, two processes; tests/distributed/test_tensor_parallel.py, on torch
2.11 and 2.13).  FSDP2 hands each unit's inputs through a custom Function on any world size, so one rank
should meet it too.  Each case swaps in one kind of tk op (and all of them), to name the op whose
compiled path mutates what FSDP2 handed it.
"""

from __future__ import annotations

import pytest
import torch
from llama_parallel import PATCH_KINDS, batches, fully_sharded, patched_llama, train
from ranks import ranks_fixture

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.timeout(900),  # two compiled training runs a case, beside the rest of the GPU suite
]

SHAPE = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
             vocab_size=4096, max_position_embeddings=512)  # fmt: skip
STEPS = 3


pytest.importorskip("transformers")
ranks = ranks_fixture(1, "nccl")


def check_compiled_fsdp2(rank, kinds: tuple) -> dict:
    """The losses of the compiled FSDP2 run (a one-rank mesh) and of the same model compiled alone."""
    data = batches(STEPS, batch=2, seq=256, vocab=SHAPE["vocab_size"], device=rank.device)
    runs = {}
    for name in ("alone", "fsdp2"):
        torch._dynamo.reset()
        model = patched_llama(device=rank.device, dtype=torch.bfloat16, kinds=kinds, **SHAPE)
        if name == "fsdp2":
            model = fully_sharded(model, rank.mesh)
        runs[name] = train(model, data, compile=True)["losses"]
    return runs


@pytest.mark.parametrize("kinds", [PATCH_KINDS, *((kind,) for kind in PATCH_KINDS)], ids=["all", *PATCH_KINDS])
def test_compiled_fsdp2_on_one_gpu_trains_as_the_model_alone(ranks, kinds):
    (runs,) = ranks.run(check_compiled_fsdp2, kinds)
    torch.testing.assert_close(torch.tensor(runs["fsdp2"]), torch.tensor(runs["alone"]), rtol=2e-2, atol=0)
