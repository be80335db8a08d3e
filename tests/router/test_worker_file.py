"""Worker lists from files (JSON, YAML, text), the registry's sync, and the file watcher."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvserve.errors import ConfigError
from kvserve.router.config import BreakerConfig
from kvserve.router.registry import WorkerRegistry
from kvserve.router.worker import make_spec
from kvserve.router.worker_file import WorkerFileWatcher, parse_worker_text, read_worker_file


def test_formats_agree() -> None:
    text = "http://a:1 api_key=k role=prefill  # comment\n\nb:2 draining\n"
    js = '{"workers": [{"url": "http://a:1", "api_key": "k", "role": "prefill"},' \
         ' {"url": "b:2", "draining": true}]}'  # fmt: skip
    yml = "- url: http://a:1\n  api_key: k\n  role: prefill\n- url: b:2\n  draining: true\n"
    expected = [make_spec("http://a:1", "k", "prefill"), make_spec("http://b:2", draining=True)]
    assert parse_worker_text(text, ".txt") == expected
    assert parse_worker_text(js, ".json") == expected
    assert parse_worker_text(yml, ".yaml") == expected


@pytest.mark.parametrize("text,suffix,message", [
    ("ftp://a:1", ".txt", "not http"),
    ("http://a:1/v1", ".txt", "path"),
    ("http://a:99999", ".txt", "(?i)port"),
    ("a:1 colour=red", ".txt", "unknown field"),
    ("a:1\na:1", ".txt", "twice"),
    ('{"workers": 3}', ".json", "list"),
    ('[{"url": "a:1", "rol": "x"}]', ".json", "unknown keys"),
    ('[{"url": "a:1", "role": "boss"}]', ".json", "role"),
    ("[1, 2", ".json", "does not parse"),
])  # fmt: skip
def test_bad_files_say_why(text: str, suffix: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_worker_text(text, suffix)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        read_worker_file(tmp_path / "nope.txt")


def test_sync_adds_updates_and_removes_only_its_own_workers() -> None:
    reg = WorkerRegistry(BreakerConfig())
    reg.add(make_spec("cli:1"), "cli")
    reg.sync([make_spec("a:1"), make_spec("b:2")], "file")
    assert set(reg.workers) == {"http://cli:1", "http://a:1", "http://b:2"}
    reg.sync([make_spec("b:2", draining=True)], "file")
    assert set(reg.workers) == {"http://cli:1", "http://b:2"}
    assert reg.workers["http://b:2"].spec.draining


def test_watcher_follows_changes_and_keeps_workers_on_a_bad_edit(tmp_path: Path) -> None:
    path = tmp_path / "workers.txt"
    path.write_text("a:1\n")
    reg = WorkerRegistry(BreakerConfig())
    watcher = WorkerFileWatcher(str(path), reg, 1.0)
    watcher.load()
    assert list(reg.workers) == ["http://a:1"]
    assert not watcher.poll_once()  # unchanged
    path.write_text("a:1\nb:2\n")
    os.utime(path, ns=(1, 10**18))
    assert watcher.poll_once() and set(reg.workers) == {"http://a:1", "http://b:2"}
    path.write_text("not a url at all ://\n")
    os.utime(path, ns=(1, 2 * 10**18))
    assert not watcher.poll_once() and len(reg) == 2
