"""Rows held on chip across programs: the protocol the row-wise ops share.

A row too long for one program's registers is cut into segments, and a
persistent grid, as many programs as the GPU runs at once, holds one segment
each.  Program p always takes segment p % n_segments, of rows p // n_segments,
then rows_at_once further on, and so on: all programs of a row are in the same
round, so no program ever waits for one that is still busy with a later row.
Each program reduces its segment to a partial (softmax: its max and sum; a
norm's backward: its moments), publishes it, waits until every segment of its
row has published, combines the row's partials and writes its segment from
the registers it never left.  The row is read once, where a design that sweeps
it twice reads it twice: an H100's L2 does not keep the first sweep when
every SM streams its own rows (60-70% of copy bandwidth).

A partial is published as a single 64-bit word, two float32 packed, so the
word is its own flag: the scratch starts with every word UNPUBLISHED and a
program polls its row's words until none is.  The first version published
two float32 stores and then counted in on a counter per row, which needs a
release (whoever sees the count must see the partials), and a release waits
until the program's earlier stores have landed, the last round's output among
them.  One word needs nothing ordered before it: a relaxed atomic.  On an
H100 the change lifted the 16-bit softmax forward by 5-19 points of copy
bandwidth (docs/perf-notes.md, version 18).

The programs of a row must run at the same time, so the grid is sized to what
fits on the GPU at once (`HeldSetup.programs`, `fit_rows`).  If the GPU runs fewer (another process holds
SMs), a waiting program gives up after max_spins polls and computes the missing
partials itself, with the same code on the same data as their owners, so the
same bits: the result never depends on scheduling, and the kernel cannot hang.
Triton's interpreter runs programs one after another, so no program there ever
sees another's partial: on CPU the kernels run with max_spins = 0 and always
take that path.
"""

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

try:  # grid dependency control (Hopper and newer): see wait_for_fill
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - a Triton without it never launches a kernel to overlap the fill
    gdc_launch_dependents = gdc_wait = None

from ..runtime import DeviceFacts, launcher, launching_directly
from .sizes import cdiv, next_power_of_2

UNPUBLISHED = tl.constexpr(-1)  # all 64 bits set: no partial packs to it (see pack)
PADDING_WORD = tl.constexpr(-(1 << 55))  # 0xff800000_00000000: (-inf, 0.0), what a lane past the row reads


@triton.jit
def unpublish_kernel(words_ptr, n, BLOCK: tl.constexpr, OVERLAPPED: tl.constexpr):
    """Every word of a scratch set to UNPUBLISHED.  (A scratch has a word or two per
    segment of 2048 elements or more: far fewer than 2**31, so int32 offsets do.)
    OVERLAPPED: the kernel after this one may start at once (see wait_for_fill)."""
    if OVERLAPPED:
        gdc_launch_dependents()
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(words_ptr + offsets, tl.full((BLOCK,), UNPUBLISHED, tl.int64), mask=offsets < n)


@triton.jit
def wait_for_fill(OVERLAPPED: tl.constexpr):
    """Wait until the scratch fill launched just before this kernel has finished.

    A kernel launched as a programmatic dependent of the fill (see
    held_rows_scratch) starts while the fill still runs: what it does before
    this call (its first loads of x) overlaps the fill and the launch gap
    after it.  Nothing before it may touch the scratch.  Launched as usual,
    the kernel starts after the fill and this returns at once."""
    if OVERLAPPED:
        gdc_wait()


@triton.jit
def program_segment(n_segments, SEGMENT: tl.constexpr):
    """This program's segment, its columns and its first row."""
    pid = tl.program_id(0)
    segment = pid % n_segments
    return segment, segment * SEGMENT + tl.arange(0, SEGMENT), pid.to(tl.int64) // n_segments


@triton.jit
def partial_at(row, segment, n_segments):
    """Where the partial of (row, segment) lies in an (n_rows, n_segments) scratch."""
    return row * n_segments + segment


@triton.jit
def pack(high, low):
    """Two float32 as one int64 word, `high` in the upper half.  A NaN `low` is
    stored as the canonical NaN (0x7fc00000), so no word has all bits set."""
    low = tl.where(low == low, low, float("nan"))
    high_bits = high.to(tl.int32, bitcast=True).to(tl.int64)  # sign-extended: the shift drops the extension
    return (high_bits << 32) | low.to(tl.uint32, bitcast=True).to(tl.int64)  # unsigned: zero-extended


@triton.jit
def unpack(word):
    """The two float32 of a word (or of a block of words), upper half first."""
    high = (word >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    return high, word.to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def publish(words_ptr, at, word):
    """Hand this program's partial to its row's other programs: one relaxed
    atomic, which does not wait for this program's other stores."""
    tl.atomic_xchg(words_ptr + at, word, sem="relaxed")


@triton.jit
def _count_unpublished(words):
    return tl.sum((words == UNPUBLISHED).to(tl.int32), axis=0)


@triton.jit
def poll(word_ptrs, mask, max_spins):
    """The words at `word_ptrs` (lanes off `mask`: PADDING_WORD), read again up to
    max_spins times until every one is published; and whether every one is.

    Volatile loads read L2, where other SMs' atomics land, on each poll.  The
    grid is sized so that a row's programs all run at once and the wait is
    short (microseconds); a program that gives up has its caller compute the
    partials itself (see the module docstring)."""
    words = tl.load(word_ptrs, mask=mask, other=PADDING_WORD, volatile=True)
    spins = 0
    while (_count_unpublished(words) > 0) & (spins < max_spins):
        words = tl.load(word_ptrs, mask=mask, other=PADDING_WORD, volatile=True)
        spins += 1
    return words, _count_unpublished(words) == 0


@triton.jit
def row_words(words_ptr, row, n_segments, max_spins, SEGMENTS_BLOCK: tl.constexpr):
    """The row's partial words once all are published (see poll)."""
    segments = tl.arange(0, SEGMENTS_BLOCK)
    return poll(words_ptr + partial_at(row, segments, n_segments), segments < n_segments, max_spins)


# --------------------------------------------------------------------------
# The host side.
# --------------------------------------------------------------------------


@functools.cache
def register_capped(kernel, warps: int, registers: int):
    """`kernel` launched with `warps` warps and at most `registers` registers a thread (made once).

    A one-config autotune, because only a config carries the register cap
    (maxnreg) through torch.compile, where a launch argument would not:
    Inductor drops it (the compiled path is tested on the GPU for its results,
    not its speed).  The cap sets how many programs share an SM, and with the
    segment each holds, the bytes each SM has in flight while its programs
    wait for each other."""
    config = triton.Config({}, num_warps=warps, maxnreg=registers)
    return triton.autotune(configs=[config], key=[])(kernel)


@dataclass(frozen=True)
class HeldSetup:
    """How a held-rows kernel runs on a GPU: the one setup type of softmax's and the norms' plans.

    A program holds `segment` columns of a row (and what its kernel keeps of
    them) on `warps` warps, each thread capped at `registers` registers,
    `programs_per_sm` programs an SM wanted (fewer where fewer fit), each asking
    for `shared` bytes of shared memory.  A setup takes rows of at most
    `max_segments` segments (None: as many as the grid holds) whose length is a
    multiple of `col_multiple` (ops/blocks/alignment.py)."""

    segment: int
    warps: int
    registers: int
    programs_per_sm: int
    shared: int = 0
    max_segments: int | None = None
    col_multiple: int = 1

    def programs(self, facts: DeviceFacts) -> int:
        """The persistent grid on `facts`' device: programs_per_sm an SM, or as many as fit."""
        return facts.programs_at_once(self.warps, self.registers, self.programs_per_sm, self.shared)

    def takes(self, n_cols: int, col_multiple: int) -> bool:
        """Whether rows of n_cols columns (whose column_multiple is `col_multiple`) fit this setup."""
        fits = self.max_segments is None or cdiv(n_cols, self.segment) <= self.max_segments
        return fits and col_multiple % self.col_multiple == 0


def fit_rows(n_rows: int, n_segments: int, programs: int) -> tuple[int, int] | None:
    """(n_segments, rows_at_once) for rows of n_segments on a grid of `programs`; None where
    a row's segments do not all fit in it.  Rows are spread over rounds as evenly as the
    grid allows, so the last round is not a sliver."""
    if n_segments > programs:
        return None
    rounds = cdiv(n_rows, min(programs // n_segments, n_rows))
    return n_segments, cdiv(n_rows, rounds)


def unpublished_words(like: torch.Tensor, *shape: int, overlapped: bool = False) -> torch.Tensor:
    """A scratch of words of `shape`, none published yet, on `like`'s device;
    `overlapped`: the kernel launched next may start before the fill ends.

    Filled by a kernel of its own rather than torch.full: a body that only
    allocates and launches Triton kernels can be replayed from C++ (see
    _native.py): on the H100 host an eager 8x65536 bfloat16 softmax went from
    88 µs to 14 (torch.softmax: 10)."""
    words = torch.empty(shape, dtype=torch.int64, device=like.device)
    n = words.numel()
    launcher(unpublish_kernel, like)[(cdiv(n, _FILL_BLOCK),)](words, n, BLOCK=_FILL_BLOCK, OVERLAPPED=overlapped)
    return words


def held_rows_scratch(like: torch.Tensor, *shape: int, overlapped: bool) -> tuple[torch.Tensor, dict]:
    """The scratch for a kernel that holds rows across programs, and the launch
    arguments that say how that kernel follows its fill (see wait_for_fill);
    `overlapped`: the kernel starts while the fill runs (see may_overlap_fill)."""
    words = unpublished_words(like, *shape, overlapped=overlapped)
    return words, ({"OVERLAPPED": True, "launch_pdl": True} if overlapped else {"OVERLAPPED": False})


def may_overlap_fill(facts: DeviceFacts) -> bool:
    """Whether a held-rows kernel launched now may start while its fill runs: asked once a call,
    where the call's metadata is gathered (a traced call is answered before any device query).

    On Hopper or newer, in an eager call, the kernel is launched as the fill's
    programmatic dependent (Triton's launch_pdl): its programs start, load
    their first segments and only then wait for the fill, 0.7-1.5 µs sooner
    on an H100.  Not while a CUDA graph is being captured: a graph's kernels
    follow each other closely already, and there the edge cost 0.2-0.3 µs
    (the native lane's replay makes the same choice; docs/perf-notes.md,
    version 37).  torch.compile gets the plain kernel (Inductor launches it
    as it launches any other), and Triton's interpreter has no grid
    dependency control."""
    if not (launching_directly() and can_overlap_fill(facts)):
        return False
    return not torch.cuda.is_current_stream_capturing()


def can_overlap_fill(facts: DeviceFacts) -> bool:
    """Whether kernels on the device can start while the kernel before them runs:
    programmatic dependent launch, on Hopper (sm_90) or newer, with a Triton that has it."""
    return facts.hopper and gdc_wait is not None


_FILL_BLOCK = 1024


def words_block(warps: int, n_segments: int) -> int:
    """SEGMENTS_BLOCK: a row's words, at least one a thread.

    A block smaller than the program's threads is replicated across them, each
    copy loaded on its own while the words are still being published: copies
    can disagree, and the threads with them (one decides the row is complete
    and combines a copy that is not).  One copy per word keeps every thread's
    view the same; the GPU test that compares waiting with not waiting found
    NaN rows without it."""
    return max(next_power_of_2(n_segments), 32 * warps)
