"""rgb_to_grayscale: the fourth stop of the tour (see ops/tour/copy.py): strides.

    gray = 0.2989 * R + 0.5870 * G + 0.1140 * B        (ITU-R 601 luma weights)

``img`` is (*, 3, H, W), channels first, with any number of leading batch
dimensions (a single (3, H, W) image or a (B, 3, H, W) batch); the result is
(*, H, W).  Supported dtypes: uint8, float32, float16, bfloat16, float64.

* Float images give a float image of the same dtype, computed in float32
  (float64 for float64), rounded once at the store.  No clamping.
* uint8 images give uint8, truncated toward zero like torchvision's
  ``rgb_to_grayscale`` (it computes in float32, then ``.to(torch.uint8)``):
  white (255, 255, 255) becomes 254, since the weights sum to 0.9999.  tk
  computes the truncation exactly, in integers:
  (2989 R + 5870 G + 1140 B) // 10000.  The results agree with
  torchvision's everywhere except for 20 of the 2**24 colors, those where
  the weighted sum is an exact integer and torchvision's float32 roundings
  land just below it (for (20, 152, 7), 95 exactly, torchvision gives 94).

Backward (float images only; uint8 tensors carry no gradient): each channel
gets its weight times the incoming gradient, dimg[c] = w_c * dgray.

New on the tour: the kernel reads three planes of a strided tensor.  The
input is seen as (N, 3, P), N images of P = H * W pixels, and the kernel
takes the three strides as arguments.  So a channels-last image or a slice
of the channels of an RGBA image is read where it lies, with no copy, as
long as its H and W dims merge into one strided dim (otherwise ``reshape``
copies it once).
"""

import math

import torch
import triton
import triton.language as tl

from ..blocks.elementwise import elements_per_thread, elementwise_config, to_compute_dtype
from ..blocks.sizes import at_most, cdiv, next_power_of_2
from ..runtime import FLOAT_DTYPES, GRAD, check_tensor, launcher, register_formula, register_op
from ..spec import ROUNDING_TOLERANCE, OpSpec, element_size, register_spec

# The weights as the kernel uses them.  Globals read by a kernel must be
# tl.constexpr: their values are baked into the compiled code.
WEIGHT_R = tl.constexpr(0.2989)
WEIGHT_G = tl.constexpr(0.587)
WEIGHT_B = tl.constexpr(0.114)
# The same weights in units of 1/10000, for exact integer math on uint8.
INT_WEIGHT_R = tl.constexpr(2989)
INT_WEIGHT_G = tl.constexpr(5870)
INT_WEIGHT_B = tl.constexpr(1140)
INT_SCALE = tl.constexpr(10000)

WEIGHTS = (0.2989, 0.587, 0.114)
DTYPES = FLOAT_DTYPES + (torch.uint8,)


@triton.jit
def _image_block(blocks_per_image, BLOCK_SIZE: tl.constexpr):
    """(image index n, pixel offsets p) of this program.

    The grid has blocks_per_image programs per image, one after the other, so
    one scalar division per program (not one per element) splits the program
    id into the image and the block within it.  n is int64: n * stride may
    pass 2**31.
    """
    pid = tl.program_id(0)
    n = (pid // blocks_per_image).to(tl.int64)
    block = pid % blocks_per_image
    pixels = block.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    return n, pixels


@triton.jit
def rgb_to_grayscale_kernel(
    img_ptr, gray_ptr,
    n_pixels, blocks_per_image,
    stride_image, stride_channel, stride_pixel,
    BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    n, pixels = _image_block(blocks_per_image, BLOCK_SIZE)
    # The last block of each image hangs past its P pixels (into the next
    # image, or past the end of the tensor): the mask switches those lanes off.
    mask = pixels < n_pixels
    # Where the red value of each pixel lies; green and blue are one and two
    # channel strides further.  Strides are in elements: the pointer's type
    # scales them to bytes.
    red = img_ptr + n * stride_image + pixels * stride_pixel
    r = tl.load(red, mask=mask)
    g = tl.load(red + stride_channel, mask=mask)
    b = tl.load(red + 2 * stride_channel, mask=mask)
    if r.dtype == tl.uint8:  # resolved at compile time: a uint8 kernel and a float one
        # Exact integer math: at most 9999 * 255 = 2549745, far inside int32.
        # The floor division by 10000 is the truncation (all terms are >= 0).
        weighted = r.to(tl.int32) * INT_WEIGHT_R + g.to(tl.int32) * INT_WEIGHT_G + b.to(tl.int32) * INT_WEIGHT_B
        gray = weighted // INT_SCALE
    else:
        gray = to_compute_dtype(r) * WEIGHT_R + to_compute_dtype(g) * WEIGHT_G + to_compute_dtype(b) * WEIGHT_B
    # The output is (N, P), contiguous: pixel p of image n is at n * P + p.
    tl.store(gray_ptr + n * n_pixels + pixels, gray.to(gray_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rgb_to_grayscale_backward_kernel(grad_ptr, dimg_ptr, n_pixels, blocks_per_image, BLOCK_SIZE: tl.constexpr):
    """dimg[n, c, p] = w_c * grad[n, p]: one read, three writes; both tensors contiguous."""
    n, pixels = _image_block(blocks_per_image, BLOCK_SIZE)
    mask = pixels < n_pixels
    grad = to_compute_dtype(tl.load(grad_ptr + n * n_pixels + pixels, mask=mask))
    red = dimg_ptr + n * 3 * n_pixels + pixels
    out_dtype = dimg_ptr.dtype.element_ty
    tl.store(red, (grad * WEIGHT_R).to(out_dtype), mask=mask)
    tl.store(red + n_pixels, (grad * WEIGHT_G).to(out_dtype), mask=mask)
    tl.store(red + 2 * n_pixels, (grad * WEIGHT_B).to(out_dtype), mask=mask)


def _image_config(n_pixels: int, device: torch.device, per_thread: int) -> tuple[int, int, int]:
    """(BLOCK_SIZE, num_warps, blocks_per_image) for images of n_pixels.

    The elementwise rule (see ``elementwise_config``) for ``per_thread``
    elements a thread, with the block no larger than an image needs (the
    next power of two of its pixel count), so that a batch of small images
    does not launch mostly idle lanes; the warps shrink with the block, so
    that each thread keeps the count the rule gave it.
    """
    block, warps = elementwise_config(n_pixels, device, per_thread)
    taken = max(block // (32 * warps), 1)  # elements a thread
    block = next_power_of_2(at_most(n_pixels, block))  # at_most: one guard on a symbolic size
    warps = min(warps, max(block // (32 * taken), 1))
    return block, warps, cdiv(n_pixels, block)


def _check_image(op: str, arg: str, t: torch.Tensor, channels: int, dtypes) -> None:
    check_tensor(op, arg, t, dtypes=dtypes)
    rank = 3 if channels == 3 else 2
    if t.dim() < rank or (channels == 3 and t.shape[-3] != 3):
        want = "(*, 3, H, W) (channels first, RGB)" if channels == 3 else "(*, H, W)"
        raise ValueError(f"tk.{op}: {arg} must have shape {want}, got shape {tuple(t.shape)}")


def _rgb_to_grayscale(img: torch.Tensor) -> torch.Tensor:
    _check_image("rgb_to_grayscale", "img", img, 3, DTYPES)
    *batch, _, height, width = img.shape
    n_images, n_pixels = math.prod(batch), height * width
    gray = torch.empty(*batch, height, width, dtype=img.dtype, device=img.device)
    if gray.numel() == 0:
        return gray
    # (N, 3, P): a view when H and W merge into one strided dim, else a copy.
    planes = img.reshape(n_images, 3, n_pixels)
    # Three planes read: the rule of every kernel of several inputs (per_thread_for).
    block, warps, blocks_per_image = _image_config(n_pixels, img.device, elements_per_thread(img, inputs=3))
    launcher(rgb_to_grayscale_kernel, img)[(n_images * blocks_per_image,)](
        planes, gray, n_pixels, blocks_per_image, *planes.stride(), BLOCK_SIZE=block, num_warps=warps
    )
    return gray


def _rgb_to_grayscale_backward(grad: torch.Tensor) -> torch.Tensor:
    _check_image("rgb_to_grayscale_backward", "grad", grad, 1, FLOAT_DTYPES)
    *batch, height, width = grad.shape
    n_images, n_pixels = math.prod(batch), height * width
    dimg = torch.empty(*batch, 3, height, width, dtype=grad.dtype, device=grad.device)
    if dimg.numel() == 0:
        return dimg
    grad = grad.contiguous()  # often a broadcast view (the gradient of a sum): gathered once
    block, warps, blocks_per_image = _image_config(n_pixels, grad.device, elements_per_thread(grad))  # one input
    launcher(rgb_to_grayscale_backward_kernel, grad)[(n_images * blocks_per_image,)](
        grad, dimg, n_pixels, blocks_per_image, BLOCK_SIZE=block, num_warps=warps
    )
    return dimg


rgb_to_grayscale = register_op("rgb_to_grayscale", _rgb_to_grayscale)
rgb_to_grayscale_backward = register_op("rgb_to_grayscale_backward", _rgb_to_grayscale_backward)


# The weights are all the backward needs besides the incoming gradient.
register_formula(rgb_to_grayscale, backward=rgb_to_grayscale_backward, arguments=(GRAD,), gradients={"img": 0})


# --------------------------------------------------------------------------
# What the comparison harness reads.
# --------------------------------------------------------------------------


def torchvision_rgb_to_grayscale(img: torch.Tensor) -> torch.Tensor:
    """torchvision.transforms.functional.rgb_to_grayscale, without its channel dim of 1."""
    r, g, b = img.unbind(dim=-3)
    return (0.2989 * r + 0.587 * g + 0.114 * b).to(img.dtype)


def grayscale_float64(img: torch.Tensor) -> torch.Tensor:
    """The float64 answer: the weighted sum, truncated (exactly) for uint8 images."""
    if img.dtype != torch.uint8:
        return torchvision_rgb_to_grayscale(img.double())
    r, g, b = img.double().unbind(dim=-3)
    # Integer weights: the numerator is exact in float64, and a correctly rounded
    # quotient of an integer by 10000 is never rounded up onto the next integer.
    return torch.floor((2989 * r + 5870 * g + 1140 * b) / 10000)


def _make_inputs(shape, dtype, device):
    batch, height, width = shape
    if dtype == torch.uint8:
        return (torch.randint(0, 256, (batch, 3, height, width), dtype=dtype, device=device),)
    return (torch.rand(batch, 3, height, width, dtype=dtype, device=device),)


def _bytes(shape, dtype):
    batch, height, width = shape
    return 4 * batch * height * width * element_size(dtype)  # read R, G and B, write gray


def _describe(shape):
    batch, height, width = shape
    return f"{batch}x3x{height}x{width}"


register_spec(
    OpSpec(
        name="rgb_to_grayscale",
        tk=lambda img: torch.ops.tk.rgb_to_grayscale(img),
        reference=torchvision_rgb_to_grayscale,
        reference64=grayscale_float64,  # uint8 inputs reach it as they are (only float inputs become float64)
        make_inputs=_make_inputs,
        bytes_moved=_bytes,
        flops=lambda shape, dtype: 5 * shape[0] * shape[1] * shape[2],  # 3 multiplies, 2 adds per pixel
        # uint8: torchvision's float32 formula is off by one on a few colors (see the
        # module docstring).  Gray values have an RMS near 130 for random pixels, so
        # 1e-3 lets about 1.5% of the pixels be off by one, and no more.
        tolerance={**ROUNDING_TOLERANCE, torch.uint8: 1e-3},
        # (batch, H, W) of (batch, 3, H, W) images: 2**12 to 2**28 pixels.
        shapes={
            "cuda": [(1, 64, 64), (1, 256, 256), (1, 1024, 1024), (1, 2160, 3840), (16, 1024, 1024), (64, 1024, 1024), (32, 2160, 3840)],
            "cpu": [(1, 30, 40), (2, 200, 300)],
        },
        describe=_describe,
        dtypes=(torch.uint8, torch.float32),
    )
)
