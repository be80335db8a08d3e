"""The report's chart: per type, each candidate's task-score delta with its 95% interval, and
its ROUGE-L against the baseline with its interval."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _bars(ax: Any, rows: list[dict], names: list[str], key: str, ci_key: str) -> None:
    height = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        ys, xs, lo, hi = [], [], [], []
        for j, row in enumerate(rows):
            c = row["candidates"][name]
            if c[key] is None:
                continue
            ys.append(j + (i - (len(names) - 1) / 2) * height)
            xs.append(c[key])
            lo.append(max(c[key] - c[ci_key][0], 0.0))
            hi.append(max(c[ci_key][1] - c[key], 0.0))
        ax.barh(ys, xs, height=height, xerr=[lo, hi], capsize=3, label=name)
    ax.set_yticks(range(len(rows)), [r["type"] for r in rows])
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)


def delta_chart(result: dict[str, Any], path: Path) -> Path:
    rows, names = result["types"], result["meta"]["candidates"]
    threshold = result["meta"]["threshold"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 0.5 * len(rows) + 1.8), sharey=True)
    _bars(left, rows, names, "delta", "ci")
    left.axvline(0, color="black", linewidth=0.8)
    left.axvline(-threshold, color="tab:red", linestyle=":", label=f"-{threshold:g} points")
    left.set_xlabel("task score: candidate - baseline (points, 95% interval)")
    left.legend(loc="lower left", fontsize=8)
    _bars(right, rows, names, "rouge_l", "rouge_l_ci")
    right.set_xlim(0, 100)
    right.set_xlabel("ROUGE-L F1 against the baseline (points)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
