"""`kvserve generate` as a user runs it: a real subprocess on the bundled model."""

from __future__ import annotations

import json
import subprocess

from cli_runner import run_kvserve


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_kvserve("generate", *args, timeout=300)


def test_generate_chat_json() -> None:
    proc = _run("--chat", "What is the capital of France?", "--max-tokens", "12", "--json",
                "--device", "cpu")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "Paris" in out["text"]
    assert out["completion_tokens"] <= 12 and out["prompt_tokens"] > 0


def test_generate_bad_input_is_one_line() -> None:
    proc = _run("--prompt", "hi", "--max-tokens", "0")
    assert proc.returncode == 2
    assert "max_tokens must be at least 1" in proc.stderr
    assert "Traceback" not in proc.stderr
    missing = _run("--prompt", "hi", "--model", "/nonexistent/model.gguf")
    assert missing.returncode == 2 and "no such file" in missing.stderr
