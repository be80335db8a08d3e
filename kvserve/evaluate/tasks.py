"""One evaluation task: what every target is asked, and how its reply is checked."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, eq=False)
class Task:
    id: str
    type: str
    # Exactly one of the two. ``messages`` go to /v1/chat/completions (the chat template is the
    # server's), ``prompt`` to /v1/completions (raw text, no template).
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    answer: Any = None
    scorer: str | None = None  # None: no checkable answer, compared by ROUGE-L only
    lang: str | None = None

    @property
    def endpoint(self) -> str:
        return "chat" if self.messages is not None else "completions"

    def request(self) -> dict[str, Any]:
        """What is sent (besides model and sampling): the same for every target."""
        if self.messages is not None:
            return {"messages": self.messages}
        return {"prompt": self.prompt}

    def key(self, max_tokens: int) -> str:
        """Cache key: the request and the token limit, not the id (reordering keeps the cache)."""
        blob = json.dumps([self.endpoint, self.request(), max_tokens], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:24]

    def user_text(self) -> str:
        """The prompt as shown in reports (the last user message for chat)."""
        if self.messages is None:
            return self.prompt or ""
        users = [m.get("content") for m in self.messages if m.get("role") == "user"]
        return str(users[-1] if users else self.messages[-1].get("content"))


def user_message(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]
