"""Write the step's new keys/values into the paged KV cache.

Reference: ``store_kv_cache_reference`` (the torch attention backend's store). One program per
token; a negative slot means "skip" (padding rows of a CUDA-graph batch), so the grid depends only
on T.

An FP8 (e4m3) cache holds ``value / scale`` with one scale per layer for keys and one for values
(``KVScales``: 1-element fp32 tensors, read on the device so CUDA graphs see later changes);
values beyond e4m3's range are clamped to +-448 rather than turned into NaN.

An FP8 cache stores each page heads-major: the page's bytes of ``kv_cache[0]`` hold keys as
[Hkv, page_size, D] (a head's keys of the page together, one run of page_size * D bytes) and
those of ``kv_cache[1]`` values as [Hkv, D, page_size] (dims-major: a head's tokens of one
dimension together), where both halves of a bf16 cache hold [page_size, Hkv, D]. Values
dims-major are the K-major operand of the PV product on FP8 tensor cores
(``fp8_decode_attention``); keys heads-major make a head's page one contiguous read (on the H200
32 x 32K decode took 553 us against 573 token-major, fp8_kv_layouts_h200_s46). ``cache_keys`` and
``cache_values`` are the halves seen as [num_pages, page_size, Hkv, D] whatever their order (the
kernels take keys by strides); whole-page copies (host tier, KV transfer) need no change.
"""

from __future__ import annotations

import torch

from kvserve.kernels._triton import (
    jit,
    launch_options,
    next_pow2,
    pdl_release,
    pdl_wait,
    require_triton,
    tl,
)

FP8_KV_DTYPE = torch.float8_e4m3fn
FP8_KV_MAX = 448.0  # largest finite e4m3fn value

KVScales = tuple[torch.Tensor, torch.Tensor]  # (k_scale, v_scale), fp32 [1] each


def is_fp8_kv(kv_cache: torch.Tensor) -> bool:
    return kv_cache.dtype == FP8_KV_DTYPE


def encode_kv_reference(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` as the cache stores it: divided by ``scale`` and clamped when ``dtype`` is FP8."""
    if dtype != FP8_KV_DTYPE:
        return x.to(dtype)
    # times the reciprocal, as the kernels do, so both round the same fp32 value
    return (x.float() * (1.0 / scale)).clamp(-FP8_KV_MAX, FP8_KV_MAX).to(dtype)


def decode_kv_reference(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Stored cache values back in ``dtype`` (times ``scale`` when they are FP8)."""
    if x.dtype != FP8_KV_DTYPE:
        return x.to(dtype)
    return (x.float() * scale).to(dtype)


def raw_kv(t: torch.Tensor) -> torch.Tensor:
    """Byte view of an FP8 tensor (copy and index ops have no FP8 kernel on CPU), else itself."""
    return t.view(torch.uint8) if t.dtype == FP8_KV_DTYPE else t


def gather_kv_rows(cache: torch.Tensor, index: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """``cache.index_select(dim, index)`` for any cache dtype, FP8 included."""
    return raw_kv(cache).index_select(dim, index).view(cache.dtype)


def cache_keys(kv_cache: torch.Tensor) -> torch.Tensor:
    """The keys half as [num_pages, page_size, Hkv, D], a view of the cache's memory (an FP8
    cache's are stored heads-major, [num_pages, Hkv, page_size, D]: module docstring)."""
    return _token_major_view(kv_cache, 0, stored_order=(0, 2, 1, 3))


def cache_values(kv_cache: torch.Tensor) -> torch.Tensor:
    """The values half as [num_pages, page_size, Hkv, D], a view of the cache's memory (an FP8
    cache's are stored dims-major, [num_pages, Hkv, D, page_size]: module docstring)."""
    return _token_major_view(kv_cache, 1, stored_order=(0, 2, 3, 1))


def _token_major_view(
    kv_cache: torch.Tensor, half: int, stored_order: tuple[int, ...]
) -> torch.Tensor:
    """``kv_cache[half]`` seen as [num_pages, page_size, Hkv, D]; an FP8 cache's memory holds
    it with those axes in ``stored_order``."""
    x = kv_cache[half]
    if not is_fp8_kv(kv_cache):
        return x
    stored = x.view(*(x.shape[axis] for axis in stored_order))
    return stored.permute(*sorted(range(4), key=stored_order.__getitem__))


def check_kv_scales(kv_cache: torch.Tensor, kv_scales: KVScales | None) -> None:
    if is_fp8_kv(kv_cache) and kv_scales is None:
        raise ValueError("an FP8 KV cache needs its layer's k/v scales")


def store_kv_cache_reference(
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    kv_cache: torch.Tensor,  # [2, num_pages, page_size, Hkv, D]
    slot_mapping: torch.Tensor,  # int64 [T]; every slot >= 0
    kv_scales: KVScales | None = None,
) -> None:
    """Store new keys/values at their flat cache slots."""
    check_kv_scales(kv_cache, kv_scales)
    page_size = kv_cache.shape[2]
    pages, slots = slot_mapping // page_size, slot_mapping % page_size
    for i, (x, dst) in enumerate(((k, cache_keys(kv_cache)), (v, cache_values(kv_cache)))):
        stored = encode_kv_reference(x, kv_scales[i], kv_cache.dtype) if kv_scales else x
        raw_kv(dst)[pages, slots] = raw_kv(stored.to(kv_cache.dtype))


@jit
def encode_kv(x, inv_scale, FP8: tl.constexpr):
    """Values as an FP8 cache stores them (times 1 / scale, clamped), else ``x`` unchanged."""
    if FP8:
        x = tl.clamp(x.to(tl.float32) * inv_scale, -448.0, 448.0)
    return x


@jit
def copy_heads(
    src_ptr,
    dst_ptr,
    num_heads,
    src_stride_h,
    dst_stride_h,
    inv_scale,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    FP8: tl.constexpr,
    dst_stride_d=1,
):
    """Copy ``num_heads`` heads of one token from ``src`` to ``dst`` (cast to dst's dtype;
    times ``inv_scale`` when ``FP8``)."""
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, HEAD_DIM)
    mask = (heads < num_heads)[:, None]
    x = tl.load(src_ptr + heads[:, None] * src_stride_h + dims[None, :], mask=mask)
    dst = dst_ptr + heads[:, None] * dst_stride_h + dims[None, :] * dst_stride_d
    tl.store(dst, encode_kv(x, inv_scale, FP8).to(dst_ptr.dtype.element_ty), mask=mask)


@jit
def store_token_values(
    src_ptr, v_cache_ptr, page, slot, num_heads, src_stride_h, page_size, stride_cache_page,
    stride_cache_tok, stride_cache_head, inv_scale, BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr, FP8: tl.constexpr,
):  # fmt: skip
    """One token's values into its page: token-major, or dims-major in an FP8 cache (the
    module docstring; one byte a dimension, ``page_size`` apart)."""
    page_ptr = v_cache_ptr + page * stride_cache_page
    if FP8:
        copy_heads(src_ptr, page_ptr + slot, num_heads, src_stride_h, HEAD_DIM * page_size,
                   inv_scale, BLOCK_H, HEAD_DIM, FP8, page_size)  # fmt: skip
    else:
        copy_heads(src_ptr, page_ptr + slot * stride_cache_tok, num_heads, src_stride_h,
                   stride_cache_head, inv_scale, BLOCK_H, HEAD_DIM, FP8)  # fmt: skip


def tile_tokens(block_n: int, kv_cache: torch.Tensor) -> int:
    """A config's tile of tokens over ``kv_cache``: an FP8 cache's tiles are whole pages
    (``tile_pages``), so at least one page."""
    return max(block_n, kv_cache.shape[2]) if is_fp8_kv(kv_cache) else block_n


@jit
def tile_pages(table, n0, end, stride_cache_page, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """The pages of the tile of tokens [n0, n0 + BLOCK_N) (n0 a multiple of PAGE_SIZE): each
    page's offset in the cache, [BLOCK_N // PAGE_SIZE] (0 past ``end``), and whether it holds a
    token before ``end``. A tile read page by page reads its last page whole: the slots past
    ``end`` hold finite values (the pool starts zeroed and stores saturate) that meet p = 0."""
    pages = n0 // PAGE_SIZE + tl.arange(0, BLOCK_N // PAGE_SIZE)
    page_ok = pages * PAGE_SIZE < end
    base = tl.load(table + pages, mask=page_ok, other=0).to(tl.int64) * stride_cache_page
    return base, page_ok


@jit
def load_value_tile_t(
    v_cache_ptr, page_base, kv_head, page_ok, PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    """The values of a tile's pages from a dims-major cache as [D, pages * PAGE_SIZE] (token j
    of the tile in column j). ``page_base``: each page's offset, [pages]; a page that is not
    ``page_ok`` reads zeros. Each page's run of its head ([D, PAGE_SIZE], contiguous) is read in
    memory order (whole sectors), then seen as [D, N]."""
    dims = tl.arange(0, HEAD_DIM)
    run = dims[:, None] * PAGE_SIZE + tl.arange(0, PAGE_SIZE)[None, :]  # [D, slots]
    ptrs = (page_base + kv_head * (HEAD_DIM * PAGE_SIZE))[:, None, None] + run[None, :, :]
    tiles = tl.load(v_cache_ptr + ptrs, mask=page_ok[:, None, None], other=0.0)
    return tl.reshape(tl.permute(tiles, (1, 0, 2)), (HEAD_DIM, page_base.shape[0] * PAGE_SIZE))


@jit
def load_inv_scales(k_scale_ptr, v_scale_ptr, FP8: tl.constexpr):
    """1 / k_scale and 1 / v_scale of an FP8 cache (1.0 for any other cache)."""
    if FP8:
        return 1.0 / tl.load(k_scale_ptr), 1.0 / tl.load(v_scale_ptr)
    return 1.0, 1.0


@jit
def _store_kv_cache_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    k_scale_ptr,
    v_scale_ptr,
    page_size,
    num_kv_heads,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cache_page,
    stride_cache_tok,
    stride_cache_head,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    FP8: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    pdl_release(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    if slot < 0:
        return
    k_inv, v_inv = load_inv_scales(k_scale_ptr, v_scale_ptr, FP8)
    page, in_page = slot // page_size, slot % page_size
    k_dst = k_cache_ptr + page * stride_cache_page + in_page * stride_cache_tok
    copy_heads(
        k_ptr + t * stride_kt, k_dst, num_kv_heads, stride_kh, stride_cache_head, k_inv, BLOCK_H,
        HEAD_DIM, FP8,
    )  # fmt: skip
    store_token_values(
        v_ptr + t * stride_vt, v_cache_ptr, page, in_page, num_kv_heads, stride_vh, page_size,
        stride_cache_page, stride_cache_tok, stride_cache_head, v_inv, BLOCK_H, HEAD_DIM, FP8,
    )  # fmt: skip


def scale_args(kv_cache: torch.Tensor, kv_scales: KVScales | None) -> tuple[torch.Tensor, ...]:
    """The k/v scale pointers a kernel takes (the cache itself stands in, unread, when the cache
    is not FP8)."""
    check_kv_scales(kv_cache, kv_scales)
    if is_fp8_kv(kv_cache):
        assert kv_scales is not None
        return kv_scales
    return kv_cache, kv_cache


def store_kv_cache(
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    kv_cache: torch.Tensor,  # [2, num_pages, page_size, Hkv, D]
    slot_mapping: torch.Tensor,  # int64 [T]; < 0 = skip the row
    kv_scales: KVScales | None = None,  # needed by an FP8 cache
    *,
    pdl: bool = False,
) -> None:
    require_triton()
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert kv_cache.shape[-2:] == (num_kv_heads, head_dim), "k/v heads do not match the cache"
    assert head_dim == next_pow2(head_dim), "head_dim must be a power of two"
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and kv_cache.stride(-1) == 1
    k_cache, v_cache = cache_keys(kv_cache), kv_cache[1]  # keys [pages, page, Hkv, D]
    _store_kv_cache_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        *scale_args(kv_cache, kv_scales),
        kv_cache.shape[2],
        num_kv_heads,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        BLOCK_H=next_pow2(num_kv_heads),
        HEAD_DIM=head_dim,
        FP8=is_fp8_kv(kv_cache),
        num_warps=4 if num_kv_heads * head_dim >= 1024 else 2,
        **launch_options(pdl),
    )
