from __future__ import annotations

import json
from pathlib import Path

from cli_runner import run_kvserve
from conftest import replay_runner

from kvserve.preflight.monitor import (
    GpuSampler,
    SmiSource,
    iter_samples,
    sample_from_raw,
    sample_gpus,
)


def _source() -> SmiSource:
    return SmiSource(replay_runner({"nvidia-smi": "nvidia-smi_query_h100.csv"}))


def test_sample_decodes_throttle_and_units(fixtures: Path) -> None:
    raw = json.loads((fixtures / "nvml_hgx_h200_degraded.json").read_text())["devices"][2]
    s = sample_from_raw(raw, 2, 1700000000.0)
    assert (s.temp_c, s.sm_clock_mhz, s.max_sm_clock_mhz) == (96, 1275, 1980)
    assert s.power_w == 655.0 and s.power_limit_w == 700.0
    assert s.throttle == ["SwThermalSlowdown", "HwThermalSlowdown"]
    assert "gpu2 96C sm 1275/1980MHz" in s.line()
    assert json.loads(json.dumps(s.to_dict()))["throttle"] == s.throttle


def test_smi_source_samples_every_gpu() -> None:
    samples = sample_gpus(_source())
    assert [s.gpu for s in samples] == [0, 1, 2]
    assert samples[2].throttle == ["SwPowerCap", "SwThermalSlowdown"]


def test_iter_samples_stops_after_count() -> None:
    rounds = list(iter_samples(_source(), interval=0.01, count=3))
    assert len(rounds) == 3 and all(len(r) == 3 for r in rounds)


def test_background_sampler_collects_until_stopped() -> None:
    import time

    sampler = GpuSampler(interval=0.01, source=_source()).start()
    time.sleep(0.1)
    samples = sampler.stop()
    assert len(samples) >= 3 and len(samples) % 3 == 0
    assert samples[-1].ts >= samples[0].ts


def test_monitor_cli_without_gpu_is_one_line_exit_2(tmp_path: Path) -> None:
    proc = run_kvserve("monitor", "--count", "1", "--out", str(tmp_path / "gpu.jsonl"))
    if proc.returncode == 0:  # a machine with a GPU: the sample was written
        assert (tmp_path / "gpu.jsonl").read_text().count("\n") >= 1
        return
    assert proc.returncode == 2
    assert proc.stderr.startswith("kvserve monitor: error: no NVIDIA GPU to monitor")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_monitor_cli_rejects_bad_interval() -> None:
    proc = run_kvserve("monitor", "--interval", "0")
    assert proc.returncode == 2 and "--interval must be positive" in proc.stderr
