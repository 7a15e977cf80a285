"""The tk-patched Llama trained on two GPUs of one host (NCCL) as on one: FSDP2 and tensor parallel (TP=2, sequence-
parallel norms), eager and under torch.compile, in bfloat16.  Each rank also trains the same model on its own GPU
alone (the reference); the losses of every step and the first step's gradients must agree within bfloat16's
rounding, and each test prints the step time and the peak memory per GPU of both.

Run on a machine with two GPUs or more (nvidia-h100-x2), without pytest-xdist:

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        python -m pytest -m gpu tests/distributed/test_multi_gpu.py -s

(the workers set those three themselves too: no NVLink multicast).  The model is Llama-shaped and small enough
for a few minutes: 4 layers, hidden 1024, 16 heads (8 for keys and values), vocabulary 32000.  Tensor parallel
runs take one long sequence (batch 1): flattening a sequence-sharded batch of several into the loss's rows gives
a strided shard, which torch.compile did not trace on torch 2.13 (docs/distributed.md); FSDP2 gives each GPU
half of a batch of 4.
"""

from __future__ import annotations

import statistics

import pytest
import torch
from llama_parallel import batches, fully_sharded, patched_llama, sequence_sharded_targets, tensor_parallel, train
from ranks import ranks_fixture

# gpu: run under pytest -m gpu (skipped without CUDA); gpus(2): needs two GPUs of one host, skipped with fewer.
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.gpus(2),
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs of one host"),
]

SHAPE = dict(
    hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=8,
    vocab_size=32000, max_position_embeddings=2048,
)  # fmt: skip
STEPS = 5
BATCH = {"fsdp2": (4, 512), "tp": (1, 2048)}  # (batch, sequence)
LOSS_RTOL = 2e-2  # bfloat16: 8 bits of mantissa, sums in another order on two GPUs
GRAD_RTOL = 5e-2  # each gradient's relative error, as a whole (its norm)


pytest.importorskip("transformers")
ranks = ranks_fixture(2, "nccl")


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _peak_gb(device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30


def _run(rank, parallelism: str, compile: bool, alone: bool) -> dict:
    """One training run on this rank's GPU: the whole batch alone, or its share under `parallelism`."""
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(rank.device)
    batch, seq = BATCH[parallelism]
    data = batches(STEPS, batch=batch, seq=seq, vocab=SHAPE["vocab_size"], device=rank.device)
    model = patched_llama(device=rank.device, dtype=torch.bfloat16, **SHAPE)
    if alone:
        pass
    elif parallelism == "fsdp2":
        model = fully_sharded(model, rank.mesh)
        data = [{k: v[rank.index :: rank.size] for k, v in b.items()} for b in data]
    else:
        model = tensor_parallel(model, rank.mesh)
        data = sequence_sharded_targets(data, rank.mesh)
    result = train(model, data, compile=compile)
    result["step_s"] = statistics.median(result["times"][1:])  # the first step compiles (or warms up)
    result["peak_gb"] = _peak_gb(rank.device)
    result["placements"] = None if result["placements"] is None else str(result["placements"])
    return result


def check_against_one_gpu(rank, parallelism: str, compile: bool) -> dict:
    """Both runs on this rank; the relative error of each first-step gradient of the shared run against
    the run alone (compared here, not sent: they are hundreds of MB)."""
    alone = _run(rank, parallelism, compile, alone=True)
    kept = {n: g.cpu() for n, g in alone.pop("grads").items()}  # off the GPU: not in the next run's peak
    shared = _run(rank, parallelism, compile, alone=False)
    errors = {n: _relative_error(shared["grads"][n].cpu(), g) for n, g in kept.items()}
    del shared["grads"]
    return {"alone": alone, "shared": shared, "errors": errors}


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compile"])
@pytest.mark.parametrize("parallelism", ["fsdp2", "tp"])
def test_two_gpus_train_as_one(ranks, parallelism, compile, capsys):
    label = f"{parallelism} {'compile' if compile else 'eager'}"
    try:
        results = ranks.run(check_against_one_gpu, parallelism, compile)
    except Exception as error:  # shown at once: a run cut off before pytest's summary still says why
        with capsys.disabled():
            print(f"\n{label}: failed: {type(error).__name__}: {str(error)[-2000:]}")
        raise
    alone = results[0]["alone"]
    if parallelism == "fsdp2":  # each rank's loss is its half's mean; their mean is the batch's (equal halves)
        losses = [sum(r["shared"]["losses"][i] for r in results) / len(results) for i in range(STEPS)]
    else:
        losses = results[0]["shared"]["losses"]
    # The figures first: a run cut off, or failing below, still shows them.
    errors = results[0]["errors"]
    worst = max(errors, key=errors.get)
    shared = [r["shared"] for r in results]
    peaks = ", ".join(f"{s['peak_gb']:.2f}" for s in shared)
    rounded = [[round(v, 4) for v in run] for run in (losses, alone["losses"])]
    with capsys.disabled():
        print(
            f"\n{label}: step {shared[0]['step_s'] * 1e3:.1f} ms on each "
            f"of 2 GPUs (one GPU: {alone['step_s'] * 1e3:.1f} ms); peak memory per GPU {peaks} GiB (one GPU: "
            f"{alone['peak_gb']:.2f}); losses {rounded[0]} vs {rounded[1]} on one GPU; "
            f"worst gradient {worst} {errors[worst]:.2e}"
        )
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(alone["losses"]), rtol=LOSS_RTOL, atol=0)
    assert errors[worst] < GRAD_RTOL, (worst, errors[worst])
