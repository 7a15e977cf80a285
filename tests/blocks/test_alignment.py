"""Rows whose length is not a multiple of 16 still get 16-byte loads and stores.

The row kernels are compiled here for an H100 (sm_90) without a GPU: Triton
lowers them to PTX on the CPU, and the PTX says how wide each global access is.
A 16-bit row of 1000 columns (8 x 125) is 16-byte aligned at every row start;
without COL_MULTIPLE the compiler cannot know that and moves 2 bytes an access.
"""

import re

import pytest
import triton

from ops.cross_entropy import kernels as cross_entropy
from ops.norms import kernels as layer_norm, kernels as rms_norm
from ops.softmax import kernels as softmax
from ops.blocks.alignment import column_multiple, frame_run

try:
    from triton.backends.compiler import GPUTarget
except ImportError:  # pragma: no cover - an older Triton
    GPUTarget = None

H100 = (90, 32)  # compute capability, warp size


@pytest.mark.parametrize(
    "lengths, multiple",
    [((1000,), 8), ((1024,), 16), ((100,), 4), ((4098,), 2), ((7,), 1), ((0,), 16), ((1000, 1024), 8), ((1000, 250), 2)],
)
def test_column_multiple_is_the_largest_power_of_two_up_to_16_dividing_every_length(lengths, multiple):
    assert column_multiple(*lengths) == multiple


def _ptx(kernel, pointers: dict, constexprs: dict, num_warps: int) -> str:
    """The PTX of `kernel` for an H100: `pointers` maps each pointer argument to its element
    type (all 16-byte aligned, as PyTorch allocates); floats are fp32, other arguments i32."""
    if GPUTarget is None:
        pytest.skip("this Triton has no GPUTarget")
    signature, attrs = {}, {}
    for index, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = "*" + pointers[name]
            attrs[(index,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32" if name in ("eps", "label_smoothing") else "i32"
    source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", *H100), options={"num_warps": num_warps})
    except (RuntimeError, FileNotFoundError) as error:  # no ptxas, or no CUDA backend in this Triton
        pytest.skip(f"cannot compile for sm_90 here: {error}")
    return compiled.asm["ptx"]


def _global_accesses(ptx: str) -> list[str]:
    return re.findall(r"\b(?:ld|st)\.global(?:\.[a-z0-9]+)*", ptx)


_BF16_ROW = {"x_ptr": "bf16", "y_ptr": "bf16", "w_ptr": "bf16", "b_ptr": "bf16", "dy_ptr": "bf16", "dx_ptr": "bf16"}
_FP32_SCRATCH = {"dw_partial_ptr": "fp32", "db_partial_ptr": "fp32", "stats_ptr": "fp32"}
_NORM_FORWARD = {"HAS_WEIGHT": True, "HAS_BIAS": True, "BLOCK_M": 4, "BLOCK_N": 1024, "AFFINE_FIRST": True, "PIVOTED": True, "PLAIN": False}
_NORM_BACKWARD = {"HAS_WEIGHT": True, "WEIGHT_GRAD": True, "BIAS_GRAD": True, "BLOCK_M": 4, "BLOCK_N": 1024}
_CROSS_ENTROPY = {"logits_ptr": "bf16", "target_ptr": "i64", "loss_ptr": "fp32", "lse_ptr": "fp32", "ticket_ptr": "i32"}
_CROSS_ENTROPY_BACKWARD = {**_CROSS_ENTROPY, "scale_ptr": "fp32", "part_kept_ptr": "i32", "dlogits_ptr": "bf16"}

# (kernel, pointer types, constexprs but COL_MULTIPLE, warps, 2-byte loads that are not a row's): a launch of each
# on 16-bit rows of 1000 columns.
ROW_KERNELS = {
    "layer_norm forward": (layer_norm.layer_norm_forward_kernel, _BF16_ROW, _NORM_FORWARD, 8, 2),  # the 4 rows' pivots
    "layer_norm forward, w and b after": (
        layer_norm.layer_norm_forward_kernel, _BF16_ROW, {**_NORM_FORWARD, "AFFINE_FIRST": False}, 8, 2,
    ),
    "layer_norm forward, not pivoted": (
        layer_norm.layer_norm_forward_kernel, _BF16_ROW, {**_NORM_FORWARD, "PIVOTED": False}, 8, 0,
    ),
    "layer_norm forward, plain mean": (
        layer_norm.layer_norm_forward_kernel, _BF16_ROW, {**_NORM_FORWARD, "PIVOTED": False, "PLAIN": True}, 8, 0,
    ),
    "layer_norm backward": (
        layer_norm.layer_norm_backward_kernel, {**_BF16_ROW, **_FP32_SCRATCH}, {**_NORM_BACKWARD, "LOAD_AHEAD": True}, 16, 0,
    ),
    "rms_norm backward, long rows": (
        rms_norm.rms_norm_backward_columns_kernel, {**_BF16_ROW, **_FP32_SCRATCH},
        {"HAS_WEIGHT": True, "WEIGHT_GRAD": True, "BIAS_GRAD": False, "BLOCK_N": 4096, "FRAME": 0}, 8, 0,
    ),
    "softmax forward": (softmax.softmax_forward_kernel, _BF16_ROW, {"inner": 1, "BLOCK_M": 4, "BLOCK_N": 1024}, 8, 0),
    "softmax backward": (
        softmax.softmax_backward_kernel, _BF16_ROW, {"inner": 1, "BLOCK_M": 4, "BLOCK_N": 1024}, 8, 0,
    ),
    "cross_entropy forward": (
        cross_entropy.cross_entropy_forward_kernel, _CROSS_ENTROPY,
        {"SMOOTHING": False, "BLOCK_M": 1, "BLOCK_SIZE": 1024, "PEEL": 0, "ZERO_TICKET": True}, 4, 1,  # the target's logit
    ),
    "cross_entropy backward": (
        cross_entropy.cross_entropy_backward_kernel, _CROSS_ENTROPY_BACKWARD,
        {"BLOCK_M": 1, "BLOCK_SIZE": 1024, "PEEL": 0, "MEAN_PARTS": 128}, 2, 0,
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    "n_cols, inner, sizes, run",
    [
        ((50257, 1, (2,), 8)),  # GPT-2's vocabulary in bf16: rows at every 2-byte offset
        ((50257, 1, (2, 4), 8)),  # a bf16 x with a float32 y: the run of the narrowest tensor
        ((50257, 1, (4,), 4)),
        ((1001, 1, (4,), 4)),
        ((50264, 1, (2,), 0)),  # 8 bf16 a 16 bytes: every row starts on a boundary
        ((50260, 1, (2, 4), 8)),  # bf16 rows of 100520 bytes are off a boundary; float32 rows (201040) are not
        ((50257, 3, (2,), 0)),  # rows along another dim: their elements are not contiguous
        ((15, 1, (2,), 0)),  # shorter than two runs: its ends would be one run
        ((16, 1, (1,), 0)),
    ],
)
def test_frame_run_is_the_narrowest_run_where_rows_start_off_boundaries(n_cols, inner, sizes, run):
    assert frame_run(n_cols, inner, *sizes) == run


@pytest.mark.parametrize("name", ROW_KERNELS)
def test_rows_of_1000_16bit_columns_move_16_bytes_an_access(name):
    kernel, pointers, constexprs, warps, single_loads = ROW_KERNELS[name]
    accesses = _global_accesses(_ptx(kernel, pointers, {**constexprs, "COL_MULTIPLE": column_multiple(1000)}, warps))
    assert "ld.global.v4.b32" in accesses, sorted(set(accesses))  # 4 x 32 bits: 8 bfloat16 values
    assert accesses.count("ld.global.b16") == single_loads, sorted(set(accesses))


def test_the_plain_mean_divides_rounded():
    """Layer norm's plain mean (norms' _standardize_plain) is exact on a constant row only if its division
    rounds: Triton's float32 `/` is the approximate div.full.f32 on CUDA (perf-notes version 45), and the
    interpreter divides exactly, so only the PTX can tell.  The mean (of the sum, or of the rescaled sum of a
    row past float32's range) has one division, rounded; rstd's var / n is the approximate one."""
    kernel, pointers, constexprs, warps, _ = ROW_KERNELS["layer_norm forward, plain mean"]
    ptx = _ptx(kernel, pointers, {**constexprs, "COL_MULTIPLE": column_multiple(1000)}, warps)
    assert set(re.findall(r"div\.[a-z]+\.f32", ptx)) == {"div.rn.f32", "div.full.f32"}


def test_without_the_multiple_the_same_rows_move_2_bytes_an_access():
    """What COL_MULTIPLE fixes, so that the test above can tell."""
    kernel, pointers, constexprs, warps, _ = ROW_KERNELS["layer_norm forward"]
    accesses = _global_accesses(_ptx(kernel, pointers, {**constexprs, "COL_MULTIPLE": 1}, warps))
    assert "ld.global.b16" in accesses and "ld.global.v4.b32" not in accesses, sorted(set(accesses))


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_rows_that_start_off_a_16_byte_boundary_are_swept_from_the_boundary(direction):
    """Cross entropy's peeled sweeps (rows of 50257 bf16 columns, COL_MULTIPLE 1): the body loads 16
    bytes an access; only the row's first and last partial runs go one element at a time (and the
    forward's x_t).  Without PEEL the same rows go one element at a time throughout."""
    if direction == "forward":
        kernel, pointers = cross_entropy.cross_entropy_forward_kernel, _CROSS_ENTROPY
        constexprs, narrow = {"SMOOTHING": False, "ZERO_TICKET": True}, 1
    else:
        kernel, pointers = cross_entropy.cross_entropy_backward_kernel, _CROSS_ENTROPY_BACKWARD
        constexprs, narrow = {"MEAN_PARTS": 128}, 0
    constexprs.update({"BLOCK_M": 1, "BLOCK_SIZE": 4096, "COL_MULTIPLE": 1})
    peeled = _global_accesses(_ptx(kernel, pointers, {**constexprs, "PEEL": 8}, 8))
    loads = 6 if direction == "forward" else 2  # 2 a chunk of 16 a thread: first, next, and in the loop (forward)
    assert peeled.count("ld.global.v4.b32") == loads, sorted(peeled)
    assert peeled.count("ld.global.b16") <= 2 * 8 + narrow, sorted(peeled)  # the two edge runs of 8, x_t
    if direction == "backward":
        assert peeled.count("st.global.v4.b32") == 2 and peeled.count("st.global.b16") <= 2 * 8, sorted(peeled)
    plain = _global_accesses(_ptx(kernel, pointers, {**constexprs, "PEEL": 0}, 8))
    assert "ld.global.v4.b32" not in plain and plain.count("ld.global.b16") >= 16, sorted(plain)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_long_norm_rows_off_a_16_byte_boundary_are_swept_from_the_boundary(op):
    """The norms' long-row forward at rows of 50257 bf16 columns (COL_MULTIPLE 1): framed, x is read
    and y written 16 bytes an access but for the two partial runs of each row (and w and b, read at the
    row's columns, element by element); unframed, every access moves one element."""
    kernel = getattr(layer_norm, f"{op}_forward_long_rows_kernel")
    constexprs = {"HAS_WEIGHT": True, "HAS_BIAS": op == "layer_norm", "BLOCK_M": 1, "BLOCK_N": 4096, "COL_MULTIPLE": 1}
    framed = _global_accesses(_ptx(kernel, _BF16_ROW, {**constexprs, "FRAME": 8}, 8))
    # 16 a thread: 2 a sweep; layer norm's statistics sweep is built twice (a row swept again about its mean)
    sweeps = 3 if op == "layer_norm" else 2
    assert framed.count("ld.global.v4.b32") == 2 * sweeps, sorted(framed)
    assert framed.count("st.global.v4.b32") == 2, sorted(framed)
    plain = _global_accesses(_ptx(kernel, _BF16_ROW, {**constexprs, "FRAME": 0}, 8))
    assert "ld.global.v4.b32" not in plain and "st.global.v4.b32" not in plain, sorted(set(plain))


# ---------------------------------------------------------------------------
# Flat kernels of any length: whole blocks apart from the tail (ops/blocks/elementwise.py).
# ---------------------------------------------------------------------------

_FLAT = {
    "gelu forward": ("gelu", "gelu_forward_kernel", {"APPROXIMATE_TANH": True}),
    "gelu erf backward": ("gelu", "gelu_backward_kernel", {"APPROXIMATE_TANH": False}),
    "swiglu forward": ("swiglu", "swiglu_forward_kernel", {}),
    "swiglu backward": ("swiglu", "swiglu_backward_kernel", {}),
    "geglu forward": ("swiglu", "geglu_forward_kernel", {"APPROXIMATE_TANH": True}),
    "geglu backward": ("swiglu", "geglu_backward_kernel", {"APPROXIMATE_TANH": True}),
}


@pytest.mark.parametrize("case", sorted(_FLAT))
def test_flat_kernels_of_a_length_of_no_16_element_multiple_move_whole_blocks_16_bytes_at_a_time(case):
    """n = 10**8 + 7 bfloat16 elements: the compiler knows nothing of n, and with one mask for the
    whole tensor every access was 2 bytes wide (41% of copy bandwidth on an H100).  Whole blocks mask
    with n rounded down to a multiple of the block: 16-byte accesses; only the tail's are narrow."""
    import importlib

    module, name, constexprs = _FLAT[case]
    kernel = getattr(importlib.import_module(f"ops.{module}"), name)
    pointers = {arg: "bf16" for arg in kernel.arg_names if arg.endswith("_ptr")}
    accesses = _global_accesses(_ptx(kernel, pointers, {**constexprs, "BLOCK_SIZE": 2048}, 8))
    wide = {a for a in accesses if ".v4." in a}
    assert {"ld.global.v4.b32", "st.global.v4.b32"} <= wide, sorted(set(accesses))
