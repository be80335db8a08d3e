"""Sampling defaults a checkpoint ships in ``generation_config.json``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvserve.loader.files import read_json_object


@dataclass(frozen=True)
class GenerationDefaults:
    """None means the checkpoint sets no default; the request's or the engine's value applies."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    eos_token_ids: tuple[int, ...] = ()


def eos_ids_of(value: int | list[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    return (int(value),) if isinstance(value, int) else tuple(int(i) for i in value)


def read_generation_defaults(directory: Path) -> GenerationDefaults:
    path = directory / "generation_config.json"
    if not path.is_file():
        return GenerationDefaults()
    data = read_json_object(path)

    def number(key: str, kind: type) -> float | int | None:
        value = data.get(key)
        return None if value is None else kind(value)

    return GenerationDefaults(
        temperature=number("temperature", float),
        top_p=number("top_p", float),
        top_k=number("top_k", int),
        repetition_penalty=number("repetition_penalty", float),
        eos_token_ids=eos_ids_of(data.get("eos_token_id")),
    )
