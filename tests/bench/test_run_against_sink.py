"""The client, runner, reports and CLI against a real load sink on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvserve.bench import outputs, tokens
from kvserve.bench.cli import main
from kvserve.bench.client import Target
from kvserve.bench.load_sink import running_sink
from kvserve.bench.profiles import WorkloadConfig, make_units
from kvserve.bench.runner import LoadConfig, run
from kvserve.bench.sweep import find_knee, summarize
from kvserve.errors import ConfigError


def _run(url: str, profile: str = "random", n: int = 40, **load) -> object:
    tok = tokens.load(None)
    cfg = WorkloadConfig(profile, seed=5, input_len=120, output_len=12, question_len=20,
                         prefix_len=200, groups=3, questions=4)  # fmt: skip
    open_loop = "request_rate" in load
    load = {"max_concurrency": 4, "num_requests": n, "quiet": True, **load}
    return run(make_units(cfg, tok), Target(url), tok, LoadConfig(**load), open_loop)


def test_counts_and_cache_match_server(sink_url: str) -> None:
    out = _run(sink_url, "shared-prefix", n=24, scrape_metrics=True)
    recs = out.records
    assert len(recs) == 24 and all(r.ok for r in recs)
    assert all(r.completion_tokens == 12 == len(r.chunk_times) for r in recs)
    assert all(r.token_source == "usage" for r in recs)
    deltas = out.server["deltas"]
    assert sum(r.prompt_tokens for r in recs) == deltas["prompt_tokens_total"]
    assert sum(r.completion_tokens for r in recs) == deltas["generation_tokens_total"]
    client_rate = sum(r.cached_tokens for r in recs) / sum(r.prompt_tokens for r in recs)
    assert client_rate == pytest.approx(out.server["server_cache_hit_rate"], abs=0.01)
    ideal = sum(r.ideal_cached_tokens for r in recs) / sum(r.prompt_tokens for r in recs)
    assert client_rate == pytest.approx(ideal, abs=0.02)
    assert client_rate > 0.5


def test_sessions_send_history_through_chat(sink_url: str) -> None:
    recs = _run(sink_url, "mixed", n=30).records
    chat = [r for r in recs if r.cls == "chat"]
    assert chat and all(r.session_id is not None for r in chat)
    by_session: dict[int, list] = {}
    for r in chat:
        by_session.setdefault(r.session_id, []).append(r)
    for turns in by_session.values():
        assert [r.turn for r in turns] == list(range(len(turns)))
        for a, b in zip(turns, turns[1:], strict=False):
            assert b.start >= a.end  # the next turn waits for the answer
            assert b.prompt_tokens > a.prompt_tokens  # and carries the history


def test_open_loop_rate(sink_url: str) -> None:
    """20 arrivals at a constant 50/s: spread over the schedule's 0.38 s from first to last (all
    at once without it), give or take a late first start, and what a busy 2-core machine delays
    an asyncio task by (a run beside other tests: 0.78 s)."""
    recs = _run(sink_url, n=20, max_concurrency=None, request_rate=50.0, arrival="constant").records
    starts = sorted(r.start for r in recs)
    assert 19 / 50.0 - 0.1 <= starts[-1] - starts[0] <= 19 / 50.0 + 0.8


@pytest.mark.parametrize(
    ("flags", "kind"),
    [(("--fail-every", "3"), "http_500"), (("--break-after", "4"), "stream"),
     (("--garbage",), "bad_response"), (("--no-text",), "no_output")],
)  # fmt: skip
def test_failures_are_counted_and_run_completes(flags: tuple[str, ...], kind: str) -> None:
    with running_sink(*flags) as url:
        recs = _run(url, n=12).records
    assert len(recs) == 12
    failed = [r for r in recs if not r.ok]
    assert failed and all(r.error_kind == kind and r.error for r in failed)
    if kind == "no_output":  # the tokens were made: the message says how many
        assert all("usage counts" in r.error and "completion tokens" in r.error for r in failed)


def test_api_key_and_unreachable_server() -> None:
    with running_sink("--api-key", "sekrit") as url, pytest.raises(ConfigError, match="api-key"):
        _run(url)
    with running_sink("--api-key", "sekrit") as url:
        tok = tokens.load(None)
        units = make_units(WorkloadConfig(input_len=50, output_len=3), tok)
        out = run(units, Target(url, api_key="sekrit"), tok, LoadConfig(num_requests=3, quiet=True),
                  open_loop=False)  # fmt: skip
        assert all(r.ok for r in out.records)
    with pytest.raises(ConfigError, match="cannot reach"):
        _run("http://127.0.0.1:9")


def test_cli_run_writes_outputs_and_report_rerenders(sink_url: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "a"
    argv = ["--base-url", sink_url, "--profile", "mixed", "--max-concurrency", "4",
            "--num-requests", "30", "--doc-len", "300", "--slo", "ttft=2s", "--slo", "tpot=100ms",
            "--price", "input=4,cached=1,output=16", "--warmup", "3", "--out", str(out),
            "--quiet", "--scrape-metrics"]  # fmt: skip
    assert main(argv) == 0
    block = capsys.readouterr().out
    assert "Serving Benchmark Result" in block and "P95 TTFT (ms):" in block
    assert "Revenue per day" in block and "SLO attainment" in block
    for name in ("result.json", "requests.jsonl", "latency_cdfs.png", "tokens_over_time.png"):
        assert (out / name).stat().st_size > 0
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and 'src="http' not in html and "<script" not in html
    first = json.loads((out / "result.json").read_text())
    assert first["completed"] == 30 and first["warmup_requests"] == 3
    assert set(first["per_class"]) == {"chat", "qa", "doc"}
    (out / "result.json").unlink()
    (out / "report.html").unlink()
    outputs.write_reports(out, [], {"meta": {}, **first})  # meta survives a missing result.json
    assert main(["report", str(out)]) == 0
    again = json.loads((out / "result.json").read_text())
    assert {k: v for k, v in again.items()} == first


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--num-requests", "5", "--duration", "3s"], "not both"),
     (["--profile", "trace", "--trace", "x.jsonl", "--request-rate", "3"], "timestamps"),
     (["--duration", "soon"], "duration"), (["--max-concurrency", "0"], "max-concurrency"),
     (["--trace", "x.jsonl"], "only for --profile trace"), (["--bogus"], "unrecognized"),
     (["--profile", "trace", "--trace", "/nonexistent.jsonl"], "no such file"),
     (["--tokenizer", "/nonexistent"], "no such file")],
)  # fmt: skip
def test_inconsistent_flags_are_config_errors(sink_url: str, argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        main(["--base-url", sink_url, "--quiet", *argv])


def test_sweep_runs_levels_and_marks_knee(sink_url: str, tmp_path: Path, capsys) -> None:
    argv = ["sweep", "--base-url", sink_url, "--concurrency", "1,2", "--duration", "0.5s",
            "--input-len", "50", "--output-len", "4", "--out", str(tmp_path),
            "--quiet"]  # fmt: skip
    assert main(argv) == 0
    assert "Recommended concurrency" in capsys.readouterr().out
    data = json.loads((tmp_path / "sweep.json").read_text())
    assert [lv["concurrency"] for lv in data["levels"]] == [1, 2]
    assert (tmp_path / "sweep.png").stat().st_size > 0 and (
        tmp_path / "c2" / "result.json"
    ).exists()


def test_knee_definition() -> None:
    def lv(c: int, thr: float, p99: float) -> dict:
        return {"concurrency": c, "output_throughput": thr, "p99_ttft_ms": p99}

    levels = [lv(32, 1000, 100), lv(64, 1900, 120), lv(128, 2000, 300), lv(256, 2050, 900)]
    s = summarize(levels, 0.1)
    assert s["knee_concurrency"] == 128 and s["recommended_concurrency"] == 64
    assert find_knee([lv(1, 100, 10), lv(2, 200, 11), lv(4, 400, 12)], 0.1) is None
    # flat throughput but falling TTFT is not a knee
    assert find_knee([lv(1, 100, 50), lv(2, 101, 40)], 0.1) is None
