"""CacheManager sessions: ownership by session id, idle TTL, LRU eviction before CacheBudgetExceeded, pins."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from vidloom.core.errors import CacheBudgetExceeded
from vidloom.runtime.cache_manager import CacheManager


@dataclass
class Slab:
    nbytes: int


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _manager(budget: int | None = 100, ttl: float = 60.0) -> tuple[CacheManager, Clock]:
    clock = Clock()
    return CacheManager(budget, session_ttl_s=ttl, clock=clock), clock


def test_a_session_outlives_its_request_and_is_released_by_id():
    manager, _ = _manager()
    handle = manager.put_session("video_a", 40, lambda: Slab(40))
    assert handle.owner == "video_a" and manager.bytes_in_use == 40
    slab = manager.checkout_session("video_a")
    assert slab is not None and slab.nbytes == 40
    manager.checkin_session("video_a")
    assert manager.session_stats()["sessions"] == 1
    assert manager.release_session("video_a") is True and manager.release_session("video_a") is False
    assert manager.bytes_in_use == 0 and manager.checkout_session("video_a") is None


def test_idle_sessions_expire_after_the_ttl_but_not_while_pinned():
    manager, clock = _manager(ttl=10.0)
    manager.put_session("a", 10, lambda: Slab(10))
    manager.put_session("b", 10, lambda: Slab(10))
    assert manager.checkout_session("b") is not None  # pinned: in use by an extension
    clock.now = 9.9
    assert manager.session_ids() == ["a", "b"]
    clock.now = 10.0
    assert manager.session_ids() == ["b"] and manager.bytes_in_use == 10
    manager.checkin_session("b")  # idle from now: expires 10 s later
    clock.now = 19.9
    assert manager.session_ids() == ["b"]
    clock.now = 20.0
    assert manager.expire() == 1
    stats = manager.session_stats()
    assert (stats["sessions"], stats["expirations"], stats["evictions"], manager.bytes_in_use) == (0, 2, 0, 0)


def test_allocation_evicts_least_recently_used_sessions_before_refusing():
    manager, clock = _manager(budget=100)
    for name in ("a", "b", "c"):
        manager.put_session(name, 30, lambda: Slab(30))
        clock.now += 1
    assert manager.checkout_session("a") is not None  # a is now the most recently used
    manager.checkin_session("a")
    manager.allocate("request", 40, lambda: Slab(40))  # needs 30 more than is free: b goes first
    assert manager.session_ids() == ["c", "a"] and manager.bytes_in_use == 100
    assert manager.session_stats()["evictions"] == 1


def test_pinned_sessions_are_never_evicted_and_the_error_counts_them():
    manager, _ = _manager(budget=100)
    manager.put_session("a", 60, lambda: Slab(60))
    manager.checkout_session("a")
    with pytest.raises(CacheBudgetExceeded, match="kv_cache_budget_bytes=100") as err:
        manager.allocate("request", 50, lambda: Slab(50))
    assert err.value.in_use == 60 and manager.session_ids() == ["a"]
    manager.checkin_session("a")
    manager.allocate("request", 50, lambda: Slab(50))
    assert manager.session_ids() == [] and manager.bytes_in_use == 50


def test_put_replaces_the_old_session_of_the_same_id_and_can_refuse():
    manager, _ = _manager(budget=100)
    manager.put_session("a", 30, lambda: Slab(30))
    manager.put_session("a", 50, lambda: Slab(50))
    assert manager.bytes_in_use == 50 and manager.stats()["handles"] == 1
    manager.allocate("request", 50, lambda: Slab(50))  # evicts a
    with pytest.raises(CacheBudgetExceeded):
        manager.put_session("b", 60, lambda: Slab(60))
    assert manager.session_ids() == [] and manager.bytes_in_use == 50


def test_release_owner_drops_a_session_too():
    manager, _ = _manager(budget=None)
    manager.put_session("a", 30, lambda: Slab(30))
    assert manager.release_owner("a") == 1
    assert manager.session_ids() == [] and manager.bytes_in_use == 0


def test_ttl_zero_keeps_nothing():
    manager, _ = _manager(ttl=0.0)
    manager.put_session("a", 30, lambda: Slab(30))
    assert manager.session_ids() == [] and manager.bytes_in_use == 0


@pytest.mark.parametrize("ttl", [-1.0, float("inf"), float("nan"), True, "60"])
def test_session_ttl_setting_is_checked(ttl):
    from vidloom.core.deploy import DeployConfig
    from vidloom.core.errors import DeployError

    with pytest.raises(DeployError, match="kv_session_ttl_s"):
        DeployConfig(kv_session_ttl_s=ttl)
