"""User-facing errors. Each carries a one-line message a user can act on.

They subclass ``ValueError`` so callers of the offline API can catch bad input generically; the
server maps them onto OpenAI-shaped HTTP errors and the CLI prints them as one line.
"""

from __future__ import annotations


class KVServeError(ValueError):
    """Base of every error kvserve raises for bad input or a bad environment."""


class ConfigError(KVServeError):
    """An invalid setting (flag, config value, unsupported combination)."""


class ModelLoadError(KVServeError):
    """A model file is missing, corrupt, or of an unsupported kind."""


class InvalidRequestError(KVServeError):
    """A request the engine cannot serve: empty prompt, too long, bad sampling values, ..."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
