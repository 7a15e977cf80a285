"""The elementwise ops: copy, square, add, rgb_to_grayscale, swiglu and geglu.

Each against a float64 reference (or exactly, where the op is exact): every
dtype, sizes that are not multiples of the block, dense layouts of any order
and strided views, empty tensors, gradients against PyTorch's and
gradcheck, opcheck, clear errors, torch.compile.  Each test runs on the CPU
(the Triton kernels through the interpreter, small sizes) and on CUDA
(compiled kernels, realistic sizes; marked `gpu`).
"""

import dataclasses
import importlib
import inspect
import itertools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import (
    DEVICES,
    DTYPES,
    assert_close,
    assert_raises_clearly,
    error_cases,
    leaf64,
    rel_error,
    strided_versions,
)

import ops
from ops.tour import rgb_to_grayscale as rgb_ops
from ops.blocks.sizes import next_power_of_2
from ops.blocks.elementwise import elementwise_config, elementwise_grid
from ops.tour.copy import INTEGER_DTYPES

# sigmoid(x) = 1 / (1 + exp(-x)): for x below about -88, exp overflows to inf in
# float32 and the sigmoid is 0, as it should be; numpy (the interpreter) warns.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

tk = torch.ops.tk
WEIGHTS = (0.2989, 0.587, 0.114)


def pick(device, cpu, cuda):
    return cuda if device == "cuda" else cpu


def layouts(x):
    """strided_versions, plus a dense layout that is not the standard one."""
    yield from strided_versions(x)
    if x.dim() >= 2:
        yield "dense-permuted", x.permute(*range(x.dim() - 1, -1, -1)).contiguous().permute(*range(x.dim() - 1, -1, -1))


def backward(fn, *inputs, grad):
    """The gradients of fn's inputs for the output gradient `grad`."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    fn(*leaves).backward(grad)
    return [leaf.grad for leaf in leaves]


def float64_backward(fn, *inputs, grad):
    leaves = [leaf64(x) for x in inputs]
    fn(*leaves).backward(grad.double())
    return [leaf.grad for leaf in leaves]


# Sizes: one element, one partial block, several blocks with a partial last
# one (on CPU a block is up to 2**16 elements), and a GPU-sized tensor.
def elementwise_shapes(device):
    return pick(device, [(), (1,), (1000,), (3, 4097), (7, 1, 13), (2 * 65536 + 3,)], [(1,), (4097,), (3000, 4099), (1 << 26,)])


# ----------------------------------------------------------------------- copy


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES + list(INTEGER_DTYPES))
def test_copy_is_exact_in_every_layout(device, dtype):
    for shape in elementwise_shapes(device):
        if dtype.is_floating_point:
            x = torch.randn(shape, device=device, dtype=dtype)
        else:
            info = torch.iinfo(dtype)
            x = torch.randint(info.min, info.max, shape, device=device, dtype=dtype)
        for layout, view in layouts(x):
            y = tk.copy(view)
            assert y.dtype == dtype and y.shape == view.shape, layout
            assert torch.equal(y, view), layout
            assert view.numel() == 0 or y.data_ptr() != view.data_ptr()  # a fresh tensor


@pytest.mark.parametrize("device", DEVICES)
def test_copy_backward_passes_the_gradient_through(device):
    x = torch.randn(pick(device, (37, 129), (4096, 4097)), device=device)
    grad = torch.randn_like(x).t().contiguous().t()  # a non-contiguous gradient
    (dx,) = backward(tk.copy, x, grad=grad)
    assert torch.equal(dx, grad)


# ---------------------------------------------------------------------- square


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_square_matches_float64(device, dtype):
    for shape in elementwise_shapes(device):
        x = 3 * torch.randn(shape, device=device, dtype=dtype)
        for layout, view in layouts(x):
            y = tk.square(view)
            assert y.shape == view.shape, layout
            assert_close(y, view.double() ** 2, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_square_backward_matches_pytorch(device, dtype):
    x = 3 * torch.randn(pick(device, (37, 129), (4096, 4097)), device=device, dtype=dtype)
    for layout, grad in layouts(torch.randn_like(x)):
        (dx,) = backward(tk.square, x, grad=grad)
        (dx64,) = float64_backward(torch.square, x, grad=grad)
        assert_close(dx, dx64, dtype)


# ------------------------------------------------------------------------- add


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_matches_float64_for_every_pair_of_layouts(device, dtype):
    for shape in elementwise_shapes(device):
        a = torch.randn(shape, device=device, dtype=dtype)
        b = torch.randn(shape, device=device, dtype=dtype)
        for layout_a, va in layouts(a):
            for layout_b, vb in layouts(b):
                out = tk.add(va, vb)
                assert out.shape == va.shape, (layout_a, layout_b)
                assert_close(out, va.double() + vb.double(), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_backward_gives_the_gradient_to_both(device, dtype):
    a, b = torch.randn(2, *pick(device, (37, 129), (4096, 4097)), device=device, dtype=dtype)
    grad = torch.randn_like(a)
    da, db = backward(tk.add, a, b, grad=grad)
    assert torch.equal(da, grad) and torch.equal(db, grad)


@pytest.mark.parametrize("device", DEVICES)
def test_add_of_explicitly_broadcast_operands(device):
    a = torch.randn(4, 1, 5, device=device)
    b = torch.randn(3, 5, device=device)
    add = lambda x, y: tk.add(*torch.broadcast_tensors(x, y))  # noqa: E731
    assert_close(add(a, b), a.double() + b.double(), torch.float32)
    grad = torch.randn(4, 3, 5, device=device)
    for got, want in zip(backward(add, a, b, grad=grad), float64_backward(torch.add, a, b, grad=grad)):
        assert got.shape == want.shape  # summed back over the broadcast dims
        assert_close(got, want, torch.float32)


# ------------------------------------------------------------ rgb_to_grayscale


def grayscale_exact(img: torch.Tensor) -> torch.Tensor:
    """uint8: floor(0.2989 R + 0.587 G + 0.114 B), in integers (exact)."""
    r, g, b = img.long().unbind(-3)
    return (2989 * r + 5870 * g + 1140 * b) // 10000


def grayscale_float64(img: torch.Tensor) -> torch.Tensor:
    r, g, b = img.double().unbind(-3)
    return WEIGHTS[0] * r + WEIGHTS[1] * g + WEIGHTS[2] * b


def image_layouts(img):
    """The same image as users hold it: planar, channels-last, the RGB of an RGBA
    image, an offset crop, and transposed (H and W do not merge: one copy)."""
    yield "contiguous", img
    if img.dim() == 4:
        yield "channels-last", img.contiguous(memory_format=torch.channels_last)
    rgba = torch.cat([img, img[..., :1, :, :]], dim=-3)
    yield "rgb-of-rgba", rgba[..., :3, :, :]
    padded = torch.zeros(*img.shape[:-2], img.shape[-2] + 3, img.shape[-1] + 5, dtype=img.dtype, device=img.device)
    padded[..., 3:, 5:] = img
    yield "crop", padded[..., 3:, 5:]
    yield "transposed-hw", img.transpose(-1, -2).contiguous().transpose(-1, -2)


def image_shapes(device):
    # A single image, a batch, two batch dims, odd sizes; many small images.
    return pick(
        device,
        [(3, 17, 19), (2, 3, 30, 41), (2, 2, 3, 5, 7), (3, 1, 1), (40, 3, 2, 3)],
        [(3, 1080, 1920), (16, 3, 1080, 1920), (2, 2, 3, 517, 333), (100_000, 3, 4, 5)],
    )


@pytest.mark.parametrize("device", DEVICES)
def test_grayscale_of_uint8_truncates_exactly(device):
    for shape in image_shapes(device):
        img = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
        for layout, view in image_layouts(img):
            gray = tk.rgb_to_grayscale(view)
            assert gray.dtype == torch.uint8 and gray.shape == shape[:-3] + shape[-2:], layout
            assert torch.equal(gray.long(), grayscale_exact(view)), layout
            # the exact integer formula is the float64 answer, truncated
            assert torch.equal(gray.double(), torch.floor(grayscale_float64(view) + 1e-9)), layout


def colors(device):
    """(3, N) uint8 colors.  CUDA: all 2**24.  CPU (the interpreter is slow): every
    color whose weighted sum is an exact integer, the cases where rounding
    matters, and 2**16 others at random."""
    levels = torch.arange(256, device=device, dtype=torch.int32)
    if device == "cuda":
        return torch.stack(torch.meshgrid(levels, levels, levels, indexing="ij")).reshape(3, -1).to(torch.uint8)
    weighted = 2989 * levels[:, None, None] + 5870 * levels[None, :, None] + 1140 * levels[None, None, :]
    on_integers = torch.stack(torch.nonzero(weighted % 10000 == 0, as_tuple=True))
    others = torch.randint(0, 256, (3, 1 << 16))
    return torch.cat([on_integers, others], dim=1).to(torch.uint8)


@pytest.mark.parametrize("device", DEVICES)
def test_grayscale_of_every_color_and_torchvision(device):
    """torchvision's formula (float32, then .to(uint8)) agrees with tk's exact
    truncation except where the weighted sum is an exact integer and its float32
    roundings land just below it: there it is one less."""
    rgb = colors(device)
    img = rgb.reshape(3, 1, -1)
    gray = tk.rgb_to_grayscale(img).long().flatten()
    assert torch.equal(gray, grayscale_exact(img).flatten())
    r, g, b = rgb.unbind(0)
    torchvision = (0.2989 * r + 0.587 * g + 0.114 * b).to(torch.uint8).long()
    differ = torchvision != gray
    on_integers = (2989 * r.long() + 5870 * g.long() + 1140 * b.long()) % 10000 == 0
    assert differ.sum() < 100  # a handful of colors
    assert device == "cuda" or differ.any()  # the CPU sample holds every candidate: some differ
    assert bool((on_integers | ~differ).all())  # only where the sum is an exact integer
    assert torch.equal(torchvision[differ], gray[differ] - 1)  # and there one less
    if device == "cuda":
        assert gray.max() == 254  # white: the weights sum to 0.9999


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_grayscale_of_float_images_matches_float64(device, dtype):
    for shape in image_shapes(device):
        img = torch.rand(shape, device=device, dtype=dtype)
        for layout, view in image_layouts(img):
            gray = tk.rgb_to_grayscale(view)
            assert gray.shape == shape[:-3] + shape[-2:], layout
            assert_close(gray, grayscale_float64(view), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_grayscale_backward_matches_pytorch(device, dtype):
    img = torch.rand(pick(device, (2, 3, 17, 19), (8, 3, 1080, 1920)), device=device, dtype=dtype)
    grad = torch.randn(img.shape[:-3] + img.shape[-2:], device=device, dtype=dtype)
    for layout, view in image_layouts(img):
        (dimg,) = backward(tk.rgb_to_grayscale, view, grad=grad)
        (dimg64,) = float64_backward(grayscale_float64, view, grad=grad)
        assert_close(dimg, dimg64, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_grayscale_of_empty_images(device):
    for shape in [(0, 3, 4, 5), (3, 0, 5), (3, 4, 0), (2, 0, 3, 4, 5)]:
        for dtype in [torch.uint8, torch.float32]:
            img = torch.zeros(shape, dtype=dtype, device=device)
            assert tk.rgb_to_grayscale(img).shape == shape[:-3] + shape[-2:]
    assert tk.rgb_to_grayscale_backward(torch.zeros(0, 4, 5, device=device)).shape == (0, 3, 4, 5)


# ----------------------------------------------------------- shared properties


@pytest.mark.parametrize("device", DEVICES)
def test_dense_inputs_keep_their_layout(device):
    """A dense non-standard layout is read in place: the output has the same strides."""
    x = torch.randn(2, 3, 8, 9, device=device).to(memory_format=torch.channels_last)
    y = torch.randn_like(x)
    assert y.stride() == x.stride()
    for out in [tk.copy(x), tk.square(x), tk.add(x, y), tk.swiglu(x, y), tk.geglu(x, y)]:
        assert out.stride() == x.stride()
    assert tk.square_backward(x, y).stride() == x.stride()
    assert all(t.stride() == x.stride() for t in tk.swiglu_backward(x, x, y))


def test_launch_rule_covers_every_element():
    sizes = [1, 1000, 4097, (1 << 17) - 1, 1 << 17, (1 << 18) + 3, 1 << 20, 1 << 22, (1 << 22) + 1, (1 << 31) + 5]
    for device in [torch.device("cpu"), torch.device("cuda")]:
        for n, per_thread in itertools.product(sizes, [1, 2, 4, 8, 16]):
            block, warps = elementwise_config(n, device, per_thread)
            (programs,) = elementwise_grid(n, block)
            assert block & (block - 1) == 0  # a power of two, as tl.arange needs
            assert (programs - 1) * block < n <= programs * block  # all covered, no empty program
            if device.type == "cuda":
                taken = block // (warps * 32)  # elements a thread
                assert warps == 8 and 1 <= taken <= per_thread
                # The count asked for, unless a thread's share would leave fewer than 512
                # programs: then the largest share that keeps 512, or one element.
                assert taken == per_thread or n // block < 2 * 512
                assert taken == 1 or n // block >= 512


def test_launch_rule_spreads_small_tensors_over_programs():
    """Below 2**18 elements a thread takes one element; from 2**20 the count asked for."""
    cuda = torch.device("cuda")
    assert elementwise_config(4096, cuda, 8) == (256, 8)  # 16 programs, not 4 of 1024
    assert elementwise_config(1 << 16, cuda, 8) == (256, 8)  # 256 programs
    assert elementwise_config(1 << 18, cuda, 8) == (512, 8)  # two a thread, 512 programs
    assert elementwise_config(1 << 19, cuda, 2) == (512, 8)  # capped by the count asked for
    assert elementwise_config(1 << 20, cuda, 8) == (2048, 8)
    assert elementwise_config(1 << 28, cuda, 4) == (1024, 8)


def test_launch_rule_guards_a_symbolic_size_only_at_its_thresholds():
    """Under torch.compile with dynamic shapes the element count is symbolic: the
    rule may compare it with its thresholds (one guard each) but must not pin it
    to a narrow range, or every other size would compile again."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    cuda = torch.device("cuda")

    def guards_of(rule, size, per_thread):
        env = ShapeEnv()
        symbolic = env.create_symintnode(env.create_symbol(size, ConstantSource("n")), hint=size)
        # (block, warps), plain ints; rgb's third value, the grid, stays symbolic.
        assert rule(symbolic, cuda, per_thread)[:2] == rule(size, cuda, per_thread)[:2]
        return [str(guard.expr) for guard in env.guards]

    for size, per_thread in [(1 << 28, 8), (3 << 20, 2), (70_000, 8), (5000, 2)]:
        for rule in [elementwise_config, rgb_ops._image_config]:
            guards = guards_of(rule, size, per_thread)
            # A threshold reads "s0 >= 262144" (or its negation); a pin reads "Eq(...)" or
            # compares a quotient of the size.
            assert not any("Eq" in guard or "//" in guard for guard in guards), (rule, size, guards)


# Elements a thread (one input, two inputs, three inputs) by element size, as per_thread_for gives them.
_COUNTS = {
    "interpreter": {4: (8, 2, 2), 2: (8, 4, 4), 8: (8, 1, 1)},  # the H100's 16 bytes a thread
    "H200": {4: (8, 4, 2), 2: (16, 8, 4), 8: (8, 2, 1)},  # 32 bytes a thread
}


@pytest.mark.parametrize("facts", sorted(_COUNTS))
def test_each_op_asks_the_launch_rule_for_its_count_a_thread(monkeypatch, facts):
    """Each op asks per_thread_for with its own count of inputs: on the interpreter (the H100's 16
    bytes a thread) one-input kernels take 8 elements a thread and kernels of two or more inputs
    8 bytes of each; told it runs on an H200 (32 bytes), one 16-bit input takes 16, two 8, three
    (swiglu's backward, rgb_to_grayscale's planes) 4.  The 16-bit erf GELU backward takes at least 8."""
    from ops.blocks import elementwise
    from ops.runtime import H200

    if facts == "H200":  # the rule's device; the kernels still run on the interpreter, which ignores the count
        monkeypatch.setattr(elementwise, "device_facts", lambda device: H200)
    asked = []
    default = inspect.signature(elementwise_config).parameters["per_thread"].default

    def spy(n, device, per_thread=default):
        asked.append(per_thread)
        return elementwise_config(n, device, per_thread)

    for module in ["tour.copy", "tour.square", "tour.add", "gelu", "swiglu", "tour.rgb_to_grayscale"]:
        monkeypatch.setattr(importlib.import_module(f"ops.{module}"), "elementwise_config", spy)
    for dtype in [torch.float32, torch.bfloat16, torch.float16, torch.float64]:
        x, y = torch.randn(2, 100, dtype=dtype), torch.randn(2, 100, dtype=dtype)
        one, two, three = _COUNTS[facts][x.element_size()]
        erf_backward = max(two, 8) if x.element_size() == 2 else two
        calls = [
            (lambda: tk.copy(x), one),
            (lambda: tk.square(x), one),
            (lambda: tk.gelu(x), one),
            (lambda: tk.gelu(x, "tanh"), one),
            (lambda: tk.square_backward(x, y), two),
            (lambda: tk.add(x, y), two),
            (lambda: tk.gelu_backward(x, y, "tanh"), two),
            (lambda: tk.gelu_backward(x, y, "none"), erf_backward),
            (lambda: tk.swiglu(x, y), two),
            (lambda: tk.geglu(x, y), two),
            (lambda: tk.swiglu_backward(x, x, y), three),
            (lambda: tk.geglu_backward(x, x, y), three),
            (lambda: tk.rgb_to_grayscale(x.reshape(2, 4, 5, 5)[:, :3]), three),  # three planes read
            (lambda: tk.rgb_to_grayscale_backward(x), one),  # one read, three written
        ]
        for i, (call, expected) in enumerate(calls):
            asked.clear()
            call()
            assert asked == [expected], (dtype, i)
    asked.clear()
    tk.rgb_to_grayscale(torch.randint(0, 256, (3, 4, 5), dtype=torch.uint8))
    assert asked == [8]  # 8 bytes of each plane on both


def test_the_count_a_thread_follows_the_bytes_the_memory_wants_in_flight():
    """16 bytes a thread in all at the H100's bandwidth, 32 at the H200's (and at any faster one:
    the most measured), shared among the inputs, at least 8 bytes each; a one-input kernel takes
    at least 8 elements."""
    from ops.blocks.elementwise import loaded_bytes_a_thread, per_thread_for
    from ops.runtime import H100, H200, INTERPRETER

    assert [loaded_bytes_a_thread(f) for f in (INTERPRETER, H100, H200)] == [16, 16, 32]
    for gbps, expected in [(0, 16), (2000, 16), (3900, 16), (4800, 32), (8000, 32), (10000, 32), (10**7, 32)]:
        assert loaded_bytes_a_thread(dataclasses.replace(H100, memory_gbps=gbps)) == expected, gbps
    # (element size, inputs): elements a thread on the H100, on the H200 (perf notes, versions 35 and 60)
    table = {
        (2, 1): (8, 16), (2, 2): (4, 8), (2, 3): (4, 4),
        (4, 1): (8, 8), (4, 2): (2, 4), (4, 3): (2, 2),
        (8, 1): (8, 8), (8, 2): (1, 2), (1, 3): (8, 8), (1, 1): (16, 32),
    }
    for (size, inputs), counts in table.items():
        assert (per_thread_for(H100, size, inputs), per_thread_for(H200, size, inputs)) == counts, (size, inputs)


def test_image_launch_keeps_the_count_a_thread_on_small_images():
    """rgb_to_grayscale's block is cut to the image (the next power of two of its
    pixels), and its warps with it, so each thread keeps the elements the rule gave."""
    cuda = torch.device("cuda")
    for n_pixels, per_thread in itertools.product([1, 100, 4096, 5000, 1 << 20, 2160 * 3840], [2, 8]):
        block, warps, blocks_per_image = rgb_ops._image_config(n_pixels, cuda, per_thread)
        rule_block, rule_warps = elementwise_config(n_pixels, cuda, per_thread)
        taken = rule_block // (32 * rule_warps)
        assert block == min(rule_block, next_power_of_2(n_pixels))
        assert block == warps * 32 * taken or (warps == 1 and block < 32 * taken)
        assert (blocks_per_image - 1) * block < n_pixels <= blocks_per_image * block


def test_launch_rule_refuses_a_count_a_thread_that_is_not_a_power_of_two():
    with pytest.raises(ValueError, match="per_thread"):
        elementwise_config(1 << 22, torch.device("cuda"), per_thread=12)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    shape=st.lists(st.integers(0, 6), min_size=0, max_size=4),
    permutation_seed=st.integers(0, 1000),
    step=st.integers(1, 3),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]),
)
def test_any_view_against_float64(shape, permutation_seed, step, dtype):
    """Random shapes, dim orders and steps: add, square and swiglu on whatever view results."""
    generator = torch.Generator().manual_seed(permutation_seed)
    base = torch.randn([s * step for s in shape], generator=generator).to(dtype)
    view = base[tuple(slice(None, None, step) for _ in shape)]
    order = torch.randperm(len(shape), generator=generator).tolist()
    a = view.permute(order)
    b = torch.randn(a.shape, generator=generator).to(dtype)
    assert_close(tk.add(a, b), a.double() + b.double(), dtype)
    assert_close(tk.square(a), a.double() ** 2, dtype)
    assert_close(tk.swiglu(a, b), F.silu(a.double()) * b.double(), dtype)
    assert torch.equal(tk.copy(a), a)


# ------------------------------------------------------------------- gradcheck


def test_gradcheck_in_float64():
    def t(*shape):
        return torch.randn(shape, dtype=torch.float64, requires_grad=True)

    cases = [
        (tk.copy, (t(3, 7),)),
        (tk.square, (t(3, 7),)),
        (tk.add, (t(3, 7), t(3, 7))),
        (tk.rgb_to_grayscale, (torch.rand(2, 3, 4, 5, dtype=torch.float64, requires_grad=True),)),
        (tk.swiglu, (t(3, 7), t(3, 7))),
        (lambda g, u: tk.geglu(g, u, "tanh"), (t(3, 7), t(3, 7))),
        (lambda g, u: tk.geglu(g, u, "none"), (t(3, 7), t(3, 7))),
    ]
    for fn, inputs in cases:
        assert torch.autograd.gradcheck(fn, inputs, fast_mode=True)


# --------------------------------------------------------------------- opcheck


def opcheck_cases(device):
    def t(*shape, grad=False, dtype=torch.float32):
        return torch.randn(shape, device=device, dtype=dtype, requires_grad=grad)

    image = torch.randint(0, 256, (2, 3, 5, 7), dtype=torch.uint8, device=device)
    return [
        (tk.copy.default, (t(5, 7, grad=True),)),
        (tk.copy.default, (torch.arange(12, device=device, dtype=torch.int32).reshape(3, 4).t(),)),
        (tk.square.default, (t(5, 7, grad=True),)),
        (tk.square.default, (t(4, 1, 3, dtype=torch.bfloat16).transpose(0, 2),)),
        (tk.square_backward.default, (t(5, 7), t(5, 7))),
        (tk.add.default, (t(5, 7, grad=True), t(5, 7, grad=True))),
        (tk.add.default, (t(7, 5).t(), t(5, 7))),
        (tk.rgb_to_grayscale.default, (torch.rand(2, 3, 5, 7, device=device, requires_grad=True),)),
        (tk.rgb_to_grayscale.default, (image,)),
        (tk.rgb_to_grayscale.default, (image.contiguous(memory_format=torch.channels_last)[0],)),
        (tk.rgb_to_grayscale_backward.default, (t(2, 5, 7),)),
        (tk.swiglu.default, (t(5, 7, grad=True), t(5, 7, grad=True))),
        (tk.swiglu_backward.default, (t(5, 7), t(5, 7), t(5, 7))),
        (tk.geglu.default, (t(5, 7, grad=True), t(5, 7, grad=True), "none")),
        (tk.geglu.default, (t(5, 7, dtype=torch.float16), t(5, 7, dtype=torch.float16))),
        (tk.geglu_backward.default, (t(5, 7), t(5, 7), t(5, 7), "tanh")),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for op, args in opcheck_cases(device):
        torch.library.opcheck(op, args)


def test_every_op_has_a_spec_and_its_backward_ops():
    for name in ["copy", "square", "add", "rgb_to_grayscale", "swiglu", "geglu"]:
        spec = ops.get_spec(name)
        assert set(spec.tolerance) >= set(spec.dtypes)
        assert spec.shapes["cpu"] and spec.shapes["cuda"]
    for name in ["square_backward", "rgb_to_grayscale_backward", "swiglu_backward", "geglu_backward"]:
        assert hasattr(tk, name)


def test_grayscale_spec_handles_uint8_images():
    """The harness passes uint8 inputs through unconverted: the spec's float64
    answer must then be the exact truncation, and torchvision's formula within tolerance."""
    spec = ops.get_spec("rgb_to_grayscale")
    for shape in spec.shapes["cpu"]:
        (img,) = spec.make_inputs(shape, torch.uint8, torch.device("cpu"))
        assert img.dtype == torch.uint8 and int(img.max()) > 200
        expected = spec.reference64(img)
        assert torch.equal(spec.tk(img).double(), expected)
        assert rel_error(spec.reference(img), expected) <= spec.tolerance[torch.uint8]
        assert spec.bytes_moved(shape, torch.uint8) == 4 * img[:, 0].numel()


# ---------------------------------------------------------------------- errors

ERROR_CASES = [
    ("copy bool", lambda: tk.copy(torch.ones(3, dtype=torch.bool)), TypeError, r"tk\.copy: x has dtype bool"),
    ("copy complex", lambda: tk.copy(torch.ones(3, dtype=torch.complex64)), TypeError, r"tk\.copy: x has dtype complex64"),
    ("square int", lambda: tk.square(torch.ones(3, dtype=torch.int32)), TypeError, r"tk\.square: x has dtype int32"),
    (
        "square_backward shapes",
        lambda: tk.square_backward(torch.ones(3, 4), torch.ones(4, 3)),
        ValueError,
        r"tk\.square_backward: grad has shape \(3, 4\) but x has \(4, 3\)",
    ),
    ("add uint8", lambda: tk.add(torch.ones(3, dtype=torch.uint8), torch.ones(3)), TypeError, r"tk\.add: a has dtype uint8"),
    (
        "add dtypes",
        lambda: tk.add(torch.ones(3), torch.ones(3, dtype=torch.float16)),
        TypeError,
        r"tk\.add: a has dtype torch\.float32 but b has dtype torch\.float16",
    ),
    (
        "add no broadcasting",
        lambda: tk.add(torch.ones(4, 1), torch.ones(3)),
        ValueError,
        r"tk\.add: a has shape \(4, 1\) but b has \(3,\); tk\.add does not broadcast",
    ),
    ("add devices", lambda: tk.add(torch.ones(3), torch.ones(3, device="meta")), ValueError, r"tk\.add: a is on cpu but b is on meta"),
    (
        "grayscale 2-D",
        lambda: tk.rgb_to_grayscale(torch.ones(4, 5)),
        ValueError,
        r"tk\.rgb_to_grayscale: img must have shape \(\*, 3, H, W\) \(channels first, RGB\), got shape \(4, 5\)",
    ),
    (
        "grayscale RGBA",
        lambda: tk.rgb_to_grayscale(torch.ones(2, 4, 5, 6, dtype=torch.uint8)),
        ValueError,
        r"tk\.rgb_to_grayscale: img must have shape \(\*, 3, H, W\).*got shape \(2, 4, 5, 6\)",
    ),
    (
        "grayscale channels last",
        lambda: tk.rgb_to_grayscale(torch.ones(5, 6, 3)),
        ValueError,
        r"got shape \(5, 6, 3\)",
    ),
    (
        "grayscale int16",
        lambda: tk.rgb_to_grayscale(torch.ones(3, 4, 5, dtype=torch.int16)),
        TypeError,
        r"tk\.rgb_to_grayscale: img has dtype int16; supported: .*uint8",
    ),
    (
        "grayscale_backward 1-D",
        lambda: tk.rgb_to_grayscale_backward(torch.ones(5)),
        ValueError,
        r"tk\.rgb_to_grayscale_backward: grad must have shape \(\*, H, W\), got shape \(5,\)",
    ),
    (
        "grayscale_backward uint8",
        lambda: tk.rgb_to_grayscale_backward(torch.ones(4, 5, dtype=torch.uint8)),
        TypeError,
        r"tk\.rgb_to_grayscale_backward: grad has dtype uint8",
    ),
    (
        "swiglu shapes",
        lambda: tk.swiglu(torch.ones(3, 4), torch.ones(3, 5)),
        ValueError,
        r"tk\.swiglu: gate has shape \(3, 4\) but up has \(3, 5\)",
    ),
    ("swiglu int", lambda: tk.swiglu(torch.ones(3), torch.ones(3, dtype=torch.int64)), TypeError, r"tk\.swiglu: up has dtype int64"),
    (
        "swiglu dtypes",
        lambda: tk.swiglu(torch.ones(3, dtype=torch.bfloat16), torch.ones(3)),
        TypeError,
        r"tk\.swiglu: gate has dtype torch\.bfloat16 but up has dtype torch\.float32",
    ),
    ("swiglu devices", lambda: tk.swiglu(torch.ones(3), torch.ones(3, device="meta")), ValueError, r"tk\.swiglu: gate is on cpu but up is on meta"),
    (
        "swiglu_backward shapes",
        lambda: tk.swiglu_backward(torch.ones(3, 4), torch.ones(3, 4), torch.ones(4, 3)),
        ValueError,
        r"tk\.swiglu_backward: grad has shape \(3, 4\) but up has \(4, 3\)",
    ),
    (
        "geglu approximate",
        lambda: tk.geglu(torch.ones(3), torch.ones(3), "erf"),
        ValueError,
        r"tk\.geglu: approximate must be 'none' or 'tanh', got 'erf'",
    ),
    (
        "geglu_backward shapes",
        lambda: tk.geglu_backward(torch.ones(3), torch.ones(4), torch.ones(4), "none"),
        ValueError,
        r"tk\.geglu_backward: grad has shape \(3,\) but gate has \(4,\)",
    ),
]


@error_cases(ERROR_CASES)
def test_bad_input_raises_a_clear_error(case):
    assert_raises_clearly(case)


@pytest.mark.gpu
def test_device_mismatch_on_cuda():
    with pytest.raises(ValueError, match=r"tk\.add: a is on cuda:0 but b is on cpu"):
        tk.add(torch.ones(3, device="cuda"), torch.ones(3))
    with pytest.raises(ValueError, match=r"tk\.geglu: gate is on cpu but up is on cuda:0"):
        tk.geglu(torch.ones(3), torch.ones(3, device="cuda"))


# ------------------------------------------------------------- torch.compile


def tour(x, w_gate, w_up, img):
    """Every op of this file, the way a model calls them."""
    gate, up = x @ w_gate, x @ w_up
    hidden = tk.add(tk.swiglu(gate, up), tk.geglu(gate, up, "none"))
    hidden = tk.copy(tk.add(hidden, tk.square(gate)))
    return hidden, tk.rgb_to_grayscale(img)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_tour_matches_eager(device):
    torch._dynamo.reset()
    x = torch.randn(pick(device, 9, 512), 16, device=device)
    w_gate = torch.randn(16, pick(device, 24, 4096), device=device, requires_grad=True)
    w_up = torch.randn_like(w_gate, requires_grad=True)
    img = torch.rand(2, 3, 9, 11, device=device, requires_grad=True)

    def run(fn):
        hidden, gray = fn(x, w_gate, w_up, img)
        weight = torch.linspace(-1, 1, hidden.numel(), device=device).reshape(hidden.shape)
        grads = torch.autograd.grad((hidden * weight).sum() + gray.sum(), (w_gate, w_up, img))
        return (hidden, gray, *grads)

    compiled = torch.compile(tour, fullgraph=True, dynamic=False)  # fullgraph: any graph break is an error
    for got, want in zip(run(compiled), run(tour)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # uint8, and a strided view the kernel reads in place (the RGB of an RGBA batch)
    rgba = torch.randint(0, 256, (2, 4, 8, 9), dtype=torch.uint8, device=device)
    for image in [rgba[0, :3], rgba[:, 1:]]:
        _, gray = compiled(x, w_gate, w_up, image)
        assert torch.equal(gray.long(), grayscale_exact(image))


# --------------------------------------------------------- past 2**31 elements


@pytest.mark.gpu
@pytest.mark.big_memory
def test_tensors_past_2_to_the_31_elements():
    """int64 offsets: with int32, the programs past 2**31 / BLOCK_SIZE would wrap around."""
    n = (1 << 31) + 4099
    x = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
    assert torch.equal(tk.copy(x), x)
    del x
    x = torch.randn(n, device="cuda", dtype=torch.float16)
    y = tk.square(x)
    for part in [slice(0, 1 << 20), slice(n - (1 << 24), n)]:  # the first elements and the last ones
        assert_close(y[part], x[part].double() ** 2, torch.float16)


@pytest.mark.gpu
def test_the_gpu_reports_its_memory_bandwidth():
    """The rule's input on a real GPU: the driver's peak bandwidth (an H100 SXM 3352 GB/s, an H200 4814), not
    the 0 that would silently give every device the H100's counts."""
    from ops.runtime import device_facts

    assert device_facts(torch.device("cuda")).memory_gbps > 1000
