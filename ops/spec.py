"""What the comparison harness (and the tests) know about an op: its ``OpSpec``.

A leaf module: it imports torch only, so the harness, the tests and the op
files can all read it without importing one another.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class OpSpec:
    """A declarative description of one op, read by ``compare`` and the tests.

    Shapes are op-specific tuples (numel for gelu, (rows, cols) for softmax,
    (M, N, K) for matmul); everything the harness does with one goes through
    the callables below, so the harness needs no op-specific code.
    """

    name: str
    tk: Callable  # the hand-written op: tk(*inputs)
    reference: Callable  # the PyTorch op it competes with, same call
    make_inputs: Callable[[tuple, torch.dtype, torch.device], tuple]
    bytes_moved: Callable[[tuple, torch.dtype], int]  # the fewest bytes a kernel must move
    flops: Callable[[tuple, torch.dtype], int]
    tolerance: dict[torch.dtype, float]  # max relative norm error vs float64
    shapes: dict[str, list[tuple]]  # default sweep per device type ("cuda", "cpu")
    describe: Callable[[tuple], str] = lambda shape: "x".join(map(str, shape))
    dtypes: tuple = (torch.bfloat16, torch.float16, torch.float32)
    bound: str = "memory"  # "memory": judged against copy bandwidth; "compute": against cuBLAS
    unfused: dict[str, Callable] = field(default_factory=dict)  # hand-written compositions
    # tk's own kernels under another plan than the op's choice, by name: what one design choice is worth, timed
    # beside tk (matmul's row-major program order against its grouped one).
    tk_plans: dict[str, Callable] = field(default_factory=dict)
    # The configurations of tk's kernel for `--configs` (block sizes, warps, stages: its autotuner's candidates),
    # given one case's inputs: label -> a call of tk under that configuration, taking the same inputs (and not
    # keeping these: the harness makes them again).  None: the op has no configurable kernel.
    configs: Callable[..., dict[str, Callable]] | None = None
    peers: dict[str, Callable[[], Callable]] = field(default_factory=dict)  # name -> loader (may raise ImportError)
    peer_devices: tuple[str, ...] = ("cuda",)  # where the peers run (Liger's are Triton kernels for CUDA only)
    reference64: Callable | None = None  # float64 reference if `reference` cannot take float64 inputs
    compile_tk: bool = False  # also time torch.compile of `tk` (a model built from tk ops)
    kernel_modules: tuple[str, ...] = ()  # where the hand-written kernels live, if not in tk's own module
    call: str = ""  # what is compared, in words, where the name does not say it (an op's arguments)


SPECS: dict[str, OpSpec] = {}


def register_spec(spec: OpSpec) -> OpSpec:
    if spec.name in SPECS:
        raise ValueError(f"op {spec.name!r} is registered twice")
    SPECS[spec.name] = spec
    return spec


def get_spec(name: str) -> OpSpec:
    """The spec of op ``name``; a clear error listing the known ops otherwise."""
    try:
        return SPECS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; known ops: {', '.join(sorted(SPECS))}") from None


# Helpers the elementwise ops' specs share.


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def describe_numel(shape) -> str:
    (n,) = shape
    return f"n=2^{math.log2(n):.0f}" if n & (n - 1) == 0 else f"n={n}"


# Max relative norm error against float64, per dtype, for ops whose only
# error is the final rounding (and the reference's own roundings).
ROUNDING_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float64: 1e-7}

# Flat sizes from 4096 elements (launch-bound) to 2**28 (0.5 to 1 GiB a tensor).
ELEMENTWISE_SHAPES = {
    "cuda": [(1 << k,) for k in (12, 16, 20, 22, 24, 26, 28)],
    "cpu": [(1000,), (65_537,), (1 << 20,)],
}


# --------------------------------------------------------------------------
# Real shapes: where each op sits in the models people run.  An op's spec lists, under
# shapes["real"], the shapes of its calls in these models (norms over the hidden size,
# softmax and cross entropy over the vocabulary and attention rows, GEMMs as projections
# and LM heads with M = tokens); the default GPU sweep runs them after the op's own.
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """The sizes of one model that its ops' shapes come from (from the model's published config)."""

    name: str
    hidden: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int


MODELS = {
    m.name: m
    for m in (
        ModelShape("gpt2", 768, 3072, 50257, 12, 12, 64),
        ModelShape("gpt2-large", 1280, 5120, 50257, 20, 20, 64),
        ModelShape("gpt2-xl", 1600, 6400, 50257, 25, 25, 64),
        ModelShape("llama2-7b", 4096, 11008, 32000, 32, 32, 128),
        ModelShape("llama2-13b", 5120, 13824, 32000, 40, 40, 128),
        ModelShape("llama3-8b", 4096, 14336, 128256, 32, 8, 128),
        ModelShape("llama3-70b", 8192, 28672, 128256, 64, 8, 128),
        ModelShape("mistral-7b", 4096, 14336, 32768, 32, 8, 128),
        ModelShape("qwen2-7b", 3584, 18944, 152064, 28, 4, 128),
        ModelShape("qwen2-1.5b", 1536, 8960, 151936, 12, 2, 128),
        ModelShape("gemma-2b", 2048, 16384, 256000, 8, 1, 256),
        ModelShape("phi-2", 2560, 10240, 51200, 32, 32, 80),
        ModelShape("phi-3-mini", 3072, 8192, 32064, 32, 32, 96),
    )
}

# Tokens in a batch (batch x sequence): none a multiple of 128, as a last partial batch or a
# packed sequence gives; the sweep's own shapes are all powers of two or multiples of 128.
TOKENS = (1000, 4095, 8191)


def model(name: str) -> ModelShape:
    return MODELS[name]
