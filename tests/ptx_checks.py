"""Checks on the PTX of kernels built for sm_90 (no GPU needed), shared by the held-rows tests."""

import re


def build_for_hopper(source, setup):
    """`source` (an ASTSource or GluonASTSource) compiled for sm_90 with `setup`'s warps and register cap."""
    import triton
    from triton.backends.compiler import GPUTarget

    options = {"num_warps": setup.warps, "maxnreg": setup.registers}
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def assert_waits_for_the_fill_before_the_scratch(ptx, overlapped, first_load="ld.global"):
    """Launched to overlap its scratch fill (OVERLAPPED), a kernel waits for the fill once,
    after it has issued its first loads of the row and before its first publish; otherwise
    it has no wait at all."""
    waits = [m.start() for m in re.finditer(r"griddepcontrol\.wait", ptx)]
    if not overlapped:
        assert waits == []
        return
    assert len(waits) == 1, waits
    assert ptx.index(first_load) < waits[0] < ptx.index("atom.global")


def assert_publishes_without_release(ptx):
    """A partial goes out as one relaxed 64-bit exchange and comes in by volatile loads;
    nothing in the kernel waits for its earlier stores (a release, a fence)."""
    atomics = set(re.findall(r"atom\.[\w.]+", ptx))
    assert atomics == {"atom.global.gpu.relaxed.exch.b64"}, atomics
    assert "ld.volatile.global.b64" in ptx
    assert not re.search(r"\bfence\.|\.release\b|\.acq_rel\b|membar", ptx)


def registers_and_spills(compiled):
    """(registers a thread, bytes of spill stores) of a kernel built by build_for_hopper, from ptxas -v on its
    PTX with the ptxas Triton ships."""
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    try:
        ptxas = get_ptxas(90).path  # Triton 3.9 picks the ptxas by architecture
    except TypeError:
        ptxas = get_ptxas().path
    with tempfile.TemporaryDirectory() as folder:
        ptx = f"{folder}/kernel.ptx"
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        log = subprocess.run(
            [ptxas, "-arch=sm_90a", "-v", ptx, "-o", f"{folder}/kernel.cubin"], capture_output=True, text=True, check=True
        ).stderr
    return int(re.search(r"Used (\d+) registers", log).group(1)), int(re.search(r"(\d+) bytes spill stores", log).group(1))
