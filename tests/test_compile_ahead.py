"""Compiling a start's Triton kernels ahead (``kvserve.kernels.compile_ahead``): a launch
recorded under the compile hook, compiled by a worker process into Triton's disk cache, then
found there by the same launch in this process. Triton compiles for the H200's target without a
GPU; on this CPU machine only Triton's driver, which supplies that target to a launch, stands in
(the worker takes the target from the spec and needs none). The engine's start with it runs on
the H200 (``tests/gpu/test_engine_gpu.py``)."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from triton_target import compile_rms_norm, hopper_driver  # noqa: F401 - a fixture

from kvserve.errors import ConfigError
from kvserve.kernels import compile_ahead
from kvserve.kernels._triton import HAS_TRITON
from kvserve.kernels.fp4_async_gemm import HAS_GLUON
from kvserve.kernels.kernel_hashes import settle_kernel_hashes

cpus = compile_ahead.usable_cpus()
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="needs Triton's compiler")


@pytest.mark.parametrize(
    ("value", "want"), [(None, min(16, max(1, cpus // 2))), ("0", 0), ("3", 3),
                        ("auto", min(16, max(1, cpus // 2)))],
)  # fmt: skip
def test_the_worker_count_is_read_from_the_environment(monkeypatch, value, want: int) -> None:  # noqa: ANN001
    if value is None:
        monkeypatch.delenv(compile_ahead.COMPILE_WORKERS_ENV, raising=False)
    else:
        monkeypatch.setenv(compile_ahead.COMPILE_WORKERS_ENV, value)
    compile_ahead.compile_workers_setting.cache_clear()
    try:
        assert compile_ahead.compile_workers_setting() == want
    finally:
        compile_ahead.compile_workers_setting.cache_clear()


def test_auto_shares_the_cpus_among_a_tensor_parallel_groups_ranks(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv(compile_ahead.COMPILE_WORKERS_ENV, "auto")
    monkeypatch.setattr(compile_ahead, "usable_cpus", lambda: 128)
    compile_ahead.compile_workers_setting.cache_clear()
    try:
        got = [compile_ahead.compile_workers_setting(ranks) for ranks in (1, 2, 8, 128)]
        assert got == [16, 16, 8, 1]  # at most 16 a rank, and at least one
        monkeypatch.setenv(compile_ahead.COMPILE_WORKERS_ENV, "3")  # a number is per rank
        compile_ahead.compile_workers_setting.cache_clear()
        assert compile_ahead.compile_workers_setting(8) == 3
    finally:
        compile_ahead.compile_workers_setting.cache_clear()


@pytest.mark.parametrize("value", ["-1", "two", ""])
def test_a_bad_worker_count_is_refused_in_one_line(monkeypatch, value: str) -> None:  # noqa: ANN001
    monkeypatch.setenv(compile_ahead.COMPILE_WORKERS_ENV, value)
    compile_ahead.compile_workers_setting.cache_clear()
    try:
        with pytest.raises(ConfigError, match="KVSERVE_COMPILE_WORKERS"):
            compile_ahead.compile_workers_setting()
    finally:
        compile_ahead.compile_workers_setting.cache_clear()


@needs_triton
@pytest.mark.usefixtures("hopper_driver")
def test_recorded_kernels_compiled_by_workers_are_found_in_the_cache() -> None:
    from kvserve.kernels.rmsnorm import _rms_norm_kernel

    shapes = [(256, True), (256, False), (512, True)]
    with compile_ahead.recording_compiles() as specs:
        for hidden, residual in [*shapes, shapes[0]]:  # the repeat is recorded once
            compile_rms_norm(hidden, residual)
    assert [s.name for s in specs] == ["_rms_norm_kernel"] * 3
    assert {s.module for s in specs} == {"kvserve.kernels.rmsnorm"}
    with compile_ahead.counting_compiles() as nothing_yet:
        pass
    assert nothing_yet.compiled == [] and nothing_yet.cached == 0

    report = compile_ahead.CompilerPool(2).compile(specs)
    assert (report.kernels, report.cached, report.failed, report.workers) == (3, 0, [], 2)
    again = compile_ahead.CompilerPool(1).compile(specs)  # all in the disk cache: no jobs
    assert (again.kernels, again.cached, again.compile_s) == (3, 3, {})

    _rms_norm_kernel.device_caches.clear()  # forget what this process holds: read the disk
    with compile_ahead.counting_compiles() as count:
        for hidden, residual in shapes:
            compile_rms_norm(hidden, residual)
    assert count.compiled == [] and count.cached == 3
    with compile_ahead.counting_compiles() as count:
        compile_rms_norm(1024, True)  # never recorded: compiled here, and counted
    assert count.compiled == ["_rms_norm_kernel"] and count.cached == 0


@needs_triton
@pytest.mark.usefixtures("hopper_driver")
def test_a_kernel_the_worker_cannot_compile_is_reported_not_fatal() -> None:
    specs = [
        compile_ahead.KernelSpec("kvserve.kernels.rmsnorm", "no_such_kernel", "{}"),
        compile_ahead.KernelSpec("kvserve.kernels.rmsnorm", "_rms_norm_kernel", "not json"),
    ]
    report = compile_ahead.CompilerPool(1).compile(specs)
    assert report.kernels == 2 and len(report.failed) == 2
    assert "no_such_kernel" in report.failed[0] or "no_such_kernel" in report.failed[1]
    assert all("\n" not in line for line in report.failed)


def _fp8_attention_launches() -> None:
    """Decode and prefill attention over an FP8 cache, as the engine launches them (CPU
    tensors: Triton reads only their dtypes, strides and alignment). Past a compile, a launch
    needs the GPU driver's launcher, which the stand-in lacks: that error is expected here."""
    from kvserve.kernels.decode_attention import paged_decode_attention
    from kvserve.kernels.prefill_attention import paged_prefill_attention

    batch, heads, kv_heads, dim, page = 3, 32, 8, 128, 16
    cache = torch.zeros(2, 64, page, kv_heads, dim, dtype=torch.float8_e4m3fn)
    tables = torch.zeros(batch, 16, dtype=torch.int32)
    lens = torch.full((batch,), 40, dtype=torch.int32)
    scales = (torch.ones(1), torch.ones(1))
    q = torch.zeros(batch, heads, dim, dtype=torch.bfloat16)
    starts = torch.arange(batch + 1, dtype=torch.int32)
    for launch in (
        lambda: paged_decode_attention(q, cache, tables, lens, 0.1, kv_scales=scales, pdl=True),
        lambda: paged_prefill_attention(q, cache, starts, lens, tables, 1, 0.1, scales),
    ):
        try:
            launch()
        except AttributeError as exc:  # the stand-in driver has no launcher
            assert "launcher_cls" in str(exc)


@needs_triton
@pytest.mark.usefixtures("hopper_driver")
def test_kernels_that_call_helpers_hash_alike_in_the_engine_and_the_workers() -> None:
    """Triton 3.6 hashes a kernel differently depending on which kernels the process hashed
    first; FP8 attention's kernels were compiled by the workers under one name and looked for
    under another. Both sides settle every hash in one order first."""
    settle_kernel_hashes()
    with compile_ahead.recording_compiles() as specs:
        _fp8_attention_launches()
    assert {s.name for s in specs} == {"_fp8_decode_split_kernel", "_prefill_kernel"}
    report = compile_ahead.CompilerPool(2).compile(specs)
    assert report.failed == []
    with compile_ahead.counting_compiles() as count:
        _fp8_attention_launches()
    assert count.compiled == [] and count.cached == len(specs)


def _fp4_async_launch(triton_permute: bool = True) -> None:
    """The asynchronous FP4 GEMM (a Gluon kernel, after x's permutation by a Triton one) as
    ``fp4_linear`` launches it, on CPU tensors (the stand-in driver has no launcher: past a
    compile, that error is expected, so only the first kernel compiled launches)."""
    from kvserve.kernels.fp4_async_gemm import fp4_async_linear

    x = torch.zeros(64, 512, dtype=torch.bfloat16)
    packed = torch.zeros(256, 256, dtype=torch.uint8)
    try:
        scales = torch.zeros(256, 16, dtype=torch.uint8)
        fp4_async_linear(x, packed, scales, triton_permute=triton_permute)
    except AttributeError as exc:
        assert "launcher_cls" in str(exc)


@pytest.mark.skipif(not HAS_GLUON, reason="needs Triton's Gluon")
@pytest.mark.usefixtures("hopper_driver")
def test_a_gluon_kernel_is_compiled_by_the_workers_too() -> None:
    """A worker parses a Gluon kernel with Gluon's front end (Triton's own fails on its
    layouts), so the start finds it in the disk cache like the others; the recording skips
    the permutation's launch, so both kernels are recorded."""
    with compile_ahead.recording_compiles() as specs:
        _fp4_async_launch()
    assert [s.name for s in specs] == ["_permute_x_steps_kernel", "_fp4_async_kernel"]
    report = compile_ahead.CompilerPool(1).compile(specs)
    assert report.failed == []
    with compile_ahead.counting_compiles() as count:
        _fp4_async_launch()  # stops at the permutation's launch
        _fp4_async_launch(triton_permute=False)
    assert count.compiled == [] and count.cached == 2


@needs_triton
@pytest.mark.usefixtures("hopper_driver")
def test_a_kernel_compiled_before_the_recording_does_not_launch_in_it() -> None:
    """The recording runs the start's passes with every other kernel skipped: a kernel already
    compiled here would launch on outputs nothing wrote (on the GPU, an MoE step's expert ids:
    an illegal address). Nor is it recorded: the real passes find it in memory, so a worker
    compiling it would spend a process on nothing (and the start's count of kernels loaded from
    the disk cache would fall short of the kernels recorded)."""
    from kvserve.kernels.rmsnorm import _rms_norm_kernel

    compile_rms_norm(256, True)  # compiled in this process
    x = torch.zeros(4, 256, dtype=torch.bfloat16)
    w = torch.ones(256, dtype=torch.bfloat16)

    def launch() -> None:
        _rms_norm_kernel[(4,)](
            x, x, w, x, 256, 1e-6, 256, 256, 256, HAS_RESIDUAL=True, BLOCK=256, USE_PDL=True,
            num_warps=1,
        )  # fmt: skip

    with pytest.raises(AttributeError, match="launcher_cls"):  # it would launch: no launcher
        launch()
    with compile_ahead.recording_compiles() as specs:
        launch()  # neither launched nor recorded
        compile_rms_norm(384, True)  # not compiled in this process yet: recorded
    assert [s.name for s in specs] == ["_rms_norm_kernel"]
    with compile_ahead.counting_compiles() as count:
        compile_rms_norm(256, True)
    assert count.compiled == [] and count.cached == 0  # still held in memory


@needs_triton
@pytest.mark.usefixtures("hopper_driver")
def test_what_a_worker_prints_does_not_garble_its_answers(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """A module that prints on import, from Python and from the C level, as libraries do: the
    worker's answers stay one per job, in order, and the kernel after it still compiles."""
    (tmp_path / "noisy_module.py").write_text(
        "import os\nprint('hello from python')\nos.write(1, b'hello from C\\n')\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    with compile_ahead.recording_compiles() as recorded:
        compile_rms_norm(2048, True)
    noisy = compile_ahead.KernelSpec("noisy_module", "no_kernel", recorded[0].specialization)
    report = compile_ahead.CompilerPool(1).compile([noisy, *recorded])
    assert len(report.failed) == 1 and "noisy_module.no_kernel: AttributeError" in report.failed[0]
    assert list(report.compile_s) == ["_rms_norm_kernel #1"]
    with compile_ahead.counting_compiles() as count:
        compile_rms_norm(2048, True)
    assert count.compiled == [] and count.cached == 1


@needs_triton
@pytest.mark.usefixtures("hopper_driver")
def test_a_worker_that_does_not_answer_is_killed_not_waited_for(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """A compile that hangs (here a module whose import sleeps a minute) costs the start its
    time limit, not the start: the worker is killed, its kernel reported (an answer after the
    sleep would have been an AttributeError), the rest compiled."""
    (tmp_path / "sleepy_module.py").write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    with compile_ahead.recording_compiles() as recorded:
        compile_rms_norm(4096, True)
    sleepy = compile_ahead.KernelSpec("sleepy_module", "kernel", recorded[0].specialization)
    # the real kernel's answer took 4 s on 2 idle cores (both workers importing torch at once),
    # over 15 s with six test processes sharing them (the workers run at a lower priority)
    report = compile_ahead.CompilerPool(2).compile([sleepy, *recorded], job_timeout_s=30.0)
    assert report.failed == ["sleepy_module.kernel: no answer in 30.0 s"]
    assert list(report.compile_s) == ["_rms_norm_kernel #1"]


def test_workers_run_below_the_engines_priority() -> None:
    """The workers import torch while the engine builds its model: at a lower priority they
    take only CPU time the engine leaves (an empty list ends them)."""
    pool = compile_ahead.CompilerPool(2)
    own = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        for worker in pool.workers:
            want = min(compile_ahead.MAX_NICENESS, own + compile_ahead.WORKER_NICENESS)
            assert os.getpriority(os.PRIO_PROCESS, worker.pid) == want
    finally:
        report = pool.compile([])
    assert report.kernels == 0
    assert all(worker.poll() is not None for worker in pool.workers)
