"""Linear cross entropy's launches: a plan (plan.py) carried out on tensors that op.py has checked.

``run`` walks the rows in the plan's chunks.  For each chunk: its logits x_c @ W^T (+ b) into one
reused buffer (cuBLAS, through torch), the row kernel over them (its losses, and its gradient in
place), then the gradient GEMMs: grad_x_c = dlogits_c @ W into grad_x's rows, grad_W += dlogits_c^T
@ x_c (cuBLAS, or tk's matmul where the plan says), grad_b += the column sums of dlogits_c.  It
allocates, launches and sums what the plan says, and decides nothing.
"""

import torch
import torch.nn.functional as F

from ..blocks.elementwise import elementwise_config
from ..blocks.sizes import cdiv
from ..matmul.op import product_into
from ..runtime import device_facts, launcher
from .kernels import linear_cross_entropy_kernel, scale_in_place_kernel
from .plan import FLOAT32, FLOAT32_TRACED, IN_OUTPUT, TK_GEMM, Plan


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the kernel computes in, and the loss's dtype: float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def run(
    plan: Plan,
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    incoming: torch.Tensor | None,
    ignore_index: int,
    label_smoothing: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, grad_x, grad_weight, grad_bias) of x (N, H), weight (V, H), target (N,) (contiguous)
    and bias (V,) or None.  `incoming`: the per-row gradient (N,) of the backward of "none", else
    None.  The loss is the row losses (N,), their sum or their mean for plan.loss, else empty; a
    gradient the plan does not compute is an empty tensor."""
    n_rows, vocab = x.shape[0], weight.shape[0]
    row_loss = torch.empty(n_rows if plan.loss else 0, dtype=compute_dtype(x.dtype), device=x.device)
    kept_count = (target != ignore_index).sum() if plan.reduction == "mean" and (plan.loss or plan.mean) else None
    weight, bias = gemm_operands(plan, weight, bias)
    sums = GradientSums(plan, x, weight, bias, vocab)
    for start, end, padded_rows, logits in chunk_logits(plan, x, weight, bias):
        # The pointers a launch does not read (the plan's flags leave them out) are the buffer's.
        launcher(linear_cross_entropy_kernel, x)[(cdiv(end - start, plan.tile.rows),)](
            padded_rows, target[start:end], row_loss[start:end] if plan.loss else padded_rows,
            padded_rows if incoming is None else incoming[start:], padded_rows if kept_count is None else kept_count,
            end - start, vocab, plan.logits_stride, 0 if incoming is None else incoming.stride(0),
            ignore_index, float(label_smoothing),
            LOSS=plan.loss, GRAD=plan.grad, INCOMING=incoming is not None, MEAN=plan.mean,
            SMOOTHING=plan.smoothing, BLOCK_M=plan.tile.rows, BLOCK_SIZE=plan.tile.block,
            ROW_MULTIPLE=plan.tile.row_multiple, num_warps=plan.tile.warps,
        )  # fmt: skip
        sums.add(start, end, logits)
    padded_rows = logits = None  # the buffer goes back before the sums are rounded
    return (_reduce(plan, row_loss, kept_count), *sums.results())


def gemm_operands(plan: Plan, weight: torch.Tensor, bias: torch.Tensor | None):
    """The weight and bias the GEMMs read: as given, or (plan.pad_weight) with zero rows to the logits'
    padded stride, so that every GEMM's dimensions are whole 16-byte runs (plan.py: Tuning.pad_weight).
    The padded classes' logits are 0 and their gradient is written 0: they add nothing to grad_x."""
    if not plan.pad_weight:
        return weight, bias
    extra = plan.logits_stride - weight.shape[0]  # zero rows (classes) at the end
    return F.pad(weight, (0, 0, 0, extra)), None if bias is None else F.pad(bias, (0, extra))


def chunk_logits(plan: Plan, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """For each chunk of the plan: (start, end, padded_rows, logits), its logits x[start:end] @ W^T (+ b)
    computed into one buffer reused by every chunk, its rows padded to 16 bytes (`logits`: the columns
    the GEMMs write and read, all of them where the weight is padded, gemm_operands).  The row kernel
    reads and writes the padded rows whole (their padding ends 0), so it gets them whole: a traced
    call's functional copy of a tensor covers that tensor's extent only."""
    if not plan.chunks:
        return
    buffer = torch.empty((plan.chunk_rows, plan.logits_stride), dtype=x.dtype, device=x.device)
    for index in range(plan.chunks):
        start = index * plan.chunk_rows
        end = min(start + plan.chunk_rows, x.shape[0])
        padded_rows = buffer[: end - start]
        logits = padded_rows[:, : weight.shape[0]]
        if bias is None:
            torch.mm(x[start:end], weight.t(), out=logits)
        else:
            torch.addmm(bias, x[start:end], weight.t(), out=logits)
        yield start, end, padded_rows, logits


class GradientSums:
    """The gradients the plan computes, from each chunk's logits' gradient: grad_x's rows, and the
    weight's and bias's sums over the chunks (the gradient itself, or a float32 sum rounded once).
    `weight` and `bias` are the GEMMs' (gemm_operands): their first `vocab` rows are the classes'."""

    def __init__(self, plan: Plan, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, vocab: int):
        self.plan, self.x, self.weight, self.bias, self.vocab = plan, x, weight, bias, vocab
        compute = compute_dtype(x.dtype)
        self.grad_x = torch.empty_like(x, memory_format=torch.contiguous_format) if plan.x_grad else None
        self.weight_sum = None
        if plan.weight_grad:
            sum_dtype = weight.dtype if plan.weight_sum == IN_OUTPUT else compute
            allocate = torch.zeros if plan.chunks == 0 else torch.empty
            self.weight_sum = allocate(weight.shape, dtype=sum_dtype, device=x.device)
        self.bias_sum = torch.zeros(weight.shape[0], dtype=compute, device=x.device) if plan.bias_grad else None

    def add(self, start: int, end: int, dlogits: torch.Tensor) -> None:
        """One chunk's gradient GEMMs, from its logits' gradient (start..end of x's rows)."""
        if self.grad_x is not None:
            torch.mm(dlogits, self.weight, out=self.grad_x[start:end])
        if self.weight_sum is not None:
            _add_weight_gradient(self.plan, self.weight_sum, dlogits, self.x[start:end], first=start == 0)
        if self.bias_sum is not None:
            self.bias_sum += dlogits.sum(0, dtype=self.bias_sum.dtype)

    def results(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(grad_x, grad_weight, grad_bias): a float32 sum rounded once to its parameter's dtype; a
        gradient the plan does not compute is an empty tensor of its own."""
        grad_x = self.grad_x if self.grad_x is not None else self.x.new_empty(0)
        v = self.vocab  # the padded classes' rows go
        grad_weight = self.weight_sum[:v].to(self.weight.dtype) if self.weight_sum is not None else self.x.new_empty(0)
        grad_bias = self.bias_sum[:v].to(self.bias.dtype) if self.bias_sum is not None else self.x.new_empty(0)
        return grad_x, grad_weight, grad_bias


def _add_weight_gradient(
    plan: Plan, weight_sum: torch.Tensor, dlogits: torch.Tensor, x_chunk: torch.Tensor, first: bool
):
    """weight_sum (+)= dlogits^T @ x_chunk: the first chunk writes the sum (beta = 0: what the
    buffer held is not read), the others add to it, in the way plan.weight_sum names, by the GEMM
    plan.weight_gemm names."""
    beta = 0 if first else 1
    if plan.weight_gemm == TK_GEMM:  # (an IN_OUTPUT sum: the plan takes tk's GEMM for no other)
        product_into(weight_sum, dlogits.t(), x_chunk, accumulate=not first)
    elif plan.weight_sum == IN_OUTPUT:
        torch.addmm(weight_sum, dlogits.t(), x_chunk, beta=beta, out=weight_sum)
    elif plan.weight_sum == FLOAT32:
        torch.addmm(weight_sum, dlogits.t(), x_chunk, beta=beta, out_dtype=torch.float32, out=weight_sum)
    elif plan.weight_sum == FLOAT32_TRACED:
        product = torch.mm(dlogits.t(), x_chunk, out_dtype=torch.float32)
        if first:
            weight_sum.copy_(product)
        else:
            weight_sum.add_(product)
    else:  # WIDENED
        torch.addmm(weight_sum, dlogits.t().float(), x_chunk.float(), beta=beta, out=weight_sum)


def _reduce(plan: Plan, row_loss: torch.Tensor, kept_count: torch.Tensor | None) -> torch.Tensor:
    """The loss: the row losses, their sum, or their sum over the kept rows' count (0 / 0 = NaN
    when no row is kept, as in PyTorch); empty when no loss is computed."""
    if not plan.loss or plan.reduction == "none":
        return row_loss
    total = row_loss.sum()
    return total / kept_count if plan.reduction == "mean" else total


def scaled(t: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """t * scale, a new tensor: the product in float32 (float64 for float64) rounded once to t's dtype, as
    scale_in_place rounds it (torch's own mul on CUDA rounds a 0-dim scale to t's dtype first)."""
    return (t.to(compute_dtype(t.dtype)) * scale).to(t.dtype)


def scale_in_place(t: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """t *= scale, for a one-element `scale` on t's device, without reading it on the host; t."""
    if not t.is_contiguous():  # (the stored gradients are contiguous: a caller's own tensor, rounded alike)
        return t.copy_(scaled(t, scale))
    n = t.numel()
    if n:
        block, warps = elementwise_config(n, t.device)
        sms = max(device_facts(t.device).sm_count, 1)  # (the interpreter's facts count none)
        programs = min(cdiv(n, block), sms * _SCALE_PROGRAMS_PER_SM)
        launcher(scale_in_place_kernel, t)[(programs,)](t, scale, n, BLOCK_SIZE=block, num_warps=warps)
    return t


# scale_in_place_kernel's programs an SM, each looping over blocks: the elementwise rule's programs are 256 threads,
# so 8 fill an SM's 2048 (and a scale of 1 costs a launch of a few hundred programs, not one a block).
_SCALE_PROGRAMS_PER_SM = 8
