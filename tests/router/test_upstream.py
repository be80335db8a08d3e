"""The upstream client's chunked-body parser, fed the way a socket delivers: in arbitrary
pieces, split anywhere."""

from __future__ import annotations

import asyncio

import pytest

from kvserve.router.upstream import _dechunk

EVENTS = [b'data: {"a": 1}\n\n', b'data: {"b": 22}\n\n', b"x" * 300, b"data: [DONE]\n\n"]
WIRE = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in EVENTS) + b"0\r\n\r\n"


def run(pieces: list[bytes], eof: bool = False) -> bytes:
    async def go() -> bytes:
        reader = asyncio.StreamReader()
        for p in pieces:
            reader.feed_data(p)
        if eof:
            reader.feed_eof()
        got = [piece async for piece in _dechunk(reader)]
        assert [last for _, last in got] == [False] * (len(got) - 1) + [True]
        return b"".join(piece for piece, _ in got)

    return asyncio.run(go())


@pytest.mark.parametrize("step", [1, 3, 7, 64, len(WIRE)])
def test_dechunk_any_split(step: int) -> None:
    pieces = [WIRE[i : i + step] for i in range(0, len(WIRE), step)]
    assert run(pieces) == b"".join(EVENTS)


def test_dechunk_truncated_and_garbage_raise() -> None:
    with pytest.raises(asyncio.IncompleteReadError):
        run([WIRE[:40]], eof=True)
    with pytest.raises(ValueError):
        run([b"zz\r\nhello\r\n"], eof=True)
