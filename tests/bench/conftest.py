from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvserve.bench import tokens
from kvserve.bench.load_sink import running_sink


@pytest.fixture(scope="session")
def bundled_tok() -> tokens.Tokenizer:
    return tokens.load("bundled")


@pytest.fixture(scope="session")
def sink_url() -> Iterator[str]:
    """A real load sink subprocess acting as an ideal prefix cache."""
    with running_sink("--prefix-cache") as url:
        yield url
