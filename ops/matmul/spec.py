"""What the comparison harness reads about matmul."""

from dataclasses import replace

import torch
import triton

from ..runtime import ByKind, run_direct
from ..spec import OpSpec, model, register_spec
from .kernels import CONFIGS, TMA_CONFIGS
from .launch import run
from .op import forward
from .plan import POINTER, TMA, TUNING, Plan, Tile, Tuning, choose_plan, describe

# --------------------------------------------------------------------------
# What the comparison harness reads.
# --------------------------------------------------------------------------


# A shape (M, N, K) times a @ b with b (K, N) contiguous; (M, N, K, LINEAR) times it as a model's nn.Linear
# does, b = W.t() of a weight W (N, K): column-major, its columns K apart (an LM head's b has rows of V).
LINEAR = "linear"


def _make_inputs(shape, dtype, device):
    M, N, K = shape[:3]
    a = torch.randn(M, K, dtype=dtype, device=device)
    if shape[3:] == (LINEAR,):
        return a, torch.randn(N, K, dtype=dtype, device=device).t()
    return a, torch.randn(K, N, dtype=dtype, device=device)


def _bytes(shape, dtype):
    M, N, K = shape[:3]
    return (M * K + K * N + M * N) * torch.empty((), dtype=dtype).element_size()


def _describe(shape) -> str:
    """M{M}xN{N}xK{K}, and `-linear` for b = W.t() (a model's projection)."""
    return "M{}xN{}xK{}".format(*shape[:3]) + "".join(f"-{layout}" for layout in shape[3:])


def _real_shapes() -> list[tuple]:
    """(M, N, K) of real models' GEMMs (ops/spec.py), M = tokens: the attention's output projection, the
    MLP's up and down projections, LM heads (large N, small K), each as the model's nn.Linear runs it (LINEAR:
    b = W.t()); GPT-2's LM head also with b (K, N) contiguous, whose rows of 50257 start on 2-byte
    boundaries; and odd sizes with nothing in common."""
    llama, gpt2, qwen = model("llama3-8b"), model("gpt2"), model("qwen2-7b")
    return [
        (4095, llama.hidden, llama.hidden, LINEAR), (8191, llama.intermediate, llama.hidden, LINEAR),
        (8191, llama.hidden, llama.intermediate, LINEAR), (1000, qwen.intermediate, qwen.hidden, LINEAR),
        (8191, gpt2.vocab, gpt2.hidden, LINEAR), (8191, gpt2.vocab, gpt2.hidden),
        (4095, llama.vocab, llama.hidden, LINEAR), (8191, qwen.vocab, qwen.hidden, LINEAR),
        (1000, 1000, 1000), (4000, 5000, 3000), (1000, 3 * gpt2.hidden, gpt2.hidden, LINEAR),
    ]  # fmt: skip


REAL_SHAPES = _real_shapes()

# Programs in row-major order (GROUP_M = 1), timed beside tk's grouped order: the L2 lesson of Triton's matmul
# tutorial (op.py's docstring).  The same kernels and tile rule; only the order of the tiles differs.
ROW_MAJOR = replace(TUNING, group_m=1)
# C stored through pointers unless its rows are 128-byte aligned (Tuning.c_store_alignment): on N = 5000 (rows
# 10000 bytes apart, 16- but not 128-aligned), is TMA's store or the pointer store faster?
C_POINTERS_UNLESS_128 = replace(TUNING, c_store_alignment=128)
# A new C contiguous where its rows are not whole 16-byte runs, stored through pointers (GPT-2's LM head,
# N = 50257): as before Tuning.pad_c_rows.
CONTIGUOUS_C = replace(TUNING, pad_c_rows=ByKind(cuda=False, cpu=False))
# b read as it is described, its rows an odd multiple of 16 bytes apart (N = 5000: 10000 bytes), not from a copy
# 128 bytes apart (Tuning.b_row_bytes).
B_AS_DESCRIBED = replace(TUNING, realign_min=1 << 62)
# No aligned copy of an operand no descriptor describes (Tuning.operand_copy_min): the pointer kernel instead,
# as before the copies (GPT-2's head with b (K, N) row-major, 8191x50257x768: 0.26x cuBLAS then).
NO_OPERAND_COPIES = replace(TUNING, operand_copy_min=1 << 62, interpreter_operand_copy_min=1 << 62)


def _planned(tuning: Tuning):
    """tk.matmul planned with `tuning`, launched as an eager call of the registered op launches."""
    return lambda a, b: run_direct(forward, (a, b), {"tuning": tuning})


# --configs: the autotuner's candidates for the design a call takes, each with its tile fixed.
CANDIDATES = {POINTER: CONFIGS, TMA: TMA_CONFIGS}


def config_label(config: triton.Config) -> str:
    """BLOCK_M x BLOCK_N x BLOCK_K, warps, stages, and the TMA kernel's flags where set: `128x256x64 w8 s3 halves`."""
    meta = config.kwargs
    flags = [name for name, key in (("halves", "STORE_HALVES"), ("ws", "WARP_SPECIALIZE")) if meta.get(key)]
    tile = f"{meta['BLOCK_M']}x{meta['BLOCK_N']}x{meta['BLOCK_K']} w{config.num_warps} s{config.num_stages}"
    return " ".join([tile, *flags])


def with_config(plan: Plan, config: triton.Config) -> Plan:
    """`plan` with `config`'s tile fixed instead of left to the autotuner (the TMA kernel: its flags too)."""
    meta = config.kwargs
    tile = Tile(meta["BLOCK_M"], meta["BLOCK_N"], meta["BLOCK_K"], warps=config.num_warps, stages=config.num_stages)
    if plan.design == TMA:
        return replace(plan, tile=tile, store_halves=meta["STORE_HALVES"], warp_specialize=meta["WARP_SPECIALIZE"])
    return replace(plan, tile=tile)


def _configs(a: torch.Tensor, b: torch.Tensor) -> dict:
    """label -> a @ b under each candidate of the design the call's plan takes (none for an empty C).  On a CPU
    the interpreter runs each tile, ignoring warps and stages."""
    plan = choose_plan(describe(a, b))
    return {config_label(c): _run_planned(with_config(plan, c)) for c in CANDIDATES.get(plan.design, [])}


def _run_planned(plan: Plan):
    return lambda a, b: run_direct(run, (plan, a, b), {})


register_spec(
    OpSpec(
        name="matmul",
        tk=lambda a, b: torch.ops.tk.matmul(a, b),
        tk_plans={"tk-row-major": _planned(ROW_MAJOR), "tk-c-pointers": _planned(C_POINTERS_UNLESS_128),
                  "tk-no-copies": _planned(NO_OPERAND_COPIES), "tk-contiguous-c": _planned(CONTIGUOUS_C),
                  "tk-b-as-described": _planned(B_AS_DESCRIBED)},  # fmt: skip
        configs=_configs,
        reference=torch.matmul,
        make_inputs=_make_inputs,
        bytes_moved=_bytes,
        flops=lambda shape, dtype: 2 * shape[0] * shape[1] * shape[2],
        tolerance={torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float64: 1e-12},
        shapes={
            # 2048^3: the smallest problem the TMA kernel takes, where a call's host time shows.
            "cuda": [
                (16, 4096, 4096), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
                (8192, 14336, 4096),
            ],
            "cpu": [(64, 48, 80), (130, 66, 100)],
            "real": REAL_SHAPES,
        },
        dtypes=(torch.bfloat16, torch.float16),
        bound="compute",
        describe=_describe,
    )
)
