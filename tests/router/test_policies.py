"""Policies on real `Worker` objects (no HTTP): who gets each request."""

from __future__ import annotations

from kvserve.router.config import BreakerConfig, CacheAwareConfig
from kvserve.router.policies.base import RouteRequest, prefix_key
from kvserve.router.policies.cache_aware import CacheAwarePolicy
from kvserve.router.policies.factory import make_pair_policy, make_policy
from kvserve.router.policies.pd_pairing import select_pd_pair
from kvserve.router.policies.prefix_tree import PrefixTree, common_prefix_len
from kvserve.router.worker import Worker, make_spec


def workers(n: int, role: str = "regular", port0: int = 9000) -> list[Worker]:
    return [Worker.create(make_spec(f"127.0.0.1:{port0 + i}", role=role), BreakerConfig(), "cli")
            for i in range(n)]  # fmt: skip


def test_round_robin_cycles() -> None:
    ws, policy = workers(3), make_policy("round_robin")
    picked = [policy.select(ws, RouteRequest()).url for _ in range(6)]
    assert picked == [w.url for w in ws] * 2


def test_least_outstanding_prefers_idle_and_spreads_ties() -> None:
    ws, policy = workers(3), make_policy("least_outstanding")
    ws[0].outstanding, ws[1].outstanding, ws[2].outstanding = 5, 0, 7
    assert policy.select(ws, RouteRequest()) is ws[1]
    for w in ws:
        w.outstanding = 0
    assert {policy.select(ws, RouteRequest()).url for _ in range(3)} == {w.url for w in ws}


def test_cache_aware_keeps_a_prefix_on_one_worker() -> None:
    ws, policy = workers(3), make_policy("cache_aware")
    system = "You are a helpful assistant. " * 20
    first = policy.select(ws, RouteRequest(system + "question one"))
    for i in range(5):
        assert policy.select(ws, RouteRequest(system + f"another question {i}")) is first


def test_cache_aware_spreads_unrelated_prompts_to_the_emptiest_tree() -> None:
    ws, policy = workers(2), make_policy("cache_aware")
    a = policy.select(ws, RouteRequest("alpha " * 50))
    b = policy.select(ws, RouteRequest("omega " * 50))
    assert a is not b


def test_cache_aware_balances_when_load_is_skewed() -> None:
    ws = workers(2)
    policy = CacheAwarePolicy(CacheAwareConfig(balance_abs_threshold=4, balance_rel_threshold=1.5))
    prompt = "shared prefix " * 30
    home = policy.select(ws, RouteRequest(prompt))
    other = ws[1] if home is ws[0] else ws[0]
    home.outstanding = 10  # imbalanced: 10 - 0 > 4 and 10 > 1.5 x 0
    assert policy.select(ws, RouteRequest(prompt)) is other


def test_cache_aware_evicts_to_budget_and_forgets_removed_workers() -> None:
    ws = workers(2)
    policy = CacheAwarePolicy(CacheAwareConfig(max_tree_size=100))
    for i in range(20):
        policy.select(ws, RouteRequest(f"{i:03d} " + "x" * 40))
    policy.evict([ws[0].url])
    assert list(policy.trees) == [ws[0].url] and policy.trees[ws[0].url].size <= 100


def test_prefix_tree_match_insert_split_evict() -> None:
    tree = PrefixTree()
    tree.insert("hello world", 1.0)
    tree.insert("hello there", 2.0)  # splits the edge at "hello "
    assert tree.match_len("hello world!", 3.0) == 11
    assert tree.match_len("hello thumb", 3.0) == 8
    assert tree.match_len("goodbye", 3.0) == 0
    assert tree.size == len("hello world") + len("there")
    tree.evict(len("hello world"))  # drops the least recently used leaf ("there")
    assert tree.match_len("hello there", 4.0) == len("hello t") - 1
    tokens = PrefixTree()
    tokens.insert((1, 2, 3, 4), 1.0)
    assert tokens.match_len((1, 2, 9), 2.0) == 2


def test_common_prefix_len() -> None:
    assert common_prefix_len("abcdef", "abcxyz") == 3
    assert common_prefix_len("abc", "abc") == 3
    assert common_prefix_len("", "abc") == 0
    assert common_prefix_len((1, 2), (1, 2, 3)) == 2
    # from an offset into the key (the tree walks the key without slicing it)
    assert common_prefix_len("abq", "xxabd", 2) == 2
    assert common_prefix_len("abcd", "xxab", 2) == 2
    assert common_prefix_len((5, 6, 7), (0, 5, 6, 9), 1) == 2
    long = "s" * 5000 + "a" * 3000
    assert common_prefix_len(long, "p" + "s" * 5000 + "a" * 2999 + "b", 1) == 7999


def test_prefix_key_from_prompts_tokens_and_messages() -> None:
    assert prefix_key({"prompt": "hi"}) == "hi"
    assert prefix_key({"prompt": ["a", "b"]}) == "a"
    assert prefix_key({"prompt": [1, 2, 3]}) == (1, 2, 3)
    assert prefix_key({"prompt": [[4, 5]]}) == (4, 5)
    assert prefix_key({"prompt": [1, "x", 2.5, 2**70, 3]}) == (1, 2**70, 3)
    chat = prefix_key({"messages": [{"role": "system", "content": "S"},
                                    {"role": "user", "content": "U"}]})  # fmt: skip
    assert chat == "system: S\nuser: U\n"
    assert prefix_key({"prompt": 7}) is None and prefix_key({}) is None


def test_pd_pairing_round_robins_prefill_and_decode_independently() -> None:
    prefill, decode = workers(2, "prefill", 9100), workers(3, "decode", 9200)
    policy = make_pair_policy()
    pairs = [policy.select_pair(prefill, decode, RouteRequest()) for _ in range(6)]
    assert [p.url for p, _ in pairs] == [w.url for w in prefill] * 3
    assert [d.url for _, d in pairs] == [w.url for w in decode] * 2
    assert all(p.spec.role == "prefill" and d.spec.role == "decode" for p, d in pairs)


def test_pd_pairing_with_a_cache_aware_prefill_side() -> None:
    prefill, decode = workers(2, "prefill", 9100), workers(2, "decode", 9200)
    policy = make_pair_policy("cache_aware", "round_robin")
    assert policy.needs_key
    prompt = "a long shared system prompt " * 10
    homes = {policy.select_pair(prefill, decode, RouteRequest(prompt + str(i)))[0].url
             for i in range(4)}  # fmt: skip
    assert len(homes) == 1


def test_pd_pair_only_from_routable_workers_of_each_role() -> None:
    prefill, decode = workers(2, "prefill", 9100), workers(2, "decode", 9200)
    regular = workers(1, "regular", 9300)
    everyone = prefill + decode + regular
    for w in everyone:
        w.healthy = True
    prefill[0].healthy = False  # ejected by health checks
    for _ in range(5):
        decode[1].breaker.record_failure()  # breaker open
    policy = make_pair_policy()
    pairs = {
        (p.url, d.url)
        for p, d in (select_pd_pair(everyone, policy, RouteRequest()) for _ in range(4))
    }  # type: ignore[misc]
    assert pairs == {(prefill[1].url, decode[0].url)}
    decode[0].healthy = False
    assert select_pd_pair(everyone, policy, RouteRequest()) is None
