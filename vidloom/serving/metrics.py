"""Prometheus metrics for one server, in its own registry (no process-global collectors)."""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

CONTENT_TYPE = CONTENT_TYPE_LATEST
# Steps run from milliseconds (tiny demo on CPU) to tens of seconds (14B at 720p).
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
JOB_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


class ServerMetrics:
    """Queue depth and in-flight are read from the engine at scrape time; the rest is counted as it happens."""

    def __init__(
        self,
        queue_depth: Callable[[], float],
        in_flight: Callable[[], float],
        compile_misses: Callable[[], float] = lambda: 0,
    ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_ReadCounter(
            "vidloom_compile_bucket_misses",
            "Requests that ran eagerly because their shape is outside the torch.compile shape buckets",
            compile_misses,
        ))
        Gauge("vidloom_queue_depth", "Requests waiting for a slot", registry=self.registry).set_function(queue_depth)
        Gauge("vidloom_in_flight", "Requests holding a slot", registry=self.registry).set_function(in_flight)
        self._steps = Histogram(
            "vidloom_step_seconds", "Wall time of one step, by phase (denoise step, decoded latent frame)",
            ["phase"], buckets=STEP_BUCKETS, registry=self.registry,
        )
        self._jobs = Histogram(
            "vidloom_job_seconds", "Time from submission to final status", ["kind"],
            buckets=JOB_BUCKETS, registry=self.registry,
        )
        self._first_chunk = Histogram(
            "vidloom_time_to_first_chunk_seconds",
            "Time from a video job's creation to its first decoded chunk (models that stream chunks)",
            buckets=JOB_BUCKETS, registry=self.registry,
        )
        self._finished = Counter(
            "vidloom_requests", "Requests by kind (video | image | session_chunk) and final status", ["kind", "status"],
            registry=self.registry,
        )
        self._rejected = Counter(
            "vidloom_rejected_requests", "Requests refused (400, 408, 413, 429), by error code", ["reason"],
            registry=self.registry,
        )

    def step(self, phase: str, seconds: float) -> None:
        self._steps.labels(phase=phase).observe(seconds)

    def first_chunk(self, seconds: float) -> None:
        self._first_chunk.observe(seconds)

    def finished(self, kind: str, status: str, seconds: float) -> None:
        self._finished.labels(kind=kind, status=status).inc()
        self._jobs.labels(kind=kind).observe(seconds)

    def rejected(self, reason: str) -> None:
        self._rejected.labels(reason=reason).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _ReadCounter(Collector):
    """A counter the runtime keeps (it cannot import serving); read at scrape time."""

    def __init__(self, name: str, documentation: str, read: Callable[[], float]) -> None:
        self._name, self._documentation, self._read = name, documentation, read

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self._name, self._documentation, value=self._read())
