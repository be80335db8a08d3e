"""A disk cache of tokenizers converted from GGUF files.

Building a transformers tokenizer from a GGUF's vocabulary parses the whole file twice (gguf's
reader, then transformers' converter) and costs 10-20 s of CPU in every process that serves,
generates or benchmarks; the converted files, with the chat template and EOS ids kvserve reads
from the GGUF, load in well under a second. An entry is keyed by the GGUF's path, size and
mtime and by the transformers and tokenizers versions that converted it, and appears whole or
not at all (it is written to a temporary folder, then renamed). Where: ``file_cache.py``."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from kvserve.loader.file_cache import entry_path

log = logging.getLogger("kvserve.loader")
_META = "kvserve_gguf_tokenizer.json"
_FORMAT = 1  # bump when what an entry holds changes


def entry_dir(gguf_path: str) -> Path | None:
    """Where the converted tokenizer of this file version lives; None when caching is off."""
    import tokenizers
    import transformers

    versions = f"{transformers.__version__}\0{tokenizers.__version__}\0{_FORMAT}"
    return entry_path("gguf-tokenizers", gguf_path, versions)


def read_entry(entry: Path | None) -> tuple[Any, str | None, list[int]] | None:
    """(hf tokenizer, chat template, EOS ids) from the cache, or None when absent or unreadable
    (an unreadable entry is removed, so that the caller's conversion writes it again)."""
    if entry is None or not (entry / _META).is_file():
        return None
    from transformers import AutoTokenizer

    try:
        meta = json.loads((entry / _META).read_text())
        hf = AutoTokenizer.from_pretrained(str(entry), local_files_only=True)
        return hf, meta["chat_template"], [int(i) for i in meta["eos_token_ids"]]
    except Exception as exc:  # a damaged entry is a cache miss, never a failed start
        log.warning("tokenizer cache entry %s is unreadable (%s); converting again", entry, exc)
        shutil.rmtree(entry, ignore_errors=True)
        return None


def write_entry(entry: Path | None, hf: Any, chat_template: str | None, eos: list[int]) -> None:
    """Store a conversion; best effort: a read-only or full disk only costs the next start."""
    if entry is None:
        return
    tmp: str | None = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=entry.parent, prefix=".partial-")
        hf.save_pretrained(tmp)
        meta = {"chat_template": chat_template, "eos_token_ids": list(eos)}
        Path(tmp, _META).write_text(json.dumps(meta))
        os.rename(tmp, entry)  # fails when another process stored the same entry first
        tmp = None
    except Exception as exc:  # a disk problem or a save_pretrained failure: never a failed load
        log.debug("tokenizer cache entry %s not written: %s", entry, exc)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
