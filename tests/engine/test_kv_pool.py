"""The KV pool on CPU: pages copied to host memory and back bit for bit, FP8 KV with per-layer
scales, and the page arithmetic every layer shares."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvserve.engine.runner.kv_pool import KVPool, PageGeometry, resolve_kv_dtype
from kvserve.errors import ConfigError
from kvserve.kv_layout import pages_for

GEOMETRY = PageGeometry(num_layers=3, num_pages=8, page_size=4, num_kv_heads=2, head_dim=16)


def _filled(dtype: torch.dtype, seed: int) -> KVPool:
    pool = KVPool.allocate(GEOMETRY, dtype, torch.device("cpu"))
    gen = torch.Generator().manual_seed(seed)
    for layer in pool.layers:
        layer.copy_(torch.randn(layer.shape, generator=gen).to(dtype))
    return pool


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_pages_go_to_host_and_back_bit_exact(dtype: torch.dtype) -> None:
    src, dst = _filled(dtype, 0), _filled(dtype, 1)
    host = src.export_pages([5, 1, 6])
    assert host.device.type == "cpu" and host.dtype == dtype
    assert host.shape == (3, 2, 3, 4, 2, 16)
    before = [layer.clone() for layer in dst.layers]
    dst.import_pages([0, 7, 3], host)
    for i, (s, d, old) in enumerate(zip(src.layers, dst.layers, before, strict=True)):
        raw_s, raw_d = s.view(torch.uint8), d.view(torch.uint8)
        for src_page, dst_page in ((5, 0), (1, 7), (6, 3)):
            assert torch.equal(raw_s[:, src_page], raw_d[:, dst_page]), (i, src_page)
        untouched = [p for p in range(GEOMETRY.num_pages) if p not in (0, 7, 3)]
        assert torch.equal(d.view(torch.uint8)[:, untouched], old.view(torch.uint8)[:, untouched])


def test_import_refuses_pages_of_another_shape() -> None:
    pool = _filled(torch.float32, 0)
    with pytest.raises(ValueError, match="do not fit"):
        pool.import_pages([0, 1], pool.export_pages([0]))


def test_fp8_store_and_load_with_per_layer_scales() -> None:
    pool = KVPool.allocate(GEOMETRY, torch.float8_e4m3fn, torch.device("cpu"))
    assert pool.is_fp8 and pool.bytes_per_token == 2 * 3 * 2 * 16
    gen = torch.Generator().manual_seed(0)
    slots = torch.tensor([0, 1, 2, 3, 9, 10, 31])  # pages 0, 2 and 7
    for layer, scale in enumerate((0.01, 1.0, 4.0)):
        pool.set_scales(layer, scale, 2 * scale)
        k = torch.randn(len(slots), 2, 16, generator=gen) * 100 * scale
        v = torch.randn(len(slots), 2, 16, generator=gen) * 100 * scale
        pool.store(layer, k, v, slots)
        k_out, v_out = pool.load(layer, torch.tensor([0, 2, 7]), torch.float32)
        rows = torch.tensor([0, 1, 2, 3, 5, 6, 11])  # the slots' rows among pages 0, 2, 7
        # e4m3 keeps 3 mantissa bits: a relative error of at most 2^-4, plus the subnormals
        for got, want, s in ((k_out[rows], k, scale), (v_out[rows], v, 2 * scale)):
            assert torch.allclose(got, want, rtol=2**-4, atol=2**-9 * s), layer
        # an unwritten row of a written page stays zero
        assert k_out[4].abs().max() == 0


def test_fp8_pool_stores_pages_heads_major() -> None:
    """An FP8 page holds its keys as [Hkv, page_size, D] and its values as [Hkv, D, page_size]
    (the FP8 kernels' read order): one stored token's bytes land where each order puts them."""
    pool = KVPool.allocate(GEOMETRY, torch.float8_e4m3fn, torch.device("cpu"))
    page_size, heads, dims = GEOMETRY.page_size, 2, 16
    k = torch.arange(heads * dims, dtype=torch.float32).view(1, heads, dims) / 8
    k = k.to(torch.float8_e4m3fn).float()  # exact in e4m3 (the layer's scales are 1)
    v = -k
    slot = 2 * page_size + 3  # page 2, slot 3
    pool.store(0, k, v, torch.tensor([slot]))
    page = pool.layers[0][:, 2].float()  # [2, page_size, Hkv, D] as memory holds it
    keys = page[0].reshape(heads, page_size, dims)
    assert torch.equal(keys[:, 3], k[0])
    assert page[0].count_nonzero() == heads * dims - 1  # k[0, 0, 0] is zero
    values = page[1].reshape(heads, dims, page_size)
    assert torch.equal(values[:, :, 3], v[0])
    assert page[1].count_nonzero() == heads * dims - 1  # v[0, 0, 0] is zero


def test_float_pool_stores_and_loads_exactly() -> None:
    pool = KVPool.allocate(GEOMETRY, torch.float32, torch.device("cpu"))
    k, v = torch.randn(2, 5, 2, 16)
    pool.store(1, k, v, torch.tensor([4, 5, 6, 7, 8]))
    k_out, v_out = pool.load(1, torch.tensor([1, 2]), torch.float32)
    assert torch.equal(k_out[:5], k) and torch.equal(v_out[:5], v)


def test_one_tensor_for_all_layers() -> None:
    pool = KVPool.allocate(
        GEOMETRY, torch.float32, torch.device("cpu"), one_tensor_for_all_layers=True
    )
    assert all(layer is pool.layer(0) for layer in pool.layers)


def test_kv_cache_dtype_names() -> None:
    assert resolve_kv_dtype("auto", torch.bfloat16) is torch.bfloat16
    assert resolve_kv_dtype("float32", torch.float32) is torch.float32
    for name in ("fp8", "fp8_e4m3"):
        for model_dtype in (torch.bfloat16, torch.float16, torch.float32):
            assert resolve_kv_dtype(name, model_dtype) is torch.float8_e4m3fn
    with pytest.raises(ConfigError, match="does not match the model dtype"):
        resolve_kv_dtype("bfloat16", torch.float32)
    with pytest.raises(ConfigError, match="fp8_e5m2"):
        resolve_kv_dtype("fp8_e5m2", torch.float32)
    with pytest.raises(ConfigError, match="auto"):
        resolve_kv_dtype("int4", torch.float32)


def test_pages_for_ints_and_arrays() -> None:
    assert [pages_for(n, 16) for n in (0, 1, 16, 17, 32)] == [0, 1, 1, 2, 2]
    assert GEOMETRY.pages_for(9) == 3
    assert pages_for(np.array([0, 1, 16, 17]), 16).tolist() == [0, 1, 1, 2]
