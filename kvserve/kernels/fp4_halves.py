"""A tile of FP4 weight codes decoded as its two K halves by parity: the even codes (K index
2j of the step) and the odd ones (2j + 1), each [BLOCK_N, BLOCK_K / 2] and exact (without the
row scale), for ``Fp4GemmConfig.even_odd``: the FP4 GEMM then takes two dots, each half against
the matching half of x (``split_x``), instead of interleaving the halves into one tile.

Why: in the sm_90 code of the one-tile kernel at 64 rows, the word decode's joins leave the tile
in a layout the MMA cannot read from registers, so each K step stores it to shared memory and
reads it back with ``ldmatrix`` in four rounds behind 9-11 barriers, and each of the step's 8
HGMMAs waits for the one before. Decoded by parity, each half is one elementwise chain from a
byte (or, in words, two joins of four code positions), and each dot issues its HGMMAs back to
back: 2-4 barriers and two waits a step (the words' halves still pass through shared memory
once; benchmarks/lowbit_sass).

Scales: code k's group is k // GROUP, so even code 2j (and odd code 2j + 1) has group
j // (GROUP / 2): each half takes the step's scales repeated GROUP / 2 times.
"""

from __future__ import annotations

from kvserve.kernels._triton import jit, tl
from kvserve.kernels.fp4_tile import nibble_e4m3_bytes, times_block_scales, word_parities


@jit
def dequant_halves(
    p, s, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
    SCALE_E8M0: tl.constexpr, DTYPE: tl.constexpr, WORD_DEQUANT: tl.constexpr,
):  # fmt: skip
    """(even, odd) halves of the tile: from int32 words p [BLOCK_N, BLOCK_K / 8] (code 8w + i at
    nibble i) or bytes p [BLOCK_N, BLOCK_K / 2] (code 2b low nibble, 2b + 1 high)."""
    if WORD_DEQUANT:  # the whole-tile decode's order (fp4_tile._dequant_words), by parity
        even, odd = word_parities(p)
    else:
        lo, hi = nibble_e4m3_bytes(p)
        even = lo.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        odd = hi.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    # code 2j and 2j + 1 are in group 2j // GROUP: each scale covers GROUP / 2 of a half
    even = times_block_scales(even, s, BLOCK_N, BLOCK_K // 2, GROUP // 2, SCALE_E8M0, DTYPE)
    odd = times_block_scales(odd, s, BLOCK_N, BLOCK_K // 2, GROUP // 2, SCALE_E8M0, DTYPE)
    return even, odd


@jit
def split_x(x, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """x [BLOCK_M, BLOCK_K] -> (its even columns, its odd columns), each [BLOCK_M, BLOCK_K / 2]."""
    return tl.split(tl.reshape(x, (BLOCK_M, BLOCK_K // 2, 2)))
