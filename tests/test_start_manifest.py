"""The start manifest (``kvserve.engine.runner.start_manifest``): the kernel list a start
recorded, kept in Triton's cache directory under a signature of what decides it, so that the
next start of the same engine skips the recording pass. The engine's use of it runs on the
H200 (``tests/gpu/test_engine_gpu.py``); here, the file and the signature on the CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from triton_target import compile_rms_norm, hopper_driver  # noqa: F401 - a fixture

from kvserve.config import SchedulerConfig
from kvserve.engine.runner.kv_pool import KVPool, PageGeometry
from kvserve.engine.runner.start_manifest import StartManifest, signature_lines
from kvserve.engine.runner.warm_start import StartPasses, StartReport, warm_start
from kvserve.kernels._triton import HAS_TRITON
from kvserve.kernels.compile_ahead import CompilerPool, KernelSpec
from kvserve.layers.attention.triton_backend import TritonAttentionBackend

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="the signature hashes Triton kernels")
TARGET = ["cuda", 90, 32]


def _passes(hidden: int = 64, pdl: bool = True, kv_dtype: torch.dtype = torch.bfloat16,
            pages: int = 8, kind: type[StartPasses] = StartPasses,
            compilers: CompilerPool | None = None) -> StartPasses:  # fmt: skip
    model = torch.nn.Sequential(torch.nn.Embedding(32, hidden), torch.nn.Linear(hidden, 32))
    kv = KVPool.allocate(PageGeometry(2, pages, 16, 2, 32), kv_dtype, torch.device("cpu"))
    return kind(
        model, kv, TritonAttentionBackend(pdl=pdl), None, 4096, SchedulerConfig(), 8, 256,
        hidden, torch.bfloat16, torch.device("cpu"), compilers,
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
    # a private attribute (cuDNN's handle: an address) does not count; a public switch does
    handled = _passes()
    handled.backend._handle = 0x7F00DEAD  # type: ignore[attr-defined]
    assert _signature(handled) == _signature(_passes())
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


NORMS = [(256, True), (256, False), (512, True)]


@dataclasses.dataclass(frozen=True)
class _NormPasses(StartPasses):
    """A start whose passes are three RMSNorm kernels, compiled as their launches would compile
    them (``warmup``: on the CPU nothing can launch). The rest of the start is the engine's."""

    def run(self, record: bool) -> None:
        for hidden, residual in NORMS:
            compile_rms_norm(hidden, residual)


def _start() -> tuple[StartReport, StartManifest]:
    from kvserve.kernels.rmsnorm import _rms_norm_kernel

    _rms_norm_kernel.device_caches.clear()  # as a new process: nothing compiled in memory
    passes = _passes(kind=_NormPasses, compilers=CompilerPool(1))
    _, report = warm_start(passes)
    return report, StartManifest.of(passes, TARGET)


@needs_triton
@pytest.mark.usefixtures("hopper_driver")
def test_a_second_start_compiles_from_the_kept_list_and_a_short_list_is_dropped(
    tmp_path,  # noqa: ANN001
) -> None:
    import shutil

    first, manifest = _start()  # an empty cache: recorded, compiled ahead, loaded from disk
    assert first.recorded and (first.ahead.kernels, first.ahead.cached) == (3, 0)
    assert first.late_compiles == [] and first.cached == 3
    assert manifest.path.parent.parent == tmp_path / "triton" and len(manifest.load()) == 3

    second, _ = _start()  # the same engine again: the kept list, nothing recorded or compiled
    assert not second.recorded and (second.ahead.kernels, second.ahead.cached) == (3, 3)
    assert second.ahead.compile_s == {} and second.late_compiles == [] and second.cached == 3

    # A list short of two kernels, with the disk cache emptied: those two compile at their
    # launch, and the list is dropped, so that the start after records again.
    manifest.save(manifest.load()[:1])
    for entry in (tmp_path / "triton").iterdir():
        if entry != manifest.path.parent:
            shutil.rmtree(entry)
    third, _ = _start()
    assert not third.recorded and third.late_compiles == ["_rms_norm_kernel"] * 2
    assert not manifest.path.exists()
    fourth, _ = _start()
    assert fourth.recorded and fourth.late_compiles == [] and len(manifest.load()) == 3
