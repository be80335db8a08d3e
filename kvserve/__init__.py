"""kvserve: a KV-cache-centric LLM serving system."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "__version__"]

if TYPE_CHECKING:
    from kvserve.engine.core.sampling_params import SamplingParams
    from kvserve.engine.llm import LLM


def __getattr__(name: str) -> Any:
    # Lazy: `import kvserve` (e.g. for the CLI or preflight) must not pay for torch.
    if name == "LLM":
        from kvserve.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from kvserve.engine.core.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(name)
