"""One place that turns a policy name into a policy object."""

from __future__ import annotations

from kvserve.errors import ConfigError
from kvserve.router.config import POLICIES, CacheAwareConfig
from kvserve.router.policies.base import Policy
from kvserve.router.policies.cache_aware import CacheAwarePolicy
from kvserve.router.policies.least_outstanding import LeastOutstandingPolicy
from kvserve.router.policies.pd_pairing import PDPairPolicy
from kvserve.router.policies.random_choice import RandomPolicy
from kvserve.router.policies.round_robin import RoundRobinPolicy


def make_policy(name: str, cache_aware: CacheAwareConfig | None = None) -> Policy:
    if name == "round_robin":
        return RoundRobinPolicy()
    if name == "least_outstanding":
        return LeastOutstandingPolicy()
    if name == "random":
        return RandomPolicy()
    if name == "cache_aware":
        return CacheAwarePolicy(cache_aware or CacheAwareConfig())
    raise ConfigError(f"unknown policy {name!r}; one of {', '.join(POLICIES)}")


def make_pair_policy(prefill: str = "round_robin", decode: str = "round_robin",
                     cache_aware: CacheAwareConfig | None = None) -> PDPairPolicy:  # fmt: skip
    return PDPairPolicy(make_policy(prefill, cache_aware), make_policy(decode, cache_aware))
