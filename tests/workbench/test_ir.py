"""IR on a CPU machine: the launches an op's body plans for an H100 (fake tensors), compiled for sm_90 by Triton,
every level written (compare/launches.py, compare/ir.py; make ir)."""

import json
import shutil

import pytest
import torch
import triton
import triton.language as tl

import ops
from compare import ir, launches
from ops.blocks.elementwise import elementwise_config
from ops.norms.kernels import _center

try:
    from triton.backends.compiler import GPUTarget  # noqa: F401 - compiling for a GPU needs it
except ImportError:  # pragma: no cover
    pytest.skip("this Triton cannot compile for a GPU target", allow_module_level=True)


def test_planned_launches_follow_the_op_s_rule_for_an_h100():
    """gelu over 2**20 bfloat16 elements: the elementwise rule's block and warps for a GPU, its grid."""
    n = 1 << 20
    planned = launches.planned_launches(ops.SPECS["gelu"], (n,), torch.bfloat16)
    (launch,) = planned.launches
    block, warps = elementwise_config(n, torch.device("cuda"))
    assert planned.error is None and launch.kernel == "gelu_forward_kernel" and launch.module == "ops.gelu"
    assert launch.constexprs == {"APPROXIMATE_TANH": False, "BLOCK_SIZE": block} and launch.options == {"num_warps": warps}
    assert launch.grid == [n // block]
    assert launch.args["x_ptr"] == {"tensor": "bfloat16", "shape": [n], "strides": [1], "aligned16": True}


def test_the_fake_gpu_leaves_torch_as_it_was():
    before = (torch.cuda.get_device_properties, torch.cuda.get_device_capability, torch.cuda.current_device,
              hasattr(torch._C, "_cuda_getDevice"))  # fmt: skip
    with launches.fake_gpu():
        assert torch.cuda.get_device_properties(0).multi_processor_count == 132
    after = (torch.cuda.get_device_properties, torch.cuda.get_device_capability, torch.cuda.current_device,
             hasattr(torch._C, "_cuda_getDevice"))  # fmt: skip
    assert before == after


def test_every_op_plans_on_the_fake_gpu():
    """Each op's body runs on fake CUDA tensors of an H100 and launches at least one kernel (a training step on
    a CPU build of torch stops at its backward: its forward's launches are what is found)."""
    for name, spec in sorted(ops.SPECS.items()):
        shape = (spec.shapes.get("cuda") or spec.shapes["cpu"])[0]
        planned = launches.planned_launches(spec, shape, spec.dtypes[0])
        assert planned.launches, (name, planned.error)
        assert planned.error is None or planned.notes, (name, planned.error)


def test_watching_records_the_launches_and_still_makes_them():
    x = torch.randn(3000)
    found = []
    with launches.watching(found):
        y = torch.ops.tk.gelu(x)
    torch.testing.assert_close(y, torch.nn.functional.gelu(x), rtol=1e-5, atol=1e-6)
    (launch,) = found
    assert launch.kernel == "gelu_forward_kernel" and launch.grid == [1]  # the CPU's plan: one program
    assert launch.options == {"num_warps": 1} and launch.to_json()["args"]["n_elements"] == 3000


@pytest.fixture(scope="module")
def gelu_ir(tmp_path_factory):
    out = tmp_path_factory.mktemp("ir")
    assert ir.main(["--op", "gelu", "--shapes", "4096,1048576", "--out", str(out)]) == 0
    return out / "ir" / "gelu"


def test_make_ir_writes_every_level(gelu_ir):
    index = json.loads((gelu_ir / "index.json").read_text())
    assert index["target"] == "sm_90" and [c["shape_label"] for c in index["cases"]] == ["n=2^12", "n=2^20"]
    folders = set()
    for case in index["cases"]:
        (launch,) = case["launches"]
        (row,) = launch["ir"]
        folders.add(row["folder"])
        kinds = {f.rsplit(".", 1)[1] for f in row["files"]}
        assert {"ttir", "ttgir", "llir", "ptx", "json"} <= kinds
        if shutil.which(str(triton.knobs.nvidia.cuobjdump.path)) or (gelu_ir / row["folder"] / "gelu_forward_kernel.sass").exists():
            assert "sass" in kinds
        text = {k: (gelu_ir / row["folder"] / f"gelu_forward_kernel.{k}").read_text() for k in ("ttir", "ttgir", "llir", "ptx")}
        assert "tt.func public @gelu_forward_kernel" in text["ttir"]
        assert f'"ttg.num-warps" = {launch["options"]["num_warps"]}' in text["ttgir"]
        assert "define ptx_kernel void @gelu_forward_kernel" in text["llir"] or "@gelu_forward_kernel(" in text["llir"]
        assert ".target sm_90" in text["ptx"]
        about = json.loads((gelu_ir / row["folder"] / "gelu_forward_kernel.json").read_text())
        assert about["specialization"]["constexprs"] == launch["constexprs"]
        assert about["specialization"]["arguments"]["x_ptr"] == "*bfloat16 (16-byte aligned)"
        assert about["compiled"]["num_warps"] == launch["options"]["num_warps"]
    assert len(folders) == 2  # two block sizes: two specializations
    md = (gelu_ir / "index.md").read_text()
    assert "sm_90" in md and "[ptx](" in md and "[llir](" in md


def test_the_levels_name_no_machine_s_folders(gelu_ir):
    """Source locations in the IR are relative to the checkout (and to site-packages): the same on any machine."""
    for path in gelu_ir.rglob("*.ttir"):
        text = path.read_text()
        assert '"ops/gelu.py"' in text and str(ir._REPO) not in text


# An autotuned kernel: compiled once per config it may choose, or for the one it chose.
@triton.autotune(configs=[triton.Config({"BLOCK": 32}, num_warps=1), triton.Config({"BLOCK": 64}, num_warps=2)], key=["n"])
@triton.jit
def _tuned_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) * 2, mask=offsets < n)


def test_an_autotuned_kernel_compiles_per_config(tmp_path):
    x = torch.randn(100)
    launch = launches.record(_tuned_kernel, lambda meta: (triton.cdiv(100, meta["BLOCK"]),), (x, torch.empty_like(x), 100), {})
    found = [launch]
    assert launch.wrappers == ["autotune"] and launch.grid == "callable"
    assert [c["BLOCK"] for c in launch.configs] == [32, 64]
    (row,) = ir.compile_all(found, ir.Target(), tmp_path, tmp_path, sass=False)
    assert [r["config"]["BLOCK"] for r in row["ir"]] == [32, 64] and not row.get("errors")
    assert [r["info"]["num_warps"] for r in row["ir"]] == [1, 2]
    launch.chosen_config = {"BLOCK": 64, "num_warps": 2}  # what the autotuner chose, where it ran
    assert ir.launch_configs(launch) == [launch.chosen_config]


def test_a_level_cached_from_another_checkout_names_no_folder():
    """Triton's cache keys a kernel by its source: the levels of the same kernel compiled in another
    checkout come back with that checkout's folder, which portable() leaves out too."""
    text = '#loc = loc("/home/someone/tk-copy/ops/gelu.py":85:1)\n#loc1 = loc("/opt/x/lib/other/thing.py":3:1)'
    assert ir.portable(text) == '#loc = loc("ops/gelu.py":85:1)\n#loc1 = loc("/opt/x/lib/other/thing.py":3:1)'


def _global_accesses(launch, config=None) -> set[str]:
    """The kinds of global-memory access in the PTX of `launch` compiled for an H100 (ld.global.b16, cp.async.cg, ...)."""
    import re

    ptx = ir.compile_launch(launch, ir.target_of(ir.H100), config).asm["ptx"]
    return set(re.findall(r"(?:ld|st)\.global[.a-z0-9]*|cp\.async\.cg\.shared\.global", ptx))


def test_matmul_rows_1000_elements_apart_move_16_bytes_an_access():
    """bfloat16 rows of 1000 elements start on 16 bytes, which Triton's specialization (multiples of 16 elements)
    cannot tell: the plan's Multiples restate the sizes and strides, and the pointer kernel's loads and stores are
    16 bytes wide (cp.async, st.global.v4) instead of 2 (ld.global.b16).  Told nothing, it moves 2 bytes."""
    (launch,) = launches.planned_launches(ops.get_spec("matmul"), (1000, 1000, 1000), torch.bfloat16).launches
    assert launch.kernel == "matmul_kernel" and launch.constexprs["AR_MULTIPLE"] == 8
    config = launch.configs[0]
    told = _global_accesses(launch, config)
    assert "cp.async.cg.shared.global" in told and "st.global.v4.b32" in told and "ld.global.b16" not in told, told
    launch.args.update({name: 1 for name in launch.args if name.endswith("_MULTIPLE")})
    untold = _global_accesses(launch, config)
    assert "ld.global.b16" in untold and "st.global.b16" in untold, untold


@pytest.mark.parametrize("op", ["softmax", "softmax_backward"])
def test_softmax_rows_of_50257_are_framed_to_move_16_bytes_an_access(op):
    """Rows of GPT-2's 50257 bfloat16 columns start off 16-byte boundaries (seven in eight): the held kernel
    reads them in a frame that starts on one, so the runs wholly in a row move 16 bytes an access
    (ld/st.global.v4) and only the two partial runs at its ends one element at a time.  Unframed
    (FRAME=0), every access moves 2 bytes."""
    found = launches.planned_launches(ops.get_spec(op), (4096, 50257), torch.bfloat16).launches
    (launch,) = [la for la in found if la.kernel != "unpublish_kernel"]
    assert launch.args["FRAME"] == 8, launch.args
    config = launch.configs[0] if launch.configs else None
    framed = _global_accesses(launch, config)
    assert {"ld.global.v4.b32", "st.global.v4.b32"} <= framed, framed
    launch.args["FRAME"] = 0
    unframed = _global_accesses(launch, config)
    assert "ld.global.v4.b32" not in unframed and "st.global.v4.b32" not in unframed, unframed


@pytest.mark.parametrize("op", ["layer_norm", "layer_norm_backward"])
def test_layer_norm_s_mean_correction_divides_rounded_to_nearest(op):
    """The correction that makes a constant row's mean exact (ops/norms/kernels.py: _center) divides with
    div.rn: Triton's float32 `/` compiles to the approximate div.full.f32, which missed the constant row's
    value on the H100 while the interpreter's exact division passed."""
    found = launches.planned_launches(ops.get_spec(op), (4096, 1000), torch.float32).launches
    ptx = "".join(
        ir.compile_launch(la, ir.target_of(ir.H100), la.configs[0] if la.configs else None).asm["ptx"]
        for la in found
        if "normalize" in la.kernel or "layer_norm" in la.kernel
    )
    assert "div.rn.f32" in ptx, [la.kernel for la in found]


@triton.jit
def _center_kernel(x_ptr, d_ptr, n, BLOCK: tl.constexpr, AXIS: tl.constexpr):
    """_center of one row (AXIS 0: a chunk, as the long-row kernels take it) or of a tile of two (AXIS 1)."""
    if AXIS == 0:
        offsets = tl.arange(0, BLOCK)
        mask = offsets < n
    else:
        cols = tl.arange(0, BLOCK)[None, :]
        offsets = tl.arange(0, 2)[:, None] * n + cols
        mask = (cols < n) & (offsets < 2 * n)
    d, _ = _center(tl.load(x_ptr + offsets, mask=mask, other=0.0), mask, n, AXIS)
    tl.store(d_ptr + offsets, d, mask=mask)


@pytest.mark.parametrize("axis", [0, 1])
def test_the_mean_of_a_row_divides_rounded_to_nearest(axis):
    """Neither of _center's divisions is the approximate div.full.f32: its quotient (a reciprocal and a multiply) was
    fused into x - mean as one FMA on the H100, so the centered values of rows of 1000 copies of 0.9 were not one
    exact value and their correction left x - mean at -2**-47 (in the tile of rows, AXIS 1)."""
    x = torch.full((2, 1000), 0.9)
    launch = launches.record(_center_kernel, (1,), (x, torch.empty_like(x), 1000), {"BLOCK": 1024, "AXIS": axis})
    ptx = ir.compile_launch(launch, ir.target_of(ir.H100)).asm["ptx"]
    assert "div.rn.f32" in ptx and "div.full.f32" not in ptx


def test_a_kernel_that_does_not_compile_is_listed_with_its_place_and_cause():
    """Triton's CompilationError starts with its place ("at 17:14:", the source line, a caret) and chains the
    error of the function it called; the index lists the outermost place and the innermost cause."""

    def chained():
        try:
            try:
                raise ValueError("Expected dtype ['fp32'] but got fp64")
            except ValueError as inner:
                raise RuntimeError("at 3:14:\n    x = tl.math.div_rn(a, b)\n              ^") from inner
        except RuntimeError as middle:
            raise RuntimeError("at 17:14:\n    x, edge = _load_x(...)\n              ^") from middle

    with pytest.raises(RuntimeError) as caught:
        chained()
    line = ir._error_line(caught.value)
    assert line == "RuntimeError at 17:14: ValueError: Expected dtype ['fp32'] but got fp64", line
    assert ir._error_line(KeyError("BLOCK_M")) == "KeyError: 'BLOCK_M'"
