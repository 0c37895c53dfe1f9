"""Prometheus metrics of the runtime's KV cache manager: bytes held, budget, resident sessions, evictions."""

from __future__ import annotations

import math
from typing import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from vidloom.runtime.cache_manager import CacheManager


def register_kv_metrics(registry: CollectorRegistry, caches: CacheManager) -> None:
    registry.register(_KVCacheCollector(caches))


class _KVCacheCollector(Collector):
    """Read at scrape time (the runtime cannot import serving); a scrape also expires idle sessions."""

    def __init__(self, caches: CacheManager) -> None:
        self._caches = caches

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        sessions = self._caches.session_stats()
        budget = self._caches.budget_bytes
        yield GaugeMetricFamily("vidloom_kv_cache_bytes_in_use",
                                "Bytes of KV cache held (running requests' slabs and resident sessions)",
                                value=self._caches.bytes_in_use)
        yield GaugeMetricFamily("vidloom_kv_cache_budget_bytes",
                                "KV cache budget (kv_cache_budget_bytes; +Inf: no limit)",
                                value=math.inf if budget is None else budget)
        yield GaugeMetricFamily("vidloom_kv_sessions", "Finished causal videos whose KV is resident for extend_from",
                                value=sessions["sessions"])
        yield GaugeMetricFamily("vidloom_kv_session_bytes", "Bytes of KV held by resident sessions",
                                value=sessions["session_bytes"])
        yield CounterMetricFamily("vidloom_kv_session_evictions",
                                  "Sessions evicted (least recently used) to make room for a new allocation",
                                  value=sessions["evictions"])
        yield CounterMetricFamily("vidloom_kv_session_expirations", "Sessions dropped after kv_session_ttl_s idle",
                                  value=sessions["expirations"])
