"""``kvserve demo`` (``make demo``): start a server on the bundled model, load it with the
``mixed`` profile of ``kvserve bench`` (concurrent multi-turn chats sharing a system prompt,
QA and document questions), print the result block and a sample answer, shut down cleanly."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import httpx

from kvserve.errors import ConfigError
from kvserve.server.launch import launch_server

# Short lengths so the run takes about a minute on 2 CPU cores.
_MIXED = ["--chat-turns", "3", "--chat-user-len", "32", "--chat-output-len", "32",
          "--qa-len", "64", "--qa-output-len", "32", "--doc-len", "256",
          "--doc-question-len", "32", "--doc-output-len", "32"]  # fmt: skip
_QUESTION = "In two sentences: why does a KV cache make LLM serving faster?"


def sample_answer(url: str, max_tokens: int) -> str:
    body = {"messages": [{"role": "user", "content": _QUESTION}], "max_tokens": max_tokens,
            "temperature": 0}  # fmt: skip
    resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=300.0)
    resp.raise_for_status()
    return resp.json()["choices"][0]["message"]["content"]


def run_load(url: str, a: argparse.Namespace, out_dir: str) -> int:
    from kvserve.bench import cli as bench_cli

    argv = ["--base-url", url, "--profile", "mixed", "--tokenizer", "bundled",
            "--max-concurrency", str(a.concurrency), "--scrape-metrics", "--out", out_dir,
            *_MIXED]  # fmt: skip
    if a.num_requests:
        argv += ["--num-requests", str(a.num_requests)]
    else:
        argv += ["--duration", a.duration]
    if not sys.stdout.isatty():
        argv.append("--quiet")  # no progress bar in logs
    return bench_cli.main(argv)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvserve demo", description=__doc__)
    p.add_argument("--duration", default="45s", help="load duration (default: 45s)")
    p.add_argument("--num-requests", type=int, help="send this many requests instead")
    p.add_argument("--concurrency", type=int, default=4, help="concurrent sessions (default: 4)")
    p.add_argument("--answer-tokens", type=int, default=80, help="sample answer length")
    p.add_argument("--port", type=int, help="server port (default: a free one)")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("serve_args", nargs="*", help="extra `kvserve serve` flags, after --")
    return p


def main(argv: list[str]) -> int:
    a = parser().parse_args(argv)
    server = launch_server(*a.serve_args, port=a.port)
    url = server.url
    print(f"kvserve demo: starting the server on {url} (bundled model) ...", flush=True)
    try:
        server.wait_healthy(a.startup_timeout)
        print("kvserve demo: server healthy; running the mixed load ...", flush=True)
        run_load(url, a, str(Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")))
        answer = sample_answer(url, a.answer_tokens)
        print(f"\nSample answer to {_QUESTION!r}:\n{answer}\n", flush=True)
    finally:
        code = server.stop()
    if code != 0:
        raise ConfigError(f"the server exited with code {code}")
    print("kvserve demo: server stopped cleanly.")
    return 0
