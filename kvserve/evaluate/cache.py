"""Per-target output cache: one JSONL file per (target name, target identity) under the cache
directory, one line per finished request, appended and flushed as each finishes. A rerun
(interrupted, or with a new candidate) sends only what is not there yet; failed requests are
not cached, so they are retried."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from kvserve.evaluate.completion import Completion


class OutputCache:
    def __init__(self, directory: Path, name: str, identity: str) -> None:
        digest = hashlib.sha256(identity.encode()).hexdigest()[:10]
        safe = re.sub(r"[^\w.+-]", "_", name)
        self.path = directory / f"{safe}-{digest}.jsonl"
        self.identity = identity
        self._entries: dict[str, Completion] = {}
        self._pad = ""
        if self.path.is_file():
            self._load()

    def _load(self) -> None:
        text = self.path.read_text(encoding="utf-8")
        # A write cut short leaves a line with no newline: the next entry starts a fresh line.
        self._pad = "" if not text or text.endswith("\n") else "\n"
        for line in text.splitlines():
            try:  # a line cut short by an interrupted run is skipped; that task reruns
                obj = json.loads(line)
                self._entries[obj["key"]] = Completion.from_json(obj)
            except (ValueError, KeyError, TypeError):
                continue

    def get(self, key: str) -> Completion | None:
        return self._entries.get(key)

    def put(self, key: str, completion: Completion) -> None:
        if not completion.ok:
            return
        self._entries[key] = completion
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            line = json.dumps({"key": key, **completion.to_json()}, ensure_ascii=False)
            fh.write(self._pad + line + "\n")
        self._pad = ""

    def clear(self) -> None:
        self._entries.clear()
        self._pad = ""
        self.path.unlink(missing_ok=True)
