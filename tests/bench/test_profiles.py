from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import pytest

from kvserve.bench.ideal import ideal_hit_rate
from kvserve.bench.phase import prompt_ids
from kvserve.bench.profiles import WorkloadConfig, make_units
from kvserve.bench.profiles.mixed import MixedLengths, system_len
from kvserve.bench.profiles.trace import hash_ideal_hit_rate, read_trace
from kvserve.errors import ConfigError


def _take(cfg: WorkloadConfig, tok, n: int) -> list:
    return list(itertools.islice(make_units(cfg, tok), n))


def _sent(tok, unit, endpoint: str = "completions") -> list[int]:
    return prompt_ids(tok, endpoint, unit, [], unit.turns[0].user)


def test_random_lengths_within_tolerance_and_no_sharing(bundled_tok) -> None:
    cfg = WorkloadConfig("random", seed=1, input_len=300, output_len=20, range_ratio=0.5)
    units = _take(cfg, bundled_tok, 40)
    for u in units:
        asked = len(u.ids)
        assert 150 <= asked <= 450
        assert abs(len(bundled_tok.encode(u.turns[0].user)) - asked) <= 3
        assert 10 <= u.turns[0].max_tokens <= 30
    assert ideal_hit_rate([_sent(bundled_tok, u) for u in units]) < 0.01


def test_same_seed_same_stream(bundled_tok) -> None:
    cfg = WorkloadConfig("mixed", seed=7)
    a, b = _take(cfg, bundled_tok, 20), _take(cfg, bundled_tok, 20)
    assert [u.turns for u in a] == [u.turns for u in b]
    c = _take(WorkloadConfig("mixed", seed=8), bundled_tok, 20)
    assert [u.turns for u in a] != [u.turns for u in c]


def test_mixed_class_shares_and_system_share(bundled_tok) -> None:
    lengths = MixedLengths(chat_turns=3, chat_user_len=40, chat_output_len=30, qa_len=60,
                           doc_len=400, doc_question_len=20)  # fmt: skip
    units = _take(WorkloadConfig("mixed", seed=3, mixed=lengths), bundled_tok, 1500)
    requests = Counter()
    for u in units:
        requests[u.cls] += len(u.turns)
    total = sum(requests.values())
    assert requests["chat"] / total == pytest.approx(0.45, abs=0.04)
    assert requests["qa"] / total == pytest.approx(0.30, abs=0.04)
    assert requests["doc"] / total == pytest.approx(0.25, abs=0.04)
    # system share over the first 300 units, chat answers standing in at their forced length
    system = len(bundled_tok.encode(units[0].system))
    assert system == pytest.approx(system_len(lengths, 0.7), abs=3)
    sys_tokens = all_tokens = 0
    for u in units[:300]:
        history = 0
        for turn in u.turns:
            history += len(bundled_tok.encode(turn.user))
            sys_tokens += system
            all_tokens += system + history
            history += turn.max_tokens
    assert sys_tokens / all_tokens == pytest.approx(0.7, abs=0.04)


def test_shared_prefix_ideal_equals_known_value(bundled_tok) -> None:
    g, p, q = 4, 200, 5
    cfg = WorkloadConfig("shared-prefix", seed=2, groups=g, prefix_len=p, questions=q,
                         question_len=30, output_len=8)  # fmt: skip
    units = _take(cfg, bundled_tok, g * q)
    assert {u.cls for u in units} == {f"group{i}" for i in range(g)}
    sent = [_sent(bundled_tok, u) for u in units]
    shared = {u.cls: len(bundled_tok.encode(u.system + "\n\n")) for u in units}
    known = (q - 1) * sum(shared.values()) / sum(map(len, sent))
    assert ideal_hit_rate(sent) == pytest.approx(known, abs=0.01)
    # through the chat template the system message is shared the same way (plus template tokens)
    assert ideal_hit_rate([_sent(bundled_tok, u, "chat") for u in units]) == pytest.approx(
        known, abs=0.03
    )


def test_trace_reproduces_hash_prefix_structure(bundled_tok, tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]},
        {"timestamp": 500, "input_length": 1500, "output_length": 5, "hash_ids": [1, 2, 4]},
        {"timestamp": 900, "input_length": 600, "output_length": 5, "hash_ids": [7, 8]},
        {"timestamp": 1000, "input_length": 1024, "output_length": 5, "hash_ids": [1, 2]},
        {"timestamp": 2000, "input_length": 700, "output_length": 5, "hash_ids": [7]},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    entries = read_trace(path)
    units = _take(WorkloadConfig("trace", trace=str(path), time_scale=0.5), bundled_tok, 10)
    assert [u.at for u in units] == [0.0, 0.25, 0.45, 0.5, 1.0]
    assert [len(u.ids) for u in units] == [r["input_length"] for r in rows]
    tokens_ideal = ideal_hit_rate([bundled_tok.encode(u.turns[0].user) for u in units])
    assert tokens_ideal == pytest.approx(hash_ideal_hit_rate(entries), abs=0.01)


@pytest.mark.parametrize(
    ("line", "message"),
    [("not json", "not a JSON line"), ('{"input_length": 5}', "missing field"),
     ('{"input_length": "x", "output_length": 1}', "bad field"), ("[1]", "JSON object")],
)  # fmt: skip
def test_malformed_trace_lines(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n' + line + "\n")
    with pytest.raises(ConfigError, match=message) as err:
        read_trace(path)
    assert "bad.jsonl:2" in str(err.value)


def test_missing_files_and_bad_profile_flags(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        read_trace(tmp_path / "nope.jsonl")
    with pytest.raises(ConfigError, match="needs --trace"):
        WorkloadConfig("trace")
    with pytest.raises(ConfigError, match="unknown"):
        WorkloadConfig("nonsense")


def test_dataset_profile(bundled_tok, tmp_path: Path) -> None:
    data = [{"conversations": [{"from": "human", "value": "Tell me about the old mill and the "
                                "river near the village."},
                               {"from": "gpt", "value": "The old mill stood by the river " * 5}]},
            {"conversations": [{"from": "human", "value": "hi"}]}]  # fmt: skip
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    units = _take(WorkloadConfig("dataset", dataset=str(path)), bundled_tok, 3)
    assert len(units) == 3 and units[0].turns[0].max_tokens > 20
    path.write_text("{broken")
    with pytest.raises(ConfigError, match="not JSON"):
        _take(WorkloadConfig("dataset", dataset=str(path)), bundled_tok, 1)
