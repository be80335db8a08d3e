"""Workers that die or change under load: no hang, ejection by health checks, retries that
lose no request that had not started, and the worker file changed at run time."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.router.conftest import SINK_HEALTH, complete
from tests.router.test_router_http import _wait_healthy, _workers


def spawn_sink(*flags: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "kvserve.bench.load_sink", *flags],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    line = proc.stdout.readline() if proc.stdout else ""
    assert line.startswith("listening on "), line
    return proc, line.split()[-1]


async def _one(client: httpx.AsyncClient, url: str) -> str:
    """'ok' (stream completed), 'in-band error' (failed after it started), or 'HTTP <status>'."""
    body = {"prompt": "x", "max_tokens": 8, "stream": True}
    resp = await client.post(url + "/v1/completions", json=body)
    if resp.status_code != 200:
        return f"HTTP {resp.status_code}"
    return "in-band error" if '"error"' in resp.text else "ok"


async def _load_while(url: str, victim: subprocess.Popen, victim_url: str,
                      clients: int = 20) -> tuple[list[str], float]:  # fmt: skip
    """`clients` loops of requests for ~3 s; the victim is killed after 1 s. Returns the
    outcomes and the seconds from the kill until /workers showed the victim unhealthy."""
    outcomes: list[str] = []
    stop = time.monotonic() + 3.0

    async def loop(client: httpx.AsyncClient) -> None:
        while time.monotonic() < stop:
            outcomes.append(await _one(client, url))

    async def ejected(client: httpx.AsyncClient, since: float) -> float:
        while True:
            workers = (await client.get(url + "/workers")).json()["workers"]
            if not next(w for w in workers if w["url"] == victim_url)["is_healthy"]:
                return time.monotonic() - since
            await asyncio.sleep(0.02)

    async with httpx.AsyncClient(timeout=30) as client:
        tasks = [asyncio.create_task(loop(client)) for _ in range(clients)]
        await asyncio.sleep(1.0)
        victim.send_signal(signal.SIGKILL)
        eject_s = await asyncio.wait_for(ejected(client, time.monotonic()), timeout=30)
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)  # no hang
    return outcomes, eject_s


def test_worker_killed_under_load_is_ejected_and_retries_lose_nothing(sinks, router) -> None:
    victim, victim_url = spawn_sink("--token-delay", "0.01")
    try:
        survivor = sinks("--token-delay", "0.01")
        interval = 0.5
        r = router("--worker-urls", victim_url, survivor, "--policy", "round_robin",
                   "--retry-max-retries", "3", "--retry-initial-backoff-ms", "10",
                   "--health-check-interval-secs", str(interval), "--health-failure-threshold",
                   "2", "--health-check-timeout-secs", "0.5", "--cb-failure-threshold", "1000",
                   *SINK_HEALTH)  # fmt: skip
        _wait_healthy(r.url, 2)
        outcomes, eject_s = asyncio.run(_load_while(r.url, victim, victim_url))
        # Only streams already running on the victim may fail, and only in-band.
        assert set(outcomes) <= {"ok", "in-band error"}, outcomes
        assert outcomes.count("ok") > 0.8 * len(outcomes)
        # Two failed checks at 0.5 s eject it within three intervals (+ the probe timeout and
        # slack for a loaded 2-core box).
        assert eject_s < 3 * interval + 1.0, eject_s
        assert {w["url"]: w["is_healthy"] for w in _workers(r.url)} == {
            victim_url: False, survivor: True}  # fmt: skip
        retries = httpx.get(r.url + "/metrics").text
        assert "kvserve_router:retries_total 0\n" not in retries
        assert complete(r.url, stream=True).status_code == 200
    finally:
        victim.kill()
        victim.wait()


def test_without_retries_a_dead_worker_is_a_quick_502_not_a_hang(sinks, router) -> None:
    victim, victim_url = spawn_sink()
    r = router("--worker-urls", victim_url, "--health-check-interval-secs", "60", *SINK_HEALTH)
    victim.kill()
    victim.wait()
    resp = complete(r.url, stream=True)
    assert resp.status_code == 502 and resp.json()["error"]["code"] == 502


def test_worker_file_adds_drains_and_removes_at_run_time(sinks, router, tmp_path: Path) -> None:
    a, b = sinks(), sinks()
    path = tmp_path / "workers.json"
    path.write_text(json.dumps([a]))
    r = router("--worker-file", str(path), "--worker-file-poll-secs", "0.1", "--policy",
               "round_robin", *SINK_HEALTH)  # fmt: skip

    def rewrite(entries: list[object]) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(entries))
        tmp.replace(path)  # atomic, as operators should edit it

    rewrite([a, {"url": b}])
    _wait_healthy(r.url, 2)
    for _ in range(4):
        assert complete(r.url, stream=True).status_code == 200
    assert {w["url"]: w["requests"] for w in _workers(r.url)} == {a: 2, b: 2}
    rewrite([a, {"url": b, "draining": True}])
    _wait_until(lambda: any(w["draining"] for w in _workers(r.url)))
    for _ in range(2):
        complete(r.url, stream=True)
    assert {w["url"]: w["requests"] for w in _workers(r.url)} == {a: 4, b: 2}
    rewrite([b])
    _wait_until(lambda: [w["url"] for w in _workers(r.url)] == [b])
    path.write_text("[broken")  # a bad edit keeps the workers
    time.sleep(0.5)
    assert [w["url"] for w in _workers(r.url)] == [b]


def _wait_until(cond, timeout_s: float = 20) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.05)
