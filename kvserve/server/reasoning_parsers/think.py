"""``<think>reasoning</think>content``: reasoning goes to ``reasoning_content``.

Output that opens with ``<think>`` (or follows a prompt that already ends with it, as some
chat templates do) is reasoning until ``</think>``; output that does not is all content. Fed
incrementally, so streaming and non-streaming split the text identically."""

from __future__ import annotations

from kvserve.server.text_tags import partial_tag_len

OPEN, CLOSE = "<think>", "</think>"


class ThinkReasoningParser:
    def __init__(self, prompt_text: str = "") -> None:
        self.mode = "reasoning" if prompt_text.rstrip().endswith(OPEN) else "start"
        self.buffer = ""

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, content) that is safe to emit now."""
        self.buffer += text
        reasoning = content = ""
        while self.buffer:
            if self.mode == "start":
                head = self.buffer.lstrip()
                if head.startswith(OPEN):
                    self.mode, self.buffer = "reasoning", head[len(OPEN) :]
                elif OPEN.startswith(head):
                    break  # not decided yet
                else:
                    self.mode = "content"
            elif self.mode == "reasoning":
                at = self.buffer.find(CLOSE)
                if at >= 0:
                    reasoning += self.buffer[:at]
                    self.mode, self.buffer = "after", self.buffer[at + len(CLOSE) :]
                    continue
                keep = partial_tag_len(self.buffer, CLOSE)
                reasoning += self.buffer[: len(self.buffer) - keep]
                self.buffer = self.buffer[len(self.buffer) - keep :]
                break
            elif self.mode == "after":  # drop the whitespace between </think> and the answer
                self.buffer = self.buffer.lstrip()
                if self.buffer:
                    self.mode = "content"
            else:
                content, self.buffer = content + self.buffer, ""
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """Flush what was held back at the end of the output."""
        rest, self.buffer = self.buffer, ""
        if self.mode == "reasoning":
            return rest, ""
        return "", rest if self.mode in ("start", "content") else ""
