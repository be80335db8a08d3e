"""The greedy pick in two passes (``sampler.row_argmax``, what a GPU decode step of a few rows
runs) against ``torch.argmax``: the first index of a row's maximum, ties and NaN included."""

from __future__ import annotations

import pytest
import torch

from kvserve.layers.sampler import row_argmax


@pytest.mark.parametrize("vocab", [128256, 151936, 49152])
def test_two_passes_pick_what_argmax_picks(vocab: int) -> None:
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(6, vocab, generator=g)
    logits[1, [17, vocab // 2, vocab - 1]] = 50.0  # ties across pieces: the first wins
    logits[2, 300:310] = 50.0  # ties inside a piece
    logits[3] = 0.0  # a row of ties
    logits[4, [900, 5]] = float("nan")  # NaN is the maximum, the first NaN its index
    logits[5] = float("-inf")
    picked = row_argmax(logits, split=True)
    assert picked.tolist() == logits.argmax(dim=-1).tolist()
    assert picked.tolist()[1:5] == [17, 300, 0, 5]


def test_a_vocabulary_without_enough_pieces_takes_one_pass() -> None:
    logits = torch.randn(2, 1009)  # prime: no even split
    assert row_argmax(logits, split=True).tolist() == logits.argmax(dim=-1).tolist()
