"""`--worker-file`: the workers listed in a JSON, YAML or text file that may change while the
router runs (add, drain or remove a worker without a restart).

JSON / YAML: a list (or {"workers": [...]}) of URLs or objects
    {"url": "http://h:8000", "api_key": "...", "role": "regular|prefill|decode", "draining": true}
Text: one worker a line, `URL [api_key=KEY] [role=ROLE] [draining]`; `#` starts a comment.

A file that does not parse leaves the current workers as they are (logged), never a crash."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

import yaml

from kvserve.errors import ConfigError
from kvserve.router.registry import WorkerRegistry
from kvserve.router.worker import WorkerSpec, make_spec

log = logging.getLogger("kvserve.router")


def _from_object(entry: Any) -> WorkerSpec:
    if isinstance(entry, str):
        return make_spec(entry)
    if not isinstance(entry, dict) or not isinstance(entry.get("url"), str):
        raise ConfigError(f"worker entry {entry!r} needs a string 'url'")
    unknown = set(entry) - {"url", "api_key", "role", "draining"}
    if unknown:
        raise ConfigError(f"worker entry has unknown keys: {', '.join(sorted(unknown))}")
    return make_spec(entry["url"], entry.get("api_key"), entry.get("role", "regular"),
                     bool(entry.get("draining", False)))  # fmt: skip


def _from_line(line: str) -> WorkerSpec:
    url, *rest = line.split()
    fields: dict[str, Any] = {}
    for token in rest:
        key, eq, value = token.partition("=")
        if token == "draining":
            fields["draining"] = True
        elif eq and key in ("api_key", "role"):
            fields[key] = value
        else:
            raise ConfigError(f"worker line {line!r}: unknown field {token!r}")
    return make_spec(url, **fields)


def parse_worker_text(text: str, suffix: str) -> list[WorkerSpec]:
    if suffix in (".json", ".yaml", ".yml"):
        try:
            data = json.loads(text) if suffix == ".json" else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as exc:
            raise ConfigError(f"worker file does not parse: {exc}".splitlines()[0]) from None
        if isinstance(data, dict) and "workers" in data:
            data = data["workers"]
        if data is None:
            data = []
        if not isinstance(data, list):
            raise ConfigError("worker file must hold a list of workers (or {'workers': [...]})")
        specs = [_from_object(entry) for entry in data]
    else:
        lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
        specs = [_from_line(line) for line in lines if line]
    urls = [spec.url for spec in specs]
    if len(set(urls)) != len(urls):
        raise ConfigError("worker file lists a worker twice")
    return specs


def read_worker_file(path: str | Path) -> list[WorkerSpec]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read worker file {path}: {exc.strerror}") from None
    return parse_worker_text(text, path.suffix.lower())


class WorkerFileWatcher:
    """Polls the file's mtime/size/inode; on a change, re-reads it and syncs the registry."""

    def __init__(self, path: str, registry: WorkerRegistry, poll_s: float) -> None:
        self.path, self.registry, self.poll_s = path, registry, poll_s
        self.stamp: tuple[int, int, int] | None = None

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def load(self) -> None:
        """First read at start: a bad file is a startup error (ConfigError)."""
        self.stamp = self._stamp()
        self.registry.sync(read_worker_file(self.path), "file")

    def poll_once(self) -> bool:
        stamp = self._stamp()
        if stamp == self.stamp or stamp is None:
            return False
        self.stamp = stamp
        try:
            specs = read_worker_file(self.path)
        except ConfigError as exc:
            log.warning("worker file %s ignored, workers unchanged: %s", self.path, exc)
            return False
        self.registry.sync(specs, "file")
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            self.poll_once()
