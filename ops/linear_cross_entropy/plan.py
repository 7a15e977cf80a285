"""Linear cross entropy's plan: how a call is cut into chunks of rows and how each chunk is launched.

    Meta          what a call is: N, H, V, the element size, the reduction, which results it wants,
                  the device's facts
    Tuning        every constant the rules use, each with its reason; TUNING the default
    choose_plan   Meta -> Plan: the chunk's rows, the logits buffer's row stride, the row kernel's
                  tile, how the weight gradient is summed over the chunks

choose_plan is a pure function of the Meta and the Tuning: a test plans for an H100 on any machine
by building ``Meta(..., facts=H100)`` and runs another chunk size by passing another Tuning to the
Python entry points of op.py.  launch.py carries a plan out and decides nothing.

The rules (docs/ops/linear_cross_entropy.md has the reasoning and the curve):

* The chunk.  At most ``max(min_chunk_rows, nearest_power_of_2(rows_per_hidden * H))`` rows, H / 2
  taken to the nearest power of two: a chunk of H / 2 rows holds half as many logits as the weight
  has elements, so for H of 2048 or more its memory is bounded by about half the weight gradient's
  (at most 0.71 of it) whatever N and V are; below, ``min_chunk_rows`` rows (1024) at least keep
  the weight gradient's sum over the chunks cheap next to the GEMMs.  The N rows are cut into that
  many chunks, evened out and rounded up to ``row_multiple`` rows (so a chunk's rows are a power of
  two only where N divides evenly: N = 5000 at H 4096 gives three chunks of 1792).
  ``Tuning.chunk_rows`` fixes the rows instead (the harness's curve, the tests' ragged chunks).
* The logits buffer.  Its rows are V columns padded to a whole number of 16-byte runs, so that
  every row starts on a 16-byte boundary for cuBLAS and for the row kernel, whose sweep runs to the
  padded end (the padding columns are read but masked in registers).
* The row kernel.  One row a program, swept in chunks of the next power of two of V, at most
  ``max_block`` columns, ``per_thread`` elements a thread; rows of at most ``stacked_row`` columns
  are stacked into tiles of about ``row_tile`` elements.
* The weight's padding.  A vocabulary whose rows are not a whole number of 16-byte runs: the GEMMs
  read the weight padded with zero rows to the buffer's stride (``pad_weight``, from
  ``pad_weight_min_rows`` rows: below, the copy costs more than the slow GEMMs it saves).
* The weight gradient's sum.  Summed in the gradient itself, in the weight's dtype (one rounding a
  chunk for 16-bit weights: measured as accurate, and faster).  With ``float32_weight_sum``, 16-bit
  weights over several chunks are summed in float32 and rounded once at the end: on a GPU, eagerly, by a GEMM that adds into the float32 sum (``addmm(..., out_dtype=torch.float32)``);
  traced for Inductor, by a GEMM with a float32 output added to the sum (``mm(...,
  out_dtype=torch.float32)``): Inductor cannot lower addmm with out_dtype (torch 2.13:
  "tuned_addmm() takes 3 positional arguments but 4 were given").  In the interpreter, from
  float32 copies of the chunk's operands (torch has no mixed-precision GEMM on the CPU).
* The weight gradient's GEMM.  Summed in the gradient itself by ``torch.addmm`` (cuBLAS on a
  GPU), or, with ``tk_weight_gemm`` (off: measured slower), by tk's TMA matmul adding the chunk's
  product into the sum in its epilogue (``ops.matmul.op.product_into``).
"""

from dataclasses import dataclass, replace

from ..blocks.sizes import cdiv, nearest_power_of_2, next_power_of_2, rows_in_tile, warps_for
from ..runtime import ByKind, DeviceFacts

_ACCESS_BYTES = 16  # the widest access a thread makes, and the alignment cuBLAS wants of a leading dimension

# How the weight gradient is summed over the chunks (Plan.weight_sum).
IN_OUTPUT = "in_output"  # addmm into the gradient itself: one chunk, float32 or float64 weights
FLOAT32 = "float32"  # 16-bit weights on a GPU, eagerly: addmm with a float32 output into a float32 sum
FLOAT32_TRACED = "float32_traced"  # the same traced for Inductor: mm with a float32 output, added to the sum
WIDENED = "widened"  # 16-bit weights in the interpreter: addmm of float32 copies into a float32 sum

# Which GEMM adds a chunk's dlogits^T @ x_c into an IN_OUTPUT weight gradient (Plan.weight_gemm).
TORCH_GEMM = "torch"  # torch.addmm(..., beta=1): cuBLAS on a GPU
TK_GEMM = "tk"  # tk's matmul, adding into the gradient in its epilogue (ops.matmul.op.product_into)


@dataclass(frozen=True)
class Tuning:
    """Every constant of linear cross entropy's plans.  The GPU numbers are to be measured on an
    H100 (docs/ops/linear_cross_entropy.md keeps the place for the curve); until then each field
    says the reasoning it comes from."""

    # Rows a chunk, fixed; None takes the rule below.  The harness draws the curve of time and
    # memory against it (spec.py: one variant per chunk size), the tests take ragged chunks with it.
    chunk_rows: int | None = None

    # The rule: a chunk of at most max(min_chunk_rows, nearest_power_of_2(rows_per_hidden * H))
    # rows.  Memory: a chunk of H / 2 rows holds half as many logits as the weight has elements, so
    # for H of 2048 or more the loss's working set beyond the gradients it returns is at most 0.71 of
    # theirs (whatever V is).  H rows, the rule until perf-notes version 50 (chunk_rows= gives its
    # sizes back; rows_per_hidden=1 would round them to powers of two), held as much as the weight
    # gradient: in the Llama step of issue 51 (H 2048, V 128256) that chunk, 525 MB, was what kept
    # the step's peak above Liger's.  Speed:
    # each chunk after the first adds dlogits^T @ x_c into the V x H sum, a GEMM of 2 * rows * V * H
    # flops that reads and writes 4 * V * H bytes (bf16), rows / 2 flops a byte, and cuBLAS does not
    # hide that traffic behind the math: measured at 8191x2048x128256, 1024 rows took 23.8 ms
    # against 2048 rows' 22.1 (about 0.4 ms a chunk more, 1.2x the traffic's time at copy speed).
    # Below about 600 rows (990 TFLOP/s over 3.35 TB/s) the traffic outlasts even the math, hence
    # min_chunk_rows.  H / 2 is taken to the nearest power of two (in ratio): the GEMMs' shape counts
    # more than one chunk more or less.  At Qwen2's head (8191x3584x152064) chunks of 1664 rows (H / 2
    # evened out) took 44.8 ms, chunks of 2048 rows 41.5, the rule's 2816 of version 49 about 42.4.
    rows_per_hidden: float = 0.5
    min_chunk_rows: int = 1024
    # The chunks are evened out and their rows rounded up to this: cuBLAS's tiles on Hopper are
    # 128 or 256 rows, and a last chunk of a few rows would be a GEMM of little use.
    row_multiple: int = 128

    # 16-bit weights over several chunks: the weight gradient summed in float32 and rounded once
    # (True), or summed in the weight's dtype, one rounding a chunk (False: no float32 sum, 4 bytes
    # an element of the weight less memory and traffic, a gradient error up to sqrt(chunks) times
    # the one rounding's).  Measured on an H100 over seven LM heads (perf-notes version 48): the sum
    # in the weight's dtype was 1-5% faster at every one and held 0.5-1.1 GB less (8191x2048x128256:
    # 21.8 ms at 1.12 GB against 22.4 ms at 1.68 GB), the step's error against float64 unchanged
    # (1e-4); the float32 sum's extra traffic was not hidden behind the chunk's GEMMs.
    float32_weight_sum: bool = False

    # A vocabulary whose rows are not a whole number of 16-byte runs (GPT-2's 50257): the GEMMs read
    # the weight padded with zero rows to the logits' padded stride, and write and read the padded
    # logits whole.  Unpadded, the GEMMs' contiguous dimension (V, or V as K) is not a multiple of 8
    # elements, and cuBLAS on the H100 took its align-1 kernels (sm75 CUTLASS): 6.9 of the 7.5 ms of
    # 4095x768x50257's training step, where tk's unfused matmul took 4.5 (perf-notes version 48).
    # The cost: one copy of the weight (V H s bytes, 77 MB for GPT-2) a call, 4 V H bytes of traffic
    # against the align-1 kernels' extra time, about 2/3 of 6 N H V flops at 600 TFLOP/s: worth it
    # from N of about 200 rows (bf16, an H100's 3 TB/s), hence from 512.  The interpreter pads from
    # one row, so that the CPU tests run the padded GEMMs.
    pad_weight: bool = True
    pad_weight_min_rows: ByKind = ByKind(cuda=512, cpu=1)

    # The weight gradient's GEMM, summed in the gradient itself (IN_OUTPUT): tk's matmul, adding into
    # the sum in its epilogue (True), or torch.addmm (False).  Measured on an H100 (perf-notes version
    # 51), off: tk's TMA kernel writes the grad_W GEMM of Qwen2's head (M = V 152064, N = H 3584,
    # K = 2048 rows) at 1.03x cuBLAS, but its adding launch reads C's tile after the K loop, a stall
    # each tile: 3.86 ms against cuBLAS's addmm's 3.48.  In one run of the whole loss (two rounds,
    # interleaved): at 8191x3584x152064 42.8 ms with cuBLAS against 43.7 with tk; 8191x4096x128256
    # 40.1 against 42.4; 8191x2048x128256 (1024-row chunks) 21.7 against 23.7.  (Reading the tile
    # before the loop, held in registers across it, took 16.7 ms.)  The harness times it on as
    # `tk-tk-weight-gemm`.  On a GPU it applies to 16-bit weights on Hopper (the TMA kernel's),
    # eagerly (traced, Inductor's GEMMs); the interpreter takes it where a test says so.
    tk_weight_gemm: ByKind = ByKind(cuda=False, cpu=False)

    # The row kernel: chunks of the next power of two of V, capped, `per_thread` elements a thread.
    # It reads each row twice and writes it once, as cross entropy's backward reads and writes once:
    # its long rows took 8 a thread on 16 warps (ops/cross_entropy/plan.py, perf-notes version 34).
    max_block: ByKind = ByKind(cuda=4096, cpu=1 << 14)
    per_thread: int = 8
    # Rows of at most `stacked_row` columns are stacked into tiles of about `row_tile` elements,
    # `tile_per_thread` a thread, as cross entropy stacks them (perf-notes version 28): one
    # 100-class row a program leaves most lanes idle.  (No language model head has such rows; the
    # CPU tests do.)
    stacked_row: ByKind = ByKind(cuda=256, cpu=1 << 14)
    row_tile: ByKind = ByKind(cuda=2048, cpu=1 << 14)
    tile_per_thread: int = 8

    def __post_init__(self):
        if self.chunk_rows is not None and self.chunk_rows < 1:
            raise ValueError(f"Tuning.chunk_rows must be at least 1 (or None for the rule), got {self.chunk_rows}")

    def with_cpu(self, **values: int) -> "Tuning":
        """This tuning with the interpreter's values of the ByKind constants named replaced:
        ``TUNING.with_cpu(max_block=16)`` sweeps tiny rows in several column chunks."""
        return replace(self, **{name: replace(getattr(self, name), cpu=value) for name, value in values.items()})


TUNING = Tuning()


@dataclass(frozen=True)
class Meta:
    """What a call is, as far as its plan goes."""

    n_rows: int  # N: the rows of x (tokens)
    hidden: int  # H: x's columns, the weight's
    vocab: int  # V: the weight's rows (classes)
    element_size: int  # bytes an element of x and the weight
    facts: DeviceFacts
    reduction: str = "mean"  # "none", "mean" or "sum"
    smoothing: bool = False  # label_smoothing > 0
    loss: bool = True  # the row losses are computed (the forward; not the backward of "none")
    incoming: bool = False  # the gradient is scaled by an incoming per-row gradient (the backward of "none")
    x_grad: bool = False  # the gradients the call computes
    weight_grad: bool = False
    bias_grad: bool = False
    eager: bool = True  # launching_directly(): run now, not traced for Inductor


@dataclass(frozen=True)
class RowTile:
    """The row kernel's launch on a chunk: programs of `rows` rows each (BLOCK_M), swept `block`
    columns at a time (BLOCK_SIZE) on `warps` warps; `row_multiple` (ROW_MULTIPLE) divides the
    logits buffer's row stride, a whole number of 16-byte runs."""

    rows: int
    block: int
    warps: int
    row_multiple: int


@dataclass(frozen=True)
class Plan:
    chunk_rows: int  # rows a chunk (the last may have fewer); 0 for N = 0, when nothing is launched
    chunks: int
    logits_stride: int  # the logits buffer's row stride: V padded to 16 bytes
    tile: RowTile
    reduction: str  # of the row losses: "none", "mean" (their sum over the kept rows' count) or "sum"
    loss: bool  # LOSS: the kernel writes each row's loss
    grad: bool  # GRAD: the kernel writes the logits' gradient in place of the logits
    incoming: bool  # INCOMING: the gradient is scaled by an incoming per-row gradient
    mean: bool  # MEAN: the gradient is divided by the number of kept rows (counted first)
    smoothing: bool  # SMOOTHING: the label-smoothing terms are compiled in
    x_grad: bool
    weight_grad: bool
    bias_grad: bool
    weight_sum: str  # IN_OUTPUT, FLOAT32, FLOAT32_TRACED or WIDENED (see the module docstring)
    weight_gemm: str  # TK_GEMM or TORCH_GEMM: which GEMM adds an IN_OUTPUT sum's chunks
    pad_weight: bool  # the GEMMs read the weight padded with zero rows to logits_stride (Tuning.pad_weight)


def choose_plan(meta: Meta, tuning: Tuning = TUNING) -> Plan:
    """The chunks, the logits buffer and the row kernel's launch of a call (see the module docstring)."""
    rows = chunk_rows(meta, tuning)
    chunks = cdiv(meta.n_rows, rows) if rows else 0
    vector = _ACCESS_BYTES // meta.element_size
    stride = cdiv(meta.vocab, vector) * vector
    grad = meta.x_grad or meta.weight_grad or meta.bias_grad
    weight_sum = _weight_sum(meta, chunks, tuning)
    return Plan(
        chunk_rows=rows,
        chunks=chunks,
        logits_stride=stride,
        tile=_row_tile(meta, rows, stride, vector, tuning),
        reduction=meta.reduction,
        loss=meta.loss,
        grad=grad,
        incoming=meta.incoming,
        mean=grad and meta.reduction == "mean" and not meta.incoming,
        smoothing=meta.smoothing,
        x_grad=meta.x_grad,
        weight_grad=meta.weight_grad,
        bias_grad=meta.bias_grad,
        weight_sum=weight_sum,
        weight_gemm=_weight_gemm(meta, weight_sum, tuning),
        pad_weight=tuning.pad_weight and stride != meta.vocab and meta.n_rows >= tuning.pad_weight_min_rows.on(meta.facts),
    )


def chunk_rows(meta: Meta, tuning: Tuning = TUNING) -> int:
    """Rows a chunk: `tuning.chunk_rows` if set, else the rule of the module docstring; at most N."""
    n_rows = meta.n_rows
    if n_rows == 0:
        return 0
    if tuning.chunk_rows is not None:
        return min(n_rows, tuning.chunk_rows)
    most = max(tuning.min_chunk_rows, nearest_power_of_2(int(tuning.rows_per_hidden * meta.hidden)))
    chunks = cdiv(n_rows, most)
    even = cdiv(cdiv(n_rows, chunks), tuning.row_multiple) * tuning.row_multiple
    return min(n_rows, even)


def _row_tile(meta: Meta, rows: int, stride: int, vector: int, tuning: Tuning) -> RowTile:
    """Rows of at most `stacked_row` columns stacked into tiles of about `row_tile` elements,
    longer rows one a program, swept in chunks of at most `max_block` columns."""
    facts = meta.facts
    block = min(next_power_of_2(stride), tuning.max_block.on(facts))
    if block > tuning.stacked_row.on(facts):
        tile_rows, warps = 1, warps_for(block, tuning.per_thread)
    else:
        tile_rows = rows_in_tile(max(rows, 1), block, tuning.row_tile.on(facts))
        warps = warps_for(tile_rows * block, tuning.tile_per_thread)
    return RowTile(tile_rows, block, warps, vector)


def _weight_sum(meta: Meta, chunks: int, tuning: Tuning) -> str:
    """How the weight gradient is summed over the chunks (see the module docstring)."""
    if chunks <= 1 or meta.element_size >= 4 or not tuning.float32_weight_sum:
        return IN_OUTPUT
    if not meta.facts.cuda:
        return WIDENED
    return FLOAT32 if meta.eager else FLOAT32_TRACED


def _weight_gemm(meta: Meta, weight_sum: str, tuning: Tuning) -> str:
    """Which GEMM sums an IN_OUTPUT weight gradient (see Tuning.tk_weight_gemm)."""
    if weight_sum != IN_OUTPUT or not tuning.tk_weight_gemm.on(meta.facts):
        return TORCH_GEMM
    if meta.facts.cuda and not (meta.facts.hopper and meta.element_size == 2 and meta.eager):
        return TORCH_GEMM
    return TK_GEMM
