"""How many more tokens a running request is expected to generate, for admission.

A request admitted with room for its known tokens only will ask for a page every page_size
decode steps; when the pool runs dry the newest request is preempted and its KV computed again.
Admission therefore keeps room for each running request's expected future output:

    expected = min(tokens it may still generate, FUTURE_CLIP) * ratio

The ratio starts at ``init`` (0.7 x ``schedule_conservativeness``), falls linearly to
``init x FLOOR_SHARE`` over ``DECAY_STEPS`` decode steps while nothing is preempted (most
requests stop well before max_tokens), and goes back to ``init`` on a preemption. This is
SGLang's ``new_token_ratio`` rule, with its defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvserve.engine.core.request import Request

INIT_RATIO = 0.7
FLOOR_SHARE = 0.14  # the ratio's floor, as a share of its start
DECAY_STEPS = 600  # decode steps from the start to the floor
# A request with max_tokens unset may generate up to the context length; no more than this
# many of those tokens are counted, or one such request would hold back a whole pool.
FUTURE_CLIP = 4096


@dataclass
class FutureTokens:
    init: float
    ratio: float

    @classmethod
    def for_conservativeness(cls, conservativeness: float) -> FutureTokens:
        """``conservativeness`` 0 counts no future tokens (admission on known tokens alone);
        1 is the default; above 1/INIT_RATIO every request keeps room for all of it."""
        init = min(1.0, INIT_RATIO * conservativeness)
        return cls(init, init)

    @property
    def floor(self) -> float:
        return self.init * FLOOR_SHARE

    def expected(self, req: Request) -> int:
        """Tokens ``req`` is expected to add beyond its known ones (pending ones included)."""
        left = req.max_tokens - req.num_output_tokens - req.num_pending
        return math.ceil(min(max(left, 0), FUTURE_CLIP) * self.ratio)

    def after_decode_step(self) -> None:
        self.ratio = max(self.floor, self.ratio - (self.init - self.floor) / DECAY_STEPS)

    def after_preemption(self) -> None:
        self.ratio = self.init
