"""A real OpenAI-compatible HTTP proxy (FastAPI on uvicorn, in a thread) in front of a real
server. It forwards every request and, for the requests a predicate picks, replaces the
generated text with a wrong answer: the planted regression of the end-to-end test."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from kvserve.server.launch import free_port

WRONG = "I do not know."


def _corrupt(data: dict[str, Any]) -> None:
    for choice in data.get("choices") or []:
        if isinstance(choice.get("message"), dict):
            choice["message"]["content"] = WRONG
        else:
            choice["text"] = WRONG


class CorruptingProxy:
    def __init__(self, upstream: str, pick: Callable[[dict[str, Any]], bool]) -> None:
        self.upstream, self.pick = upstream, pick
        self.requests = self.corrupted = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = FastAPI()
        app.add_api_route("/v1/models", self._models, methods=["GET"])
        app.add_api_route("/v1/{path:path}", self._forward, methods=["POST"])
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    async def _models(self) -> JSONResponse:
        async with httpx.AsyncClient(timeout=30) as http:
            resp = await http.get(self.upstream + "/v1/models")
        return JSONResponse(resp.json(), status_code=resp.status_code)

    async def _forward(self, path: str, request: Request) -> JSONResponse:
        body = await request.json()
        self.requests += 1
        async with httpx.AsyncClient(timeout=600) as http:
            resp = await http.post(f"{self.upstream}/v1/{path}", json=body)
        data = resp.json()
        if resp.status_code == 200 and self.pick(body):
            self.corrupted += 1
            _corrupt(data)
        return JSONResponse(data, status_code=resp.status_code)

    def __enter__(self) -> CorruptingProxy:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            assert time.monotonic() < deadline, "the proxy did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
