"""Where every benchmark writes: benchmarks/results/<name>_<date>.json, stamped with the
machine, date and commit so a figure can be traced to what produced it."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).parent / "results"


def git_commit() -> str:
    """KVSERVE_COMMIT when set (a copy of the tree run elsewhere may carry a stale .git), else
    the checkout's HEAD."""
    if os.environ.get("KVSERVE_COMMIT"):
        return os.environ["KVSERVE_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": _cpu_name(),
        "cpu_count": os.cpu_count(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def write_result(name: str, payload: dict[str, Any], out_dir: Path | None = None) -> Path:
    today = dt.date.today().isoformat()
    record = {
        "benchmark": name,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine(),
        **payload,
    }
    directory = out_dir or RESULTS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}_{today}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
