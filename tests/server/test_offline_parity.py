"""Greedy outputs through HTTP at 16 concurrent equal the offline ``LLM``'s for the same
prompts, with the engine waiting for each step (the CPU default) and with overlap scheduling
forced on (the GPU default), where streams and disconnects meet a step in flight."""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Iterator

import httpx
import pytest

from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.engine.llm import LLM
from tests.server.conftest import Server, metrics, start_server, wait_idle

TOPICS = ["rivers", "bread", "trains", "owls", "glass", "maps", "tea", "bridges", "snow",
          "clocks", "bees", "ships", "paper", "salt", "moons", "violins"]  # fmt: skip


PROMPTS = [f"Write one sentence about {t}:" for t in TOPICS]


@pytest.fixture(scope="module")
def offline_texts() -> list[str]:
    llm = LLM()
    return [o.text for o in llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16))]


@pytest.fixture(scope="module")
def overlap_server() -> Iterator[Server]:
    s = start_server("--enable-overlap-schedule")
    yield s
    assert s.stop() == 0


def _greedy_over_http(server: Server) -> list[str]:
    def post(prompt: str) -> str:
        body = {"prompt": prompt, "max_tokens": 16, "temperature": 0}
        resp = httpx.post(server.url + "/v1/completions", json=body, timeout=300)
        return resp.json()["choices"][0]["text"]

    with cf.ThreadPoolExecutor(16) as pool:
        return list(pool.map(post, PROMPTS))


def test_http_greedy_equals_offline(server: Server, offline_texts: list[str]) -> None:
    assert _greedy_over_http(server) == offline_texts


def test_overlap_scheduling_over_http(overlap_server: Server, offline_texts: list[str]) -> None:
    assert _greedy_over_http(overlap_server) == offline_texts
    before = metrics(overlap_server.url)
    body = {"prompt": PROMPTS[0], "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", overlap_server.url + "/v1/completions", json=body) as resp:
        for i, _ in enumerate(resp.iter_lines()):
            if i == 6:
                break  # disconnect while a step of this request is in flight
    after = wait_idle(overlap_server.url)
    generated = after["kvserve:generation_tokens_total"] - before["kvserve:generation_tokens_total"]
    assert 0 < generated < 2000  # aborted, and its pages are back (wait_idle: KV usage 0)
