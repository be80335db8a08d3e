"""The start manifest (``kvserve.engine.runner.start_manifest``): the kernel list a start
recorded, kept in Triton's cache directory under a signature of what decides it, so that the
next start of the same engine skips the recording pass. The engine's use of it runs on the
H200 (``tests/gpu/test_engine_gpu.py``); here, the file and the signature on the CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvserve.config import SchedulerConfig
from kvserve.engine.runner.kv_pool import KVPool, PageGeometry
from kvserve.engine.runner.start_manifest import StartManifest, signature_lines
from kvserve.engine.runner.warm_start import StartPasses
from kvserve.kernels._triton import HAS_TRITON
from kvserve.kernels.compile_ahead import KernelSpec
from kvserve.layers.attention.triton_backend import TritonAttentionBackend

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="the signature hashes Triton kernels")
TARGET = ["cuda", 90, 32]


def _passes(hidden: int = 64, pdl: bool = True, kv_dtype: torch.dtype = torch.bfloat16,
            pages: int = 8) -> StartPasses:  # fmt: skip
    model = torch.nn.Sequential(torch.nn.Embedding(32, hidden), torch.nn.Linear(hidden, 32))
    kv = KVPool.allocate(PageGeometry(2, pages, 16, 2, 32), kv_dtype, torch.device("cpu"))
    return StartPasses(
        model, kv, TritonAttentionBackend(pdl=pdl), None, 4096, SchedulerConfig(), 8, 256,
        hidden, torch.bfloat16, torch.device("cpu"), None,
    )  # fmt: skip


def _signature(passes: StartPasses) -> str:
    return StartManifest.of(passes, TARGET).path.stem


@needs_triton
def test_the_signature_is_the_same_for_the_same_engine_and_names_what_differs(
    monkeypatch,  # noqa: ANN001
) -> None:
    assert _signature(_passes()) == _signature(_passes())
    # the KV pool's page count follows free memory: it does not change the kernels
    assert _signature(_passes(pages=8)) == _signature(_passes(pages=24))
    base = set(signature_lines(_passes(), TARGET))
    for changed in (_passes(hidden=128), _passes(pdl=False), _passes(kv_dtype=torch.float16)):
        assert set(signature_lines(changed, TARGET)) != base
        assert _signature(changed) != _signature(_passes())
    bigger = dataclasses.replace(_passes(), scheduler=SchedulerConfig(max_running_requests=512))
    assert _signature(bigger) != _signature(_passes())
    assert (
        StartManifest.of(_passes(), ["cuda", 100, 32]).path
        != StartManifest.of(_passes(), TARGET).path
    )
    monkeypatch.setenv("KVSERVE_DECODE_BALANCED", "0")
    assert "KVSERVE_DECODE_BALANCED=0" in signature_lines(_passes(), TARGET)


def test_a_kept_list_reads_back_and_a_bad_or_missing_one_reads_as_none(tmp_path) -> None:  # noqa: ANN001
    manifest = StartManifest("abc", cache_dir=str(tmp_path))
    assert manifest.load() is None
    specs = [KernelSpec("kvserve.kernels.rmsnorm", "_rms_norm_kernel", '{"a": [1, 2]}'),
             KernelSpec("kvserve.kernels.rotary", "_rotary_kernel", "{}")]  # fmt: skip
    manifest.save(specs)
    assert manifest.load() == specs
    assert [p.name for p in manifest.path.parent.iterdir()] == ["abc.json"]  # no temp left
    manifest.path.write_text('[{"module": "m"}]')  # a field missing
    assert manifest.load() is None
    manifest.path.write_text("not json")
    assert manifest.load() is None
    manifest.forget()
    assert not manifest.path.exists()
    manifest.forget()  # twice is fine


def test_a_manifest_that_cannot_be_written_is_skipped(tmp_path) -> None:  # noqa: ANN001
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the manifests' directory would go
    manifest = StartManifest("abc", cache_dir=str(blocked))
    manifest.save([KernelSpec("m", "n", "{}")])
    assert manifest.load() is None
