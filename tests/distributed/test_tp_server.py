"""Tensor parallelism through real ``kvserve serve`` processes on CPU: two "nodes" on one host
(node 1 runs only its rank) answer like the offline engine at TP=1; a killed rank turns
/health 503, the server exits 1 and no process of it is left."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx

from kvserve import LLM, SamplingParams
from kvserve.server.launch import free_port, launch_server, start_server

PROMPT = "The capital of France is"


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def _tree(pid: int) -> list[int]:
    out = [pid]
    for child in _children(pid):
        out += _tree(child)
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pids: list[int], timeout_s: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _worker_ranks(engine_pid: int) -> list[int]:
    """The engine's spawned rank processes (not multiprocessing's resource tracker)."""
    ranks = []
    for pid in _children(engine_pid):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"--multiprocessing-fork" in cmdline:
            ranks.append(pid)
    return ranks


def _complete(url: str, max_tokens: int = 8) -> str:
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    resp = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["text"]


def test_two_nodes_on_one_host_match_tp1(tiny_model_dir) -> None:
    model = str(tiny_model_dir("LlamaForCausalLM"))
    flags = ["--model", model, "--device", "cpu", "--dtype", "float32", "--tp", "2",
             "--nnodes", "2", "--dist-init-addr", f"127.0.0.1:{free_port()}",
             "--max-total-tokens", "1024"]  # fmt: skip
    node1 = launch_server(*flags, "--node-rank", "1")
    try:
        node0 = start_server(*flags, "--node-rank", "0")
    except BaseException:
        node1.stop(0)
        raise
    try:
        text = _complete(node0.url)
        assert node1.proc.poll() is None  # node 1 serves no HTTP: it only runs rank 1
    finally:
        code0 = node0.stop()
    assert code0 == 0
    assert node1.proc.wait(30) == 0  # rank 0 told rank 1 to stop
    llm = LLM(model, device="cpu", dtype="float32", max_total_tokens=1024)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    assert llm.generate([PROMPT], params)[0].text == text


def test_a_killed_rank_fails_the_server_and_leaves_nothing(tiny_model_dir) -> None:
    model = str(tiny_model_dir("LlamaForCausalLM"))
    server = start_server("--model", model, "--device", "cpu", "--tp", "2",
                          "--max-total-tokens", "1024")  # fmt: skip
    try:
        _complete(server.url, 2)
        everything = _tree(server.proc.pid)
        (rank1,) = _worker_ranks(server.engine_pid())
        os.kill(rank1, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while httpx.get(server.url + "/health", timeout=5).status_code != 503:
            assert time.monotonic() < deadline, "/health stayed 200 after rank 1 died"
            time.sleep(0.1)
        assert server.proc.wait(60) == 1
    finally:
        server.stop(0)
    assert _wait_gone(everything) == []
