"""The worst examples of a regressed type: the items where the candidate lost most against the
baseline (task score first, then ROUGE-L), shown side by side in the report."""

from __future__ import annotations

import html
from typing import Any


def worst_items(rows: list[dict], kind: str, base: str, cand: str, k: int = 3) -> list[dict]:
    def loss(r: dict) -> tuple[float, float]:
        s = r["scores"]
        drop = 0.0 if s[base] is None else (s[cand] or 0.0) - s[base]
        return (drop, r["rouge_l"][cand])

    mine = [r for r in rows if r["type"] == kind and not r["agree"][cand]]
    return sorted(mine, key=loss)[:k]


def _cell(text: Any) -> str:
    return f"<td><pre>{html.escape(str(text))}</pre></td>"


def side_by_side(items: list[dict], base: str, cand: str) -> str:
    titles = ("prompt", "answer", f"{base} (baseline)", cand, "scores", "ROUGE-L")
    head = "".join(f"<th>{html.escape(t)}</th>" for t in titles)
    body = []
    for r in items:
        prompt = r["request"].get("prompt") or r["request"]["messages"][-1]["content"]
        scores = f"{r['scores'][base]} -> {r['scores'][cand]}"
        body.append("<tr>" + _cell(prompt) + _cell(r["answer"]) + _cell(r["outputs"][base])
                    + _cell(r["outputs"][cand]) + _cell(scores)
                    + _cell(f"{100 * r['rouge_l'][cand]:.1f}") + "</tr>")  # fmt: skip
    return (f"<table border='1' cellpadding='4' style='table-layout:fixed;width:100%'>"
            f"<tr>{head}</tr>{''.join(body)}</table>")  # fmt: skip
