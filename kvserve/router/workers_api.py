"""`/workers`: GET lists them; POST {"url", "api_key"?, "role"?, "draining"?} adds one (or
updates it, e.g. to drain it); DELETE /workers?url=... removes one. Workers added here are
not touched by the worker file."""

from __future__ import annotations

import json

from aiohttp import web

from kvserve.errors import ConfigError
from kvserve.router.errors import error_response
from kvserve.router.state import STATE, RouterState
from kvserve.router.worker import normalize_url
from kvserve.router.worker_file import parse_worker_text


def _listing(state: RouterState) -> dict[str, object]:
    workers = [w.describe() for w in state.registry.workers.values()]
    return {"workers": workers, "total": len(workers),
            "healthy": sum(1 for w in state.registry.workers.values() if w.routable)}  # fmt: skip


async def list_workers(request: web.Request) -> web.Response:
    return web.json_response(_listing(request.app[STATE]))


async def add_worker(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        body = json.loads(await request.read())
        spec = parse_worker_text(json.dumps([body]), ".json")[0]
    except ValueError as exc:  # ConfigError and bad JSON alike
        return error_response(400, str(exc).splitlines()[0] or "invalid worker")
    existed = spec.url in state.registry.workers
    state.registry.add(spec, "api")
    status = 200 if existed else 201
    return web.json_response(state.registry.workers[spec.url].describe(), status=status)


async def remove_worker(request: web.Request) -> web.Response:
    state = request.app[STATE]
    raw = request.query.get("url")
    if not raw:
        return error_response(400, "give the worker as ?url=http://host:port", "url")
    try:
        url = normalize_url(raw)
    except ConfigError as exc:
        return error_response(400, str(exc), "url")
    worker = state.registry.remove(url)
    if worker is None:
        return error_response(404, f"no worker {url}", "url")
    return web.json_response({"removed": url, "in_flight": worker.outstanding})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/workers", list_workers)
    app.router.add_post("/workers", add_worker)
    app.router.add_delete("/workers", remove_worker)
