"""A tiny HuggingFace Llama with tk's ops (``ops.patch``), under PyTorch's parallelisms: tensor parallel with
sequence-parallel norms (``parallelize_module``) and FSDP2 (``fully_shard``); the CPU tests (gloo) and the
multi-GPU ones (NCCL) train it against the same model on one device.

Under tensor parallelism the patched modules meet DTensors: the RMS norms run on sequence shards
(SequenceParallel: x is Shard(1), the weight Replicate), and the loss, tk.linear_cross_entropy, gets
the final norm's output and lm_head's vocabulary-sharded weight (ColwiseParallel).  The projections'
outputs are local tensors (the plan's default), so SwiGLU and the rotary embedding run on each rank's
heads and columns as plain tensors.  The residual stream stays a DTensor (the embedding's and the
row-parallel projections' outputs are kept as DTensors), so HF's code reads the whole sequence's
length from it.  The loss's targets come in as ``shift_labels``, under tensor parallelism DTensors
sharded along the sequence as the hidden states are (the patched loss would build plain ones from
``labels``, and a DTensor op takes no plain tensor beside DTensors; see docs/distributed.md): the
flattened rows of both are then sharded alike, and a "sum" loss (``num_items_in_batch`` given, as
HF's Trainer gives it) keeps them sharded, with no gather.
"""

from __future__ import annotations

import time

import torch

IGNORE_INDEX = -100


def config(**changes):
    """A Llama of 2 layers, 4 heads (2 for keys and values), hidden 32, vocabulary 64: every dim a tensor
    parallel plan shards divides by 2."""
    from transformers import LlamaConfig

    settings = dict(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, attention_dropout=0.0, tie_word_embeddings=False,
        attn_implementation="sdpa",
    )  # fmt: skip
    return LlamaConfig(**{**settings, **changes})


PATCH_KINDS = ("norm", "mlp", "rope", "loss")  # what ops.patch swaps into a Llama


def patched_llama(seed: int = 0, device="cpu", dtype=torch.float32, kinds=PATCH_KINDS, **changes):
    """The Llama with its random weights (from `seed`), tk's ops of `kinds` swapped in, in training mode."""
    from transformers import LlamaForCausalLM

    import ops

    torch.manual_seed(seed)
    model = LlamaForCausalLM(config(**changes)).to(device=device, dtype=dtype)
    report = ops.patch(model, **{kind: kind in kinds for kind in PATCH_KINDS})
    assert all(report.counts()[kind] for kind in kinds), report
    return model.train()


def batches(
    steps: int, batch: int, seq: int, vocab: int = 64, device="cpu", seed: int = 1, summed: bool = False
) -> list[dict]:
    """`steps` batches, each the model's keyword arguments: input_ids, labels (a few ignored) and
    shift_labels (the labels shifted by one, as HF's loss shifts them); `summed`: num_items_in_batch
    too (the loss is then a sum over the batch divided by it, not a mean)."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        ids = torch.randint(0, vocab, (batch, seq), generator=generator)
        labels = ids.clone()
        labels[:, ::5] = IGNORE_INDEX
        shifted = torch.nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[:, 1:].contiguous()
        out.append({"input_ids": ids.to(device), "labels": labels.to(device), "shift_labels": shifted.to(device)})
        if summed:
            out[-1]["num_items_in_batch"] = int((shifted != IGNORE_INDEX).sum())
    return out


def sequence_sharded_targets(data: list[dict], mesh) -> list[dict]:
    """The batches with shift_labels as DTensors sharded along the sequence, as the hidden states are
    (the patched loss meets DTensors under tensor parallelism, and a DTensor op takes no plain tensor
    beside them)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    return [{**b, "shift_labels": distribute_tensor(b["shift_labels"], mesh, [Shard(1)])} for b in data]


def tensor_parallel_plan(model) -> dict:
    """torchtitan's Llama plan: the embedding's output and every norm sequence-sharded (Shard(1)), the
    attention and MLP column- then row-parallel, lm_head's weight sharded over the vocabulary."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    plan = {
        "model.embed_tokens": RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False
        ),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    for i in range(len(model.model.layers)):
        layer = f"model.layers.{i}."
        plan.update({
            layer + "input_layernorm": SequenceParallel(),
            layer + "self_attn": PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": Shard(1)},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
            ),
            **{layer + f"self_attn.{p}_proj": ColwiseParallel() for p in "qkv"},
            layer + "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
            layer + "post_attention_layernorm": SequenceParallel(),
            layer + "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            layer + "mlp.gate_proj": ColwiseParallel(),
            layer + "mlp.up_proj": ColwiseParallel(),
            layer + "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
        })  # fmt: skip
    return plan


def tensor_parallel(model, mesh):
    """`model` under the tensor parallel plan on `mesh` (in place)."""
    from torch.distributed.tensor.parallel import parallelize_module

    return parallelize_module(model, mesh, tensor_parallel_plan(model))


def fully_sharded(model, mesh, **options):
    """`model` under FSDP2 (in place): each decoder layer a unit, then the whole model."""
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)
    return model


def _full(t):
    """A DTensor's whole value (a plain tensor as it is)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def train(model, data, lr: float = 0.05, compile: bool = False) -> dict:
    """SGD steps of `model` on `data`: each step's loss, the gradients of the first step (whole, by
    parameter name), each step's time in seconds (the first step compiles), and the placements of the
    loss (None for a plain tensor)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    forward = torch.compile(model) if compile else model
    losses, times, grads, placements = [], [], None, None
    for batch in data:
        start = time.perf_counter()
        loss = forward(**batch).loss
        loss.backward()
        if grads is None:
            grads = {n: _full(p.grad).detach().clone() for n, p in model.named_parameters()}
            placements = getattr(loss, "placements", None)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(_full(loss.detach()).item())
        if batch["input_ids"].is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return {"losses": losses, "grads": grads, "times": times, "placements": placements}
