"""Greedy outputs through HTTP at 16 concurrent equal the offline ``LLM``'s for the same
prompts."""

from __future__ import annotations

import concurrent.futures as cf

import httpx

from kvserve.engine.llm import LLM
from kvserve.engine.sampling_params import SamplingParams
from tests.server.conftest import Server

TOPICS = ["rivers", "bread", "trains", "owls", "glass", "maps", "tea", "bridges", "snow",
          "clocks", "bees", "ships", "paper", "salt", "moons", "violins"]  # fmt: skip


def test_http_greedy_equals_offline(server: Server) -> None:
    prompts = [f"Write one sentence about {t}:" for t in TOPICS]
    llm = LLM()
    offline = [o.text for o in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16))]
    del llm

    def post(prompt: str) -> str:
        body = {"prompt": prompt, "max_tokens": 16, "temperature": 0}
        resp = httpx.post(server.url + "/v1/completions", json=body, timeout=300)
        return resp.json()["choices"][0]["text"]

    with cf.ThreadPoolExecutor(16) as pool:
        online = list(pool.map(post, prompts))
    assert online == offline
