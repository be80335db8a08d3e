"""A pytest plugin for ``make test``'s run of the GPU kernel tests in Triton's interpreter:
``--cases-per-test N`` keeps at most N cases of each parametrized test, its first, its last
and evenly spaced ones between. The interpreter runs a kernel's Python program by program on
the CPU, and the cases of one test walk the same indexing, masks and splits at other sizes; the
GPU run (no plugin) keeps them all. Loaded with ``-p tests.interpreted_cases``."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cases-per-test",
        type=int,
        default=0,
        help="keep at most this many cases of each parametrized test (0: all)",
    )


def spread_picks(count: int, limit: int) -> list[int]:
    """Indices of at most ``limit`` of ``count`` cases: the first, the last, evenly between."""
    if count <= limit:
        return list(range(count))
    if limit == 1:
        return [0]
    return sorted({round(i * (count - 1) / (limit - 1)) for i in range(limit)})


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected theirs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    limit = config.getoption("--cases-per-test")
    if limit <= 0:
        return
    by_test: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_test.setdefault(item.nodeid.split("[")[0], []).append(item)
    kept = {id(cases[i]) for cases in by_test.values() for i in spread_picks(len(cases), limit)}
    config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept])
    items[:] = [item for item in items if id(item) in kept]
