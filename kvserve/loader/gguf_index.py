"""A cached index of a GGUF file: the metadata and tensor table that loading reads.

``gguf.GGUFReader`` turns every element of every metadata array into a numpy view, so opening
the bundled 98 MB model took 6 s of CPU on a 2-core machine, in every process that loads it
(almost all of it the vocabulary and merges, which the tokenizer cache already covers). The
index keeps each metadata value (for arrays over ``MAX_ARRAY`` items, only their length) and
each tensor's name, type, dims and offset, as JSON in the cache (``file_cache.py``); a later
open reads that and maps the tensors straight from the file, with the data views
``GGUFReader`` would give (``gguf``'s own type sizes and byte shapes). The first open of a file
version parses it with ``GGUFReader`` as before and writes the entry (atomically; a failed
write only costs the next start)."""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import numpy as np

from kvserve.loader.file_cache import entry_path, write_json
from kvserve.loader.gguf_reader import open_gguf

log = logging.getLogger("kvserve.loader")
MAX_ARRAY = 1024
_FORMAT = 1  # bump when what an entry holds changes
_TYPED = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I8": np.int8,
          "I16": np.int16, "I32": np.int32, "I64": np.int64}  # fmt: skip


class IndexedField:
    """A metadata value, or only the length of a long array (``data`` then supports len())."""

    def __init__(self, entry: dict[str, Any]) -> None:
        self._entry = entry
        self.data = range(entry["length"]) if "length" in entry else entry["value"]

    def contents(self) -> Any:  # noqa: ANN401 - whatever the GGUF holds
        if "value" not in self._entry:
            raise KeyError("a long metadata array: the index keeps only its length")
        return self._entry["value"]


@dataclass(frozen=True)
class IndexedTensor:
    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # ggml order, innermost first
    data: np.ndarray  # a view of the memory-mapped file


class GGUFIndex:
    """``fields`` and ``tensors`` as loading uses them from a ``GGUFReader``."""

    def __init__(self, path: str, fields: dict[str, dict], tensors: list[list]) -> None:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
        from gguf.quants import quant_shape_to_byte_shape

        self.fields = {key: IndexedField(entry) for key, entry in fields.items()}
        mapped = np.memmap(path, dtype=np.uint8, mode="r")
        self.tensors = []
        for name, type_id, dims, offset in tensors:
            kind = GGMLQuantizationType(type_id)
            block, type_size = GGML_QUANT_SIZES[kind]
            n_bytes = int(np.prod(dims)) * type_size // block
            np_dims = tuple(reversed(dims))
            raw = mapped[offset : offset + n_bytes]
            if kind.name in _TYPED:
                data = raw.view(_TYPED[kind.name]).reshape(np_dims)
            else:
                data = raw.reshape(quant_shape_to_byte_shape(np_dims, kind))
            self.tensors.append(IndexedTensor(name, kind, tuple(dims), data))


@functools.lru_cache(maxsize=4)
def open_gguf_index(path: str) -> Any:  # noqa: ANN401 - a GGUFIndex, or a GGUFReader
    """The cached index of ``path``, made (and stored) from a ``GGUFReader`` when absent; the
    reader itself when caching is off. Either has the ``fields`` and ``tensors`` loading reads."""
    entry = entry_path("gguf-index", path, f"{version('gguf')}\0{_FORMAT}")
    if entry is None:
        return open_gguf(path)
    cached = _read(entry)
    if cached is not None:
        try:
            return GGUFIndex(path, *cached)
        except (ValueError, KeyError, TypeError) as exc:  # an entry that does not fit the file
            log.warning("GGUF index %s does not fit %s (%s); parsing it again", entry, path, exc)
    reader = open_gguf(path)
    fields = {key: _field_entry(field) for key, field in reader.fields.items()}
    tensors = [[t.name, int(t.tensor_type), [int(d) for d in t.shape], int(t.data_offset)]
               for t in reader.tensors]  # fmt: skip
    _write(entry, {"format": _FORMAT, "fields": fields, "tensors": tensors})
    return reader


def _field_entry(field: Any) -> dict[str, Any]:  # noqa: ANN401 - a gguf ReaderField
    from gguf.constants import GGUFValueType

    is_array = field.types and field.types[0] == GGUFValueType.ARRAY
    if is_array and len(field.data) > MAX_ARRAY:
        return {"length": len(field.data)}
    value = field.contents()
    if isinstance(value, (np.ndarray, np.generic)):
        value = value.tolist()
    return {"value": value}


def _read(entry: Any) -> tuple[dict, list] | None:  # noqa: ANN401 - a Path
    try:
        payload = json.loads(entry.read_text())
        if payload.get("format") != _FORMAT:
            return None
        return payload["fields"], payload["tensors"]
    except FileNotFoundError:
        return None
    except Exception as exc:  # a damaged entry is a miss, never a failed start
        log.warning("GGUF index %s is unreadable (%s); parsing the file again", entry, exc)
        return None


def _write(entry: Any, payload: dict) -> None:  # noqa: ANN401 - a Path
    try:
        write_json(entry, payload)
    except Exception as exc:  # a read-only or full disk: the next start parses again
        log.debug("GGUF index %s not written: %s", entry, exc)
