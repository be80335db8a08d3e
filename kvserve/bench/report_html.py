"""A self-contained HTML report: the printed block, the per-class table and the PNGs embedded
as base64 (no network assets)."""

from __future__ import annotations

import base64
import html
from pathlib import Path


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def render(title: str, text_block: str, plots: list[Path], extra: dict[str, str] | None = None
           ) -> str:  # fmt: skip
    """``extra``: more titled HTML sections (e.g. GPU samples from `kvserve monitor`)."""
    sections = [f"<h2>{html.escape(k)}</h2>{v}" for k, v in (extra or {}).items()]
    return "\n".join([
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;margin:2em} pre{background:#f6f6f6;padding:1em}"
        " img{max-width:100%;display:block;margin:1em 0}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<pre>{html.escape(text_block)}</pre>",
        *(_img(p) for p in plots),
        *sections,
        "</body></html>",
    ])  # fmt: skip


def table(rows: list[dict]) -> str:
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(str(k))}</th>" for k in rows[0])
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row.values()) + "</tr>"
        for row in rows
    )
    return f"<table border='1' cellpadding='4'><tr>{head}</tr>{body}</table>"


def _fmt(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)
