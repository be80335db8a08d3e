"""A run directory: result.json, requests.jsonl, PNG plots and report.html, written from records
and re-rendered from them by `kvserve bench report DIR`."""

from __future__ import annotations

import json
from pathlib import Path

from kvserve.bench import metrics, plots, report_html, report_text
from kvserve.bench.records import RequestRecord, read_records, write_records
from kvserve.errors import ConfigError


def result_dict(records: list[RequestRecord], meta: dict, server: dict | None) -> dict:
    result = metrics.compute(records, meta.get("slos_s"), meta.get("prices"))
    result["meta"] = meta
    if server is not None:
        result["server_metrics"] = server
    return result


def _monitor_section(meta: dict) -> dict[str, str]:
    """Hook for `kvserve monitor` samples (a JSONL file of dicts) given with --monitor-samples."""
    path = meta.get("monitor_samples")
    if not path or not Path(path).is_file():
        return {}
    rows = []
    for line in Path(path).read_text().splitlines()[:500]:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return {"GPU samples (kvserve monitor)": report_html.table(rows)} if rows else {}


def write_reports(out: Path, records: list[RequestRecord], result: dict) -> str:
    """Writes result.json, plots and report.html; returns the printed block."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=2, sort_keys=True))
    pngs = [plots.latency_cdfs(records, out / "latency_cdfs.png"),
            plots.tokens_over_time(records, out / "tokens_over_time.png")]  # fmt: skip
    block = report_text.render(result)
    meta = result["meta"]
    title = f"kvserve bench: {meta.get('profile', '')} against {meta.get('base_url', '')}"
    (out / "report.html").write_text(report_html.render(title, block, pngs, _monitor_section(meta)))
    return block


def write_run(out: Path, records: list[RequestRecord], meta: dict, server: dict | None) -> str:
    out.mkdir(parents=True, exist_ok=True)
    write_records(out / "requests.jsonl", records)
    return write_reports(out, records, result_dict(records, meta, server))


def rerender(out: Path) -> str:
    """Recomputes every figure from requests.jsonl (meta and server figures from result.json)."""
    if not out.is_dir():
        raise ConfigError(f"no run directory {str(out)!r}")
    try:
        old = json.loads((out / "result.json").read_text())
    except (OSError, ValueError):
        old = {}
    records = read_records(out / "requests.jsonl")
    return write_reports(out, records, result_dict(records, old.get("meta", {}),
                                                   old.get("server_metrics")))  # fmt: skip
