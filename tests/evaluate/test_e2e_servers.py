"""End to end on CPU: the bundled model behind two real ``kvserve serve`` processes, the
baseline (float32) and a candidate quantized online to FP8, run through ``kvserve eval``
as a user runs it; then a planted regression (a real proxy that corrupts one task type's
answers) is flagged on exactly that type, the baseline comes from the cache, and the baseline
against itself flags nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runner import run_kvserve

from kvserve.server.launch import launch_server
from tests.evaluate.corrupting_proxy import CorruptingProxy

# The candidate's serve flags: the bundled model quantized online (any `kvserve serve` flags work).
CANDIDATE_FLAGS = ("--quantization", "fp8", "--api-key", "cand-key")  # a key: checked too
PLANTED = "extraction"  # its prompts are the only ones that ask for JSON
PER_TYPE = 2
NUM_TYPES = 7
# English only: the bundled 135M model gets a score > 0 on both English extraction tasks (a
# drop needs something to drop from) but on almost no Chinese one; its JSON needs up to ~60
# tokens (at 48 the second task's JSON was cut short and scored 0, hiding the planted drop).
ARGS = ("--per-type", str(PER_TYPE), "--lang", "en", "--max-tokens", "64", "--concurrency", "8",
        "--quiet")  # fmt: skip


def _asks_for_json(body: dict) -> bool:
    return "JSON" in json.dumps(body.get("messages") or body.get("prompt"), ensure_ascii=False)


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[str, str]]:
    base, cand = launch_server(), launch_server(*CANDIDATE_FLAGS)  # both load at once
    try:
        urls = base.wait_healthy(1200), cand.wait_healthy(1200)  # a busy shared machine
    except BaseException:
        base.stop(), cand.stop()
        raise
    yield urls
    assert (base.stop(), cand.stop()) == (0, 0)  # both drained and exited cleanly


def _result(out: Path) -> dict:
    return json.loads((out / "result.json").read_text())


def _verdicts(result: dict, name: str) -> dict[str, str]:
    return {row["type"]: row["candidates"][name]["verdict"] for row in result["types"]}


@pytest.mark.timeout(7200)  # hang guards only: ~2 min on 2 idle cores, 23 at load 13
def test_eval_end_to_end(servers: tuple[str, str], tmp_path: Path) -> None:
    base_url, cand_url = servers
    out = tmp_path / "run"
    n = PER_TYPE * NUM_TYPES

    # 1. baseline vs the other engine settings (the baseline against itself is step 3: on the six
    # types the proxy passes through, the same server asked again must flag none)
    targets = ("--baseline", base_url, "--candidate", f"other={cand_url},api_key=cand-key")
    run = run_kvserve("eval", *targets, *ARGS, "--out", str(out), timeout=2400)
    assert run.returncode == 0, run.stderr
    result = _result(out)
    assert result["meta"]["targets"]["baseline"]["sent"] == n
    assert len(result["types"]) == NUM_TYPES + 1 and result["types"][-1]["type"] == "overall"
    for row in result["types"]:
        assert 0.0 <= row["candidates"]["other"]["rouge_l"] <= 100.0
    rows = [json.loads(line) for line in (out / "outputs.jsonl").read_text().splitlines()]
    assert len(rows) == n and {len(r["outputs"]) for r in rows} == {2}
    assert "candidate other" in run.stdout

    # 2. a wrong key is one line (a new name: "other"'s outputs are all in the cache)
    run = run_kvserve("eval", "--baseline", base_url, "--candidate", f"keyed={cand_url}",
                      *ARGS, "--api-key", "wrong", "--out", str(out), timeout=600)  # fmt: skip
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip() == f"kvserve eval: error: {cand_url} refused the request " \
        "(HTTP 401): --api-key?", run.stderr  # fmt: skip

    # 3. a new candidate, with answers on one type corrupted: only that type is flagged and
    # the baseline is not asked again
    with CorruptingProxy(base_url, _asks_for_json) as proxy:
        planted_spec = f"planted={proxy.url}"
        run = run_kvserve("eval", "--baseline", base_url, "--candidate", planted_spec, *ARGS,
                          "--out", str(out), "--fail-on-regression", timeout=2400)  # fmt: skip
    assert run.returncode == 1, run.stderr  # --fail-on-regression
    result = _result(out)
    assert result["meta"]["targets"]["baseline"] == {**result["meta"]["targets"]["baseline"],
                                                     "from_cache": n, "sent": 0}  # fmt: skip
    assert proxy.requests == n and proxy.corrupted == PER_TYPE
    planted = next(r for r in result["types"] if r["type"] == PLANTED)
    assert planted["baseline"]["score"] > 30, "the baseline must score on the planted type"
    verdicts = _verdicts(result, "planted")
    assert verdicts.pop("overall") == "regressed"  # every other type is the baseline's own
    assert [t for t, v in verdicts.items() if v == "regressed"] == [PLANTED], run.stdout
    html = (out / "report.html").read_text()
    assert f"Worst examples: planted on {PLANTED}" in html and "data:image/png;base64," in html

    # 4. `kvserve eval report` renders the run again
    report = run_kvserve("eval", "report", str(out), timeout=600)
    assert report.returncode == 0 and "planted: regressed on extraction" in report.stdout
