"""CacheManager: handles, byte accounting against a budget, release paths."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from vidloom.core.errors import CacheBudgetExceeded
from vidloom.runtime.cache_manager import CacheManager


@dataclass
class Slab:
    nbytes: int


def test_allocate_accounts_and_release_returns_bytes():
    manager = CacheManager(budget_bytes=100)
    a, slab_a = manager.allocate("r1", 60, lambda: Slab(60))
    assert manager.get(a) is slab_a and manager.bytes_in_use == 60
    b, _ = manager.allocate("r2", 40, lambda: Slab(40))
    assert manager.stats() == {"bytes_in_use": 100, "budget_bytes": 100, "handles": 2, "owners": 2}
    assert manager.release(a) is True and manager.release(a) is False  # idempotent
    assert manager.bytes_in_use == 40
    with pytest.raises(KeyError, match="released"):
        manager.get(a)
    manager.release(b)
    assert manager.bytes_in_use == 0


def test_over_budget_fails_before_building_and_names_the_setting():
    manager = CacheManager(budget_bytes=100)
    manager.allocate("r1", 70, lambda: Slab(70))
    built = []
    with pytest.raises(CacheBudgetExceeded, match="kv_cache_budget_bytes=100") as err:
        manager.allocate("r2", 31, lambda: built.append(1) or Slab(31))
    assert not built and (err.value.needed, err.value.in_use) == (31, 70)
    assert manager.bytes_in_use == 70


def test_failed_or_mismeasured_build_gives_its_reservation_back():
    manager = CacheManager(budget_bytes=100)

    def boom() -> Slab:
        raise MemoryError("device out of memory")

    with pytest.raises(MemoryError):
        manager.allocate("r1", 50, boom)
    with pytest.raises(AssertionError, match="reserved"):
        manager.allocate("r1", 50, lambda: Slab(49))
    assert manager.bytes_in_use == 0 and manager.stats()["handles"] == 0


def test_release_owner_frees_everything_it_holds():
    manager = CacheManager()
    for n in (10, 20):
        manager.allocate("session-1", n, lambda n=n: Slab(n))
    manager.allocate("other", 5, lambda: Slab(5))
    assert manager.release_owner("session-1") == 2
    assert manager.bytes_in_use == 5


def test_concurrent_allocations_never_overshoot_the_budget():
    manager = CacheManager(budget_bytes=1000)
    granted: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(50):
            try:
                handle, _ = manager.allocate("r", 30, lambda: Slab(30))
            except CacheBudgetExceeded:
                continue
            with lock:
                granted.append(handle.id)
            assert manager.bytes_in_use <= 1000

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(granted) == 1000 // 30 and manager.bytes_in_use == 30 * len(granted)
