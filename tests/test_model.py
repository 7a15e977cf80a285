"""The GPT-style model of examples/gpt_block.py, built from tk ops, against the same model built from PyTorch ops.

On the CPU the model is tiny (the tk kernels run in Triton's interpreter);
on CUDA (marked `gpu`) it is a realistic small model: 2 layers, d_model 512,
sequences of 512 tokens, a 32000-token vocabulary.
"""

import json
import math
import sys
import zipfile

import pytest
import torch
from reference import DEVICES, TOLERANCE, leaf64, rel_error

import ops
from compare import breakdown, cli
from examples import gpt_block
from examples.gpt_block import IGNORE_INDEX, TK_OPS, TORCH_OPS, UNFUSED_OPS, GPT, GPTConfig

# Odd sizes on the CPU: no dimension is a multiple of a block size.
CPU_CASE = (GPTConfig(vocab=101, d_model=48, n_heads=3, max_seq=24, d_ff=80, n_layers=2), 2, 23)
CUDA_CASE = (GPTConfig(vocab=32000, d_model=512, n_heads=8, max_seq=512, n_layers=2), 4, 512)


def case(device):
    return CUDA_CASE if device == "cuda" else CPU_CASE


def make_model(config, device, dtype=torch.float32, build=TORCH_OPS):
    """A model whose norm weights are not all ones, so that their scaling and gradients count."""
    model = GPT(config, build, device=device, dtype=dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
    return model


def make_batch(config, batch, seq, device):
    """Random tokens and targets, a few targets set to IGNORE_INDEX (padding)."""
    tokens = torch.randint(0, config.vocab, (batch, seq), device=device)
    targets = torch.randint(0, config.vocab, (batch, seq), device=device)
    targets[0, -3:] = IGNORE_INDEX
    return tokens, targets


def assert_as_accurate(what, got, same_dtype_torch, ref64, dtype):
    """tk's result is as close to the float64 model as PyTorch's own in the same dtype, within a factor 2
    plus the dtype's op tolerance: the errors of a whole model add up, so no absolute bound fits every size.
    (The factor covers bfloat16 on the CPU: Triton's interpreter rounds float32 to bfloat16 toward zero,
    twice the error of the round-to-nearest of PyTorch and of the GPU.)"""
    assert got.dtype == same_dtype_torch.dtype, f"{what}: dtype {got.dtype}, PyTorch gives {same_dtype_torch.dtype}"
    err, torch_err = rel_error(got, ref64), rel_error(same_dtype_torch, ref64)
    bound = 2 * torch_err + TOLERANCE[dtype]
    assert err <= bound, f"{what}: tk error {err:.2e} > {bound:.2e} (PyTorch's own: {torch_err:.2e}, {dtype})"


def loss_and_grads(model, tokens, targets):
    loss = model(tokens, targets)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return loss.detach(), dict(zip([n for n, _ in model.named_parameters()], grads))


def handwritten_kernel_names():
    """The names of the @triton.jit functions of ops/ (autotuners unwrapped): kernels and their helpers."""
    from triton.runtime.jit import JITFunction

    names = set()
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("ops."):
            continue
        for value in list(vars(module).values()):
            for _ in range(4):  # Autotuner / Heuristics keep what they wrap in .fn
                if isinstance(value, JITFunction):
                    names.add(value.fn.__name__)
                    break
                value = getattr(value, "fn", None)
    return names


def cuda_kernels_of(fn):
    """Names of the CUDA kernels ``fn()`` launches (eager, profiled)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {ev.name for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA}


def missing_from_package(path, names) -> list[str]:
    """The names that neither a file name nor a file of the package (source, cubin, shared object) holds."""
    missing = set(names)
    with zipfile.ZipFile(path) as package:
        for member in package.namelist():
            data = package.read(member)
            missing = {n for n in missing if n not in member and n.encode() not in data}
    return sorted(missing)


# ------------------------------------------------------------ tk vs PyTorch


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tk_model_matches_pytorch(device, dtype):
    config, batch, seq = case(device)
    torch_model = make_model(config, device, dtype)
    tk_model = torch_model.with_ops(TK_OPS)
    ref64 = torch_model.with_ops(TORCH_OPS).double()  # the same weights, exactly, in float64
    tokens, targets = make_batch(config, batch, seq, device)

    with torch.no_grad():
        logits = tk_model(tokens)
        assert logits.shape == (batch, seq, config.vocab)
        assert_as_accurate("logits", logits, torch_model(tokens), ref64(tokens), dtype)

    tk_loss, tk_grads = loss_and_grads(tk_model, tokens, targets)
    torch_loss, torch_grads = loss_and_grads(torch_model, tokens, targets)
    loss64, grads64 = loss_and_grads(ref64, tokens, targets)
    assert math.isfinite(tk_loss.item()) and tk_loss.item() > 0
    assert_as_accurate("loss", tk_loss, torch_loss, loss64, dtype)
    for name, grad in tk_grads.items():
        assert grad.shape == getattr(tk_model, name).shape
        assert_as_accurate(f"grad of {name}", grad, torch_grads[name], grads64[name], dtype)


def test_unfused_build_matches_pytorch():
    """The harness's eager-unfused variant computes the same model."""
    config, batch, seq = CPU_CASE
    model = make_model(config, "cpu", torch.float64)
    tokens, targets = make_batch(config, batch, seq, "cpu")
    loss, grads = loss_and_grads(model, tokens, targets)
    unfused_loss, unfused_grads = loss_and_grads(model.with_ops(UNFUSED_OPS), tokens, targets)
    assert rel_error(unfused_loss, loss) < 1e-12
    for name, grad in grads.items():
        assert rel_error(unfused_grads[name], grad) < 1e-12, name


def test_tk_model_gradcheck():
    """float64 gradients of the loss through every tk op's backward, against finite differences.
    The token embedding's gradient passes through all of them; the other weights checked
    are the ones only an op's own weight gradient reaches (rms_norm's dw, matmul's db)."""
    config = GPTConfig(vocab=13, d_model=8, n_heads=2, max_seq=5, d_ff=12)
    model = make_model(config, "cpu", torch.float64, TK_OPS)
    tokens, targets = make_batch(config, 2, 5, "cpu")
    params = {name: leaf64(p) for name, p in model.named_parameters()}
    checked = ["tok_emb", "l0_attn_norm", "l0_up", "lm_head"]

    def loss(*weights):
        return gpt_block.gpt_loss(params | dict(zip(checked, weights)), tokens, targets, config, TK_OPS)

    assert torch.autograd.gradcheck(loss, [params[name] for name in checked], fast_mode=True)


# ---------------------------------------------------- training under compile

# The PyTorch build under torch.compile on the GPU only: on the CPU it checks
# PyTorch alone and costs a C++ compile.
COMPILE_CASES = [
    pytest.param("cpu", "tk"),
    pytest.param("cuda", "tk", marks=pytest.mark.gpu),
    pytest.param("cuda", "torch", marks=pytest.mark.gpu),
]


@pytest.mark.parametrize("device, build", COMPILE_CASES)
def test_compiled_training_steps_match_eager(device, build):
    """A few SGD steps of torch.compile(model, fullgraph=True) give eager's losses and weights,
    and the compiled code (forward and backward) runs tk's ops: the opaque CPU ops on the CPU,
    on CUDA every hand-written kernel the eager step launches, inside Inductor's code."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    config, batch, seq = case(device)
    build_ops = TK_OPS if build == "tk" else TORCH_OPS
    eager = make_model(config, device, build=build_ops)
    compiled_model = eager.with_ops(build_ops)  # an independent copy of the same weights
    compiled = torch.compile(compiled_model, fullgraph=True)  # any graph break is an error
    tokens, targets = make_batch(config, batch, seq, device)
    if device == "cuda" and build == "tk":
        used = cuda_kernels_of(lambda: eager(tokens, targets).backward()) & handwritten_kernel_names()
        assert {"matmul_kernel", "cross_entropy_forward_kernel"} <= used, used

    def trainer(model, params):
        # SGD: its update is linear in the gradient, so rounding differences stay as small as they
        # are (Adam's g / sqrt(v) would turn the noise in a near-zero gradient into a full step).
        optimizer = torch.optim.SGD(params.parameters(), lr=0.05, momentum=0.9)

        def step():
            optimizer.zero_grad()
            loss = model(tokens, targets)
            loss.backward()
            optimizer.step()
            return loss.item()

        return step

    eager_step, compiled_step = trainer(eager, eager), trainer(compiled, compiled_model)
    eager_losses = [eager_step() for _ in range(3)]
    first, code = run_and_get_code(compiled_step)  # compiles the forward, then the backward
    compiled_losses = [first] + [compiled_step() for _ in range(2)]

    assert eager_losses[-1] < eager_losses[0], eager_losses  # the steps train
    torch.testing.assert_close(compiled_losses, eager_losses, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), compiled_model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
    if build == "tk":
        source = "\n".join(code)
        if device == "cpu":
            for op in ["matmul", "rms_norm", "swiglu", "rms_norm_backward", "swiglu_backward"]:
                assert f"tk.{op}_cpu" in source, f"tk.{op}_cpu missing from the compiled code"
            assert "tk.cross_entropy" in source
        else:
            missing = [k for k in sorted(used) if k not in source]
            assert not missing, f"hand-written kernels missing from Inductor's output code: {missing}"
            assert "tk.matmul_cpu" not in source and "tk.rms_norm_cpu" not in source


@pytest.mark.gpu
def test_compiled_model_replays_tk_kernels_in_cuda_graphs():
    """mode="reduce-overhead": Inductor records the compiled forward, tk's kernels included, in a CUDA
    graph and replays it, which takes the host's per-call cost off every op.  Nothing may be skipped
    (a kernel that cannot be captured would make Inductor fall back to plain launches)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    config, batch, seq = case("cuda")
    model = make_model(config, "cuda", build=TK_OPS)
    tokens, targets = make_batch(config, batch, seq, "cuda")
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        expected = model(tokens, targets)
        losses = [compiled(tokens, targets).clone() for _ in range(4)]  # warm-up, record, replays
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    for loss in losses:
        torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------ export and AOTInductor


def exported(model, tokens, targets):
    return torch.export.export(model, (tokens, targets))


def test_export_of_the_tk_model_runs_on_cpu():
    config, batch, seq = CPU_CASE
    model = make_model(config, "cpu", build=TK_OPS)
    tokens, targets = make_batch(config, batch, seq, "cpu")
    program = exported(model, tokens, targets)
    called = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    for op in ["tk.matmul.default", "tk.rms_norm.default", "tk.swiglu.default"]:
        assert op in called, f"{op} not in the exported graph: {sorted(called)}"
    assert any(op.startswith("tk.cross_entropy") for op in called)
    torch.testing.assert_close(program.module()(tokens, targets), model(tokens, targets))
    new_tokens, new_targets = make_batch(config, batch, seq, "cpu")  # the program is not specialized to its inputs
    torch.testing.assert_close(program.module()(new_tokens, new_targets), model(new_tokens, new_targets))


def test_aoti_package_on_cpu_calls_the_registered_tk_ops(tmp_path):
    """On the CPU, AOTInductor cannot compile a Triton kernel: the package calls
    tk's CPU ops through the dispatcher (its proxy executor), so it runs in a
    process that has imported ``ops`` and nowhere else."""
    config, batch, seq = CPU_CASE
    model = make_model(config, "cpu", build=TK_OPS)
    tokens, targets = make_batch(config, batch, seq, "cpu")
    path = torch._inductor.aoti_compile_and_package(
        exported(model, tokens, targets),
        package_path=str(tmp_path / "gpt_tk_cpu.pt2"),
        inductor_configs={"aot_inductor.compile_wrapper_opt_level": "O0"},  # a test: compile fast
    )
    torch.testing.assert_close(torch._inductor.aoti_load_package(path)(tokens, targets), model(tokens, targets))
    code, out = load_and_run_in_a_child(path, (tokens, targets), tmp_path)  # as the CUDA test loads it
    assert code == 0, out
    torch.testing.assert_close(out, model(tokens, targets))
    with zipfile.ZipFile(path) as package:
        extern = [json.loads(package.read(n)) for n in package.namelist() if n.endswith(".wrapper.json")]
    targets_called = {node["node"]["target"] for doc in extern for node in doc["nodes"]}
    assert {"tk::matmul_cpu", "tk::rms_norm_cpu", "tk::swiglu_cpu"} <= targets_called, targets_called


_LOAD_AND_RUN = """
import sys, torch
import ops  # the package may call tk ops through the dispatcher
runner = torch._inductor.aoti_load_package(sys.argv[1])
torch.save(runner(*torch.load(sys.argv[2])), sys.argv[3])
"""


def load_and_run_in_a_child(path, inputs, tmp_path):
    """Load an AOTInductor package and run it in a child process: a crash of the
    loader takes the child down, not the test session.  (returncode, output)."""
    import os
    import subprocess
    from pathlib import Path

    stem = Path(path).stem
    args_file, out_file = tmp_path / f"{stem}.inputs.pt", tmp_path / f"{stem}.out.pt"
    torch.save(inputs, args_file)
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    child = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", _LOAD_AND_RUN, str(path), str(args_file), str(out_file)],
        capture_output=True, text=True, timeout=600, env=env, cwd=root,
    )  # fmt: skip
    if child.returncode != 0:
        return child.returncode, child.stderr[-2000:]
    return 0, torch.load(out_file)


def aoti_runtime_crash(tmp_path) -> str | None:
    """Why this install's AOTInductor runtime cannot load a CUDA package, or None if it can.

    The control is a package of F.gelu alone, no tk op.  On the H100 machine
    (torch 2.11+cu130) its load died with SIGSEGV inside
    ``AOTIModelPackageLoader``, with or without ``ops`` imported, also with
    ``run_single_threaded`` or ``device_index=0``; the older loaders
    (``AOTIModelContainerRunnerCuda``, ``torch._export.aot_load``) died the
    same way, while a plain ``dlopen`` of the package's wrapper library
    succeeded: the crash is inside torch's runner, a fault of that install,
    not of tk, which this separates from a fault of tk's package."""

    class Gelu(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.gelu(x)

    x = torch.randn(64, 1000, device="cuda")
    path = torch._inductor.aoti_compile_and_package(
        torch.export.export(Gelu(), (x,)), package_path=str(tmp_path / "control_gelu.pt2")
    )
    code, out = load_and_run_in_a_child(path, (x,), tmp_path)
    if code != 0:
        return f"aoti_load_package of a package holding only F.gelu exited with {code} (torch {torch.__version__}): {out[-300:]}"
    torch.testing.assert_close(out, torch.nn.functional.gelu(x))
    return None


@pytest.mark.timeout(900)  # pytest-timeout's limit, where installed: compiles or autotunes for minutes on a GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_aoti_package_on_cuda_holds_the_hand_written_kernels(tmp_path, dtype):
    """torch.export then AOTInductor: the package carries tk's own kernels, runs and matches eager."""
    config, batch, seq = CUDA_CASE
    model = make_model(config, "cuda", dtype, TK_OPS)
    tokens, targets = make_batch(config, batch, seq, "cuda")
    with torch.no_grad():
        used = cuda_kernels_of(lambda: model(tokens, targets)) & handwritten_kernel_names()
        eager_loss = model(tokens, targets)
        torch_loss = model.with_ops(TORCH_OPS)(tokens, targets)
    assert "matmul_kernel" in used, used
    program = exported(model, tokens, targets)
    path = torch._inductor.aoti_compile_and_package(program, package_path=str(tmp_path / "gpt_tk.pt2"))
    missing = missing_from_package(path, used)
    assert not missing, f"hand-written kernels missing from the AOTInductor package: {missing}"

    broken = aoti_runtime_crash(tmp_path)
    if broken:
        pytest.xfail(f"the package compiled and holds tk's kernels, but this install cannot load any package: {broken}")
    code, loss = load_and_run_in_a_child(path, (tokens, targets), tmp_path)
    assert code == 0, f"loading tk's package failed where the control package loaded: {loss}"
    # A bfloat16 loss near 10.4 is a multiple of 1/16: two of them may differ by a few such steps.
    tolerance = dict(rtol=3e-2, atol=0.0) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(loss.float(), eager_loss.float(), **tolerance)
    torch.testing.assert_close(loss.float(), torch_loss.float(), **tolerance)
    new_tokens, new_targets = make_batch(config, batch, seq, "cuda")
    with torch.no_grad():
        new_loss = model(new_tokens, new_targets)
    code, new_out = load_and_run_in_a_child(path, (new_tokens, new_targets), tmp_path)
    assert code == 0, new_out
    torch.testing.assert_close(new_out.float(), new_loss.float(), **tolerance)


# ------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda: GPTConfig(vocab=10, d_model=30, n_heads=4, max_seq=8), ValueError, "d_model 30 is not a multiple of"),
        (lambda: GPTConfig(vocab=0, d_model=8, n_heads=2, max_seq=8), ValueError, "vocab must be positive"),
    ],
)
def test_config_errors(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_input_errors():
    config = GPTConfig(vocab=10, d_model=8, n_heads=2, max_seq=4)
    model = GPT(config, TK_OPS)
    tokens = torch.zeros(2, 4, dtype=torch.int64)
    with pytest.raises(TypeError, match="tokens must be a 2-D .* got a 2-D torch.float32 tensor"):
        model(tokens.float())
    with pytest.raises(TypeError, match="got a 1-D torch.int64 tensor"):
        model(tokens[0])
    with pytest.raises(ValueError, match="sequence of 5 tokens is longer than max_seq 4"):
        model(torch.zeros(1, 5, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"targets have shape \(2, 3\), tokens \(2, 4\)"):
        model(tokens, tokens[:, :3])


def test_with_ops_copies_weights_dtype_and_device():
    model = make_model(GPTConfig(vocab=10, d_model=8, n_heads=2, max_seq=4), "cpu", torch.bfloat16)
    other = model.with_ops(TK_OPS)
    assert other.ops is TK_OPS and model.ops is TORCH_OPS
    for (name, p), q in zip(model.named_parameters(), other.parameters()):
        assert q.dtype == torch.bfloat16 and torch.equal(p, q) and p.data_ptr() != q.data_ptr(), name


# --------------------------------------------------------------- the harness


def test_spec_flops_count_the_models_matmuls():
    """3x the forward's matmul FLOPs, counted by PyTorch (attention over its causal half)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    shape = (2, 16, 32, 2, 64)
    model = GPT(gpt_block.config_for(shape))
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):  # attention as two bmm
        model(torch.randint(0, 64, shape[:2]))
    counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    assert set(counts) == {"aten.mm", "aten.bmm"}
    assert gpt_block.matmul_flops(shape) == counts["aten.mm"] + counts["aten.bmm"] // 2
    assert gpt_block.SPEC.flops(shape, torch.bfloat16) == 3 * gpt_block.matmul_flops(shape)


def test_spec_step_returns_the_loss_and_every_gradient():
    spec = gpt_block.SPEC
    shape = spec.shapes["cpu"][0]
    config, tokens, targets, *params = spec.make_inputs(shape, torch.float32, "cpu")
    assert len(params) == len(gpt_block.param_shapes(config))
    loss, *grads = spec.reference(config, tokens, targets, *params)
    model = GPT(config)
    model.load_state_dict(dict(zip(gpt_block.param_shapes(config), params)))
    want_loss, want_grads = loss_and_grads(model, tokens, targets)
    torch.testing.assert_close(loss, want_loss)
    for grad, want in zip(grads, want_grads.values()):
        torch.testing.assert_close(grad, want)
    assert all(p.grad is None for p in params)  # nothing accumulates between timed calls


def test_harness_runs_the_block(tmp_path):
    argv = ["--op", "gpt_block", "--shapes", "2x8x16x2x32", "--variants", "eager,unfused,tk"]
    argv += ["--device", "cpu", "--rep-ms", "2", "--rounds", "1"]
    assert cli.main([*argv, "--quiet", "--no-capture", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "gpt_block" / "results.json").read_text())
    by = {r["variant"]: r for r in doc["records"]}
    assert set(by) == {"eager", "eager-unfused", "tk"}
    for r in by.values():
        assert r["status"] == "ok", r
        assert r["kernels"] > breakdown.MIN_KERNELS and r["kernel_us"]  # a training step: many ops
    assert by["tk"]["interpreted"] and by["tk"]["rel_error"] <= gpt_block.SPEC.tolerance[torch.float32]
    assert by["eager-unfused"]["kernels"] > by["eager"]["kernels"]  # the hand-written norm and loss: more ops
    assert any(name.startswith("tk::matmul") for name in by["tk"]["kernel_names"])
    report = (tmp_path / "gpt_block" / "report.md").read_text()
    section = report.split("## Per-kernel breakdown")[1]
    for name in by:
        assert f"**{name}**" in section
    top_tk = max(by["tk"]["kernel_us"], key=by["tk"]["kernel_us"].get)
    assert breakdown.short_name(top_tk) in section.split("**tk**")[1]


def test_models_are_named_apart_from_the_ops():
    """--op gpt_block finds the model; --op all stays every op; an unknown name lists both."""
    args = cli.parser().parse_args(["--op", "all"])
    names = [sweep.spec.name for sweep in cli.make_sweeps(args, torch.device("cpu"))]
    assert names == sorted(ops.SPECS) and "gpt_block" not in names
    args = cli.parser().parse_args(["--op", "gpt_block"])
    (sweep,) = cli.make_sweeps(args, torch.device("cpu"))
    assert sweep.spec is gpt_block.SPEC and sweep.spec.bound == "compute"
    want = ["eager", "eager-unfused", "compile", "compile-unfused", "tk", "compile-tk"]
    assert [v.name for v in sweep.variants] == want
    with pytest.raises(cli.UsageError, match="unknown op 'gpt'; known ops: .*gelu.*; models: gpt_block, llama; or all"):
        cli.make_sweeps(cli.parser().parse_args(["--op", "gpt"]), torch.device("cpu"))


def test_breakdown_ranks_kernels_and_sums_the_rest():
    times = {f"k{i}": float(i + 1) for i in range(breakdown.TOP + 3)}  # k12 the largest
    names = [*times, "k0", "k0"]  # k0 launched 3 times
    record = {"kernels": 20, "kernel_us": times, "kernel_names": names, "median_ms": 1.0, "device": "cuda"}
    rows = breakdown.variant_rows(record)
    assert [r[0] for r in rows[: breakdown.TOP]] == [f"k{i}" for i in range(breakdown.TOP + 2, 2, -1)]
    assert rows[-1][0] == "(3 others)" and rows[-1][1] == str(3 + 2)  # k0 launched 3 times, k1, k2 once
    assert float(rows[-1][2]) == pytest.approx(1 + 2 + 3)
    assert sum(float(r[3].rstrip("%")) for r in rows) == pytest.approx(100, abs=0.1)
    assert breakdown.needs_breakdown([record])
    assert not breakdown.needs_breakdown([{**record, "kernels": 1}])  # single ops: no section


@pytest.mark.gpu
def test_harness_runs_the_block_on_cuda(tmp_path):
    """Every variant of a training step on the GPU, correct, with its kernels broken down in the report."""
    argv = ["--op", "gpt_block", "--dtypes", "bfloat16", "--shapes", "4x256x512x8x32000"]
    argv += ["--rep-ms", "20", "--rounds", "1"]
    assert cli.main([*argv, "--quiet", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "gpt_block" / "results.json").read_text())
    by = {r["variant"]: r for r in doc["records"]}
    assert set(by) == {"eager", "eager-unfused", "compile", "compile-unfused", "tk", "compile-tk"}
    for r in by.values():
        assert r["status"] == "ok" and not r["interpreted"] and r["median_ms"] > 0 and r["tflops"] > 0, r
        assert r["kernels"] > breakdown.MIN_KERNELS and r["kernel_unit"] == "kernels"
    tk_kernels = set(by["tk"]["kernel_names"])
    assert {"matmul_kernel", "cross_entropy_forward_kernel", "cross_entropy_backward_kernel"} <= tk_kernels, tk_kernels
    assert any(name.startswith("triton_") for name in by["compile"]["kernel_names"])  # Inductor's own kernels
    report = (tmp_path / "gpt_block" / "report.md").read_text()
    tk_section = report.split("## Per-kernel breakdown")[1].split("**tk**")[1].split("**", 1)[0]
    assert "matmul_kernel" in tk_section and "device busy" in tk_section
