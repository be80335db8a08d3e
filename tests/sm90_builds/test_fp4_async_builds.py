"""The asynchronous-MMA FP4 GEMM (``fp4_async_gemm.py``, Gluon) built for sm_90 at x tiles of 16
to 128 rows, both formats, unsplit and split: no spills, and a K loop whose wgmma stays in flight
across the next step's decode (one wait a step, for the step before)."""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("triton")

from triton_target import stack_bytes  # noqa: E402

from benchmarks.kernel_spills import cuobjdump, resource_usage  # noqa: E402
from benchmarks.lowbit_sass import k_loop_span, loop_opcodes  # noqa: E402
from kvserve.kernels.fp4_async_choice import TWO_PROGRAMS_REGISTERS  # noqa: E402
from kvserve.kernels.fp4_async_gemm import (  # noqa: E402
    HAS_GLUON,
    SHARED_MEMORY_BYTES,
    fp4_async_linear,
    ring_bytes,
)

pytestmark = pytest.mark.skipif(not HAS_GLUON, reason="this Triton has no Gluon")

N, K = 1024, 4096


def _build(
    rows: int,
    fmt: str,
    warps: int,
    split_k: int,
    stages: int = 4,
    bits: bool = False,
    max_registers: int | None = None,
    triton_permute: bool = False,
    pdl: bool = False,
) -> None:
    x = torch.zeros(rows, K, dtype=torch.bfloat16)
    packed = torch.zeros(N, K // 2, dtype=torch.uint8)
    if fmt == "mxfp4":
        scales, row_scale = torch.zeros(N, K // 32, dtype=torch.uint8), None
    else:
        scales, row_scale = torch.zeros(N, K // 16, dtype=torch.float8_e4m3fn), torch.ones(N)
    fp4_async_linear(
        x, packed, scales, row_scale, split_k=split_k, num_warps=warps, stages=stages, bits=bits,
        max_registers=max_registers, triton_permute=triton_permute, pdl=pdl,
    )  # fmt: skip


@pytest.mark.parametrize("split_k", [1, 4])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_with_dependent_launch_w_is_asked_for_before_the_wait_and_x_after(
    compile_only: list, fmt: str, split_k: int
) -> None:
    """``pdl``: the first steps' codes (cp.async) and scales are loaded before
    ``griddepcontrol.wait``, x's tiles (TMA) after it, and the next kernel may launch once the
    K loop's MMAs are done, before the split sum and the stores; the permutation kernel waits
    before its loads. Neither spills."""
    _build(64, fmt, 8, split_k, bits=True, triton_permute=True, pdl=True)
    permute, gemm = (kernel.asm["ptx"] for kernel in compile_only)
    assert permute.index("griddepcontrol.wait") < permute.index("ld.global")
    assert permute.index("griddepcontrol.launch_dependents") < permute.index("st.global")
    wait = gemm.index("griddepcontrol.wait")
    assert gemm.index("cp.async.cg.shared.global") < wait
    assert gemm.index("ld.global") < wait
    assert wait < gemm.index("cp.async.bulk.tensor")
    release = gemm.index("griddepcontrol.launch_dependents")
    assert gemm.rindex("wgmma.mma_async") < release < gemm.index("st.global")
    assert gemm.count("griddepcontrol.wait") == 1
    assert stack_bytes(compile_only) == [0, 0]


@pytest.mark.parametrize("bits", [False, True])
def test_builds_with_x_permuted_by_its_triton_kernel(compile_only: list, bits: bool) -> None:
    """x's permutation (``fp4_x_permute``) and the GEMM: two kernels, neither spilling."""
    _build(64, "nvfp4", 8, 4, bits=bits, triton_permute=True)
    assert [c.name for c in compile_only] == ["_permute_x_steps_kernel", "_fp4_async_kernel"]
    assert stack_bytes(compile_only) == [0, 0]


# (rows of x, warps, ring slots): each x tile at the default 8 warps and 4 slots, and the 64-row
# tile at 4 warps and at 6 slots
BUILDS = [(16, 8, 4), (32, 8, 4), (64, 8, 4), (64, 4, 4), (64, 8, 6), (128, 8, 4)]


@pytest.mark.parametrize("split_k", [1, 4])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize(("rows", "warps", "stages"), BUILDS)
def test_builds_for_sm90_without_spills(
    compile_only: list, rows: int, warps: int, stages: int, fmt: str, split_k: int
) -> None:
    _build(rows, fmt, warps, split_k, stages)
    assert stack_bytes(compile_only) == [0]
    # the ring is the kernel's shared memory, barriers aside: what ring_fits checks at launch
    ring = ring_bytes(rows, warps, stages)
    assert ring <= compile_only[0].metadata.shared <= min(ring + 1024, SHARED_MEMORY_BYTES)


def test_a_ring_past_shared_memory_is_refused_before_it_builds(compile_only: list) -> None:
    """Six slots of a 128-row x tile need 240 KiB; sm_90 gives a block 227."""
    with pytest.raises(ValueError, match="shared memory"):
        _build(128, "nvfp4", 8, 1, stages=6)
    assert compile_only == []


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("rows", [32, 64, 128])
def test_the_bit_placing_decode_builds_without_spills(
    compile_only: list, rows: int, fmt: str
) -> None:
    _build(rows, fmt, 8, 1, bits=True)
    assert stack_bytes(compile_only) == [0]


@pytest.mark.parametrize("bits", [False, True])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("rows", [32, 64])
def test_two_programs_fit_an_sm_with_no_spills_in_the_k_loop(
    compile_only: list, rows: int, fmt: str, bits: bool
) -> None:
    """Capped at ``TWO_PROGRAMS_REGISTERS`` (two 8-warp programs an SM), x tiles up to 64 rows
    keep the K loop free of local-memory traffic (ptxas may spill a few bytes around it)."""
    _build(rows, fmt, 8, 4, bits=bits, max_registers=TWO_PROGRAMS_REGISTERS)
    cubin = compile_only[0].asm["cubin"]
    assert resource_usage(cubin)["REG"] <= TWO_PROGRAMS_REGISTERS
    ops = loop_opcodes(cuobjdump(cubin, "-sass"))
    assert ops["HGMMA"] == 32 and ops["LDL"] == 0 and ops["STL"] == 0


@pytest.mark.parametrize("bits", [False, True])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_the_k_loop_keeps_one_wgmma_group_in_flight(
    compile_only: list, fmt: str, bits: bool
) -> None:
    """Four steps an iteration: four groups of 8 HGMMAs (64 x 64 x 16), each opened by one
    arrive and followed by one wait, for all but the newest group (none waits for all); one
    barrier a step; W never goes through shared memory (no shared stores but the copies)."""
    _build(64, fmt, 8, 1, bits=bits)
    sass = cuobjdump(compile_only[0].asm["cubin"], "-sass")
    ops = loop_opcodes(sass)
    assert ops["HGMMA"] == 32 and ops["WARPGROUP"] == 8
    assert ops["BAR"] == 4
    assert ops["STS"] == 0 and ops["LDSM"] == 0
    loop = sass[sass.index("WARPGROUP.ARRIVE") : sass.rindex("WARPGROUP.ARRIVE")]
    assert "gsb0, 0x0" not in loop


_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
# opcodes whose first operand is not a register they write
_NO_DESTINATION = ("HGMMA", "ST", "BAR", "BRA", "WARPGROUP", "DEPBAR", "LDGSTS", "FENCE", "MEMBAR",
                   "LDGDEPBAR", "ISETP", "UISETP", "R2UR")  # fmt: skip


def _written(instruction: str) -> set[int]:
    """The R registers an instruction writes (a vector load: all of them)."""
    opcode, _, operands = re.sub(r"^@!?U?P\w+\s+", "", instruction).partition(" ")
    first = re.fullmatch(r"R(\d+)", operands.split(",")[0].strip())
    if opcode.startswith(_NO_DESTINATION) or not first:
        return set()
    width = 4 if ".128" in opcode else 2 if (".64" in opcode or ".WIDE" in opcode) else 1
    return set(range(int(first.group(1)), int(first.group(1)) + width))


def _loop_body(sass: str) -> list[str]:
    """The instructions of the K loop (``k_loop_span``)."""
    start, end = k_loop_span(sass)
    listed = [(int(m.group(1), 16), m.group(2)) for m in _INSTRUCTION.finditer(sass)]
    return [text for at, text in listed if start <= at <= end]


@pytest.mark.parametrize("bits", [False, True])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_no_instruction_overwrites_an_in_flight_wgmmas_w(
    compile_only: list, fmt: str, bits: bool
) -> None:
    """Between a step's wgmma group and the wait that retires it (the next step's), nothing
    writes the registers it reads W from; the bundled ptxas does not guarantee this itself
    (triton-lang/triton#9433), which is why the loop keeps steps in registers of their own."""
    _build(64, fmt, 8, 1, bits=bits)
    body = _loop_body(cuobjdump(compile_only[0].asm["cubin"], "-sass"))
    groups, reading = [], set()
    for at, text in enumerate(body):
        if text.startswith("HGMMA"):
            first = int(re.search(r"HGMMA\S*\s+R\d+,\s*R(\d+),", text).group(1))
            reading |= set(range(first, first + 4))
            if "gsb0" in text:
                groups.append((at, reading))
                reading = set()
    assert len(groups) == 4
    for at, registers in groups:
        waits, j = 0, at
        while waits < 2:  # its own wait retires the group before; the next step's retires it
            j = (j + 1) % len(body)
            waits += "WARPGROUP.DEPBAR.LE gsb0" in body[j]
            assert not _written(body[j]) & registers, body[j]
