"""gelu_cuda: the CUDA rung of the lessons: ops/gelu.py's GELU written in CUDA C++.

    gelu(x)      = 0.5 * x * (1 + erf(x / sqrt(2)))                       approximate="none"
    gelu_tanh(x) = x * sigmoid(2 * sqrt(2/pi) * (x + 0.044715 x^3))        approximate="tanh"

The CS336 kernels lecture climbs one ladder for one function, and the gelu
report (``make compare OP=gelu``, and OP=gelu_tanh) has every rung side by side:

    eager            F.gelu: PyTorch's own CUDA kernel
    eager-unfused    the formula in PyTorch ops: a kernel per op, each a pass over memory
    compile          torch.compile: Inductor fuses them into one Triton kernel
    cuda             this file: one CUDA kernel written by hand
    tk               ops/gelu.py: one Triton kernel written by hand

In CUDA the unit of work is one *thread*, not a Triton program's block: each
thread computes its own index, checks it against the end (the last block hangs
past it) and handles one element.  Everything Triton does for us is written
out: the index arithmetic (in 64 bits), the widening of 16-bit values to float32
and the rounding back, the grid, the stream and the launch check.

This is not a tk op: nothing registers it, and it is built with
``torch.utils.cpp_extension.load_inline`` the first time the harness runs the
variant, where there is a CUDA device and nvcc (nvcc took 34 s on the kernel's
file and c++ 22 s on the bindings on a 2-core CPU machine; then cached where
cpp_extension caches its builds).  Elsewhere, or when the build fails,
``load`` raises ImportError with the reason, and the harness reports the
variant as skipped with it, as it does for a peer library that is not installed.
"""

import functools
from pathlib import Path

import torch

from ..runtime.native import build_directory, build_tools_on_path, clear_stale_lock, torch_tag

CUDA_SOURCE = r"""
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/types.h>

#include <cstdint>

constexpr int kThreads = 256;  // threads per block: a multiple of the warp's 32 (untuned: this rung is the plain one)

// T is the compute type: float for float16, bfloat16 and float32 storage; double for double.
template <typename T, bool kTanh>
__device__ T gelu_value(T x) {
  if (kTanh) {
    // 0.5 * (1 + tanh(u)) is sigmoid(2u): the same function without the cancellation of
    // 1 + tanh(u) for large negative x (ops/gelu.py computes it the same way).
    const T u = T(0.7978845608028654) * (x + T(0.044715) * x * x * x);
    return x / (T(1) + ::exp(T(-2) * u));
  }
  return T(0.5) * x * (T(1) + ::erf(x * T(0.7071067811865476)));
}

template <typename scalar_t, bool kTanh>
__global__ void gelu_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, int64_t n) {
  // Widen before multiplying: as an int the index turns negative past 2^31 elements.
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {  // the last block hangs past the end
    using opmath_t = at::opmath_type<scalar_t>;  // widen 16-bit values once, round once at the store
    y[i] = static_cast<scalar_t>(gelu_value<opmath_t, kTanh>(static_cast<opmath_t>(x[i])));
  }
}

at::Tensor gelu(const at::Tensor& x, bool tanh) {
  TORCH_CHECK(x.is_cuda(), "gelu_cuda: x must be a CUDA tensor");
  TORCH_CHECK(x.is_contiguous(), "gelu_cuda: x must be contiguous (the kernel reads it as one flat array)");
  at::Tensor y = at::empty_like(x);
  const int64_t n = x.numel();
  if (n == 0) {
    return y;  // a launch of zero blocks is an error
  }
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  TORCH_CHECK(blocks <= INT32_MAX, "gelu_cuda: ", n, " elements need more blocks than a grid holds");
  const c10::cuda::CUDAGuard device(x.device());  // launch on x's GPU, whichever is current
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "gelu_cuda", [&] {
    const auto kernel = tanh ? gelu_kernel<scalar_t, true> : gelu_kernel<scalar_t, false>;
    kernel<<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(
        x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), n);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
"""

CPP_SOURCE = "at::Tensor gelu(const at::Tensor& x, bool tanh);"  # what load_inline binds for Python


def missing() -> str | None:
    """What this machine lacks to build and run the CUDA GELU, in words; None when nothing."""
    if not torch.cuda.is_available():
        build = "" if torch.version.cuda else f", torch {torch.__version__} is built without CUDA"
        return f"no CUDA device{build}"
    from torch.utils.cpp_extension import CUDA_HOME

    return nvcc_missing(CUDA_HOME)


def nvcc_missing(cuda_home: str | None) -> str | None:
    """Why cpp_extension would find no nvcc under ``cuda_home`` (its CUDA_HOME), or None when it would."""
    if cuda_home is None:
        return "no nvcc: CUDA_HOME is not set, nvcc is not on PATH and /usr/local/cuda is absent"
    if not (Path(cuda_home) / "bin" / "nvcc").exists():
        return f"no nvcc in CUDA_HOME's bin, {Path(cuda_home) / 'bin'}"
    return None


def build():
    """Compile the extension with nvcc (or load the cached build): its module, with ``gelu(x, tanh)``."""
    from torch.utils.cpp_extension import load_inline

    name = f"tk_gelu_cuda_{torch_tag()}"
    folder = build_directory(name)
    clear_stale_lock(folder)  # a killed build's lock would make load_inline wait forever
    with build_tools_on_path():
        return load_inline(
            name=name, cpp_sources=CPP_SOURCE, cuda_sources=CUDA_SOURCE, functions=["gelu"], build_directory=str(folder)
        )


@functools.cache
def built() -> tuple[object | None, str]:
    """(the module, "") or (None, why not): tried once per process, so a failed build is not
    repeated for every shape of a sweep."""
    lacking = missing()
    if lacking is not None:
        return None, lacking
    try:
        return build(), ""
    except Exception as error:  # a compiler error, no ninja, a toolkit torch cannot use: the run goes on
        return None, f"the CUDA GELU's build failed: {type(error).__name__}: {_gist(str(error))}"


def _gist(message: str, most: int = 600) -> str:
    """The lines of a build's output that say what went wrong (a compiler's `error`, ninja's FAILED), else its
    end: cpp_extension's message opens with the whole nvcc command line, which says nothing of the cause."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    telling = [line for line in lines if "error:" in line.lower() or line.startswith("FAILED")]
    text = " | ".join(telling or lines[-3:])
    return text if len(text) <= most else text[: most - 3] + "..."


def load(approximate: str):
    """The CUDA GELU as a function of x (the harness's loader); ImportError saying why where it cannot run."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu_cuda: approximate must be 'none' or 'tanh', got {approximate!r}")
    module, why = built()
    if module is None:
        raise ImportError(why)
    tanh = approximate == "tanh"
    # The kernel walks x as one flat array in memory order: a strided view (a transpose, a slice)
    # would be read out of order, so it gets a dense copy first (no copy when x is already dense).
    return lambda x: module.gelu(x.contiguous(), tanh)
