"""LeastJobsRouter with fake replicas: it counts the jobs it sent since each replica's last load report."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

pytest.importorskip("ray.serve")

from ray.serve._private.common import DeploymentHandleSource, DeploymentID, ReplicaID  # noqa: E402

from vidloom.fleet.router import LeastJobsRouter  # noqa: E402

DEPLOYMENT = DeploymentID(name="model0", app_name="vidloom-model0")


class FakeReplica:
    """What the router reads of a running replica: its id and its last routing stats."""

    def __init__(self, name: str, jobs: int, at: float) -> None:
        self.replica_id = ReplicaID(unique_id=name, deployment_id=DEPLOYMENT)
        self.routing_stats = {"jobs": jobs, "at": at}

    def report(self, jobs: int, at: float) -> None:
        self.routing_stats = {"jobs": jobs, "at": at}


def _router() -> LeastJobsRouter:
    router = LeastJobsRouter(DEPLOYMENT, DeploymentHandleSource.UNKNOWN)
    router.initialize_state()
    return router


def _route(router: LeastJobsRouter, replicas: list[FakeReplica]) -> str:
    """One create: the router's first choice, told back to it as routed (as Ray Serve does)."""
    ranked = asyncio.run(router.choose_replicas(replicas))
    chosen = ranked[0][0]
    router.on_request_routed(None, chosen.replica_id, None)
    return chosen.replica_id.unique_id


def test_a_burst_between_reports_spreads_by_the_jobs_sent_since():
    reported = time.time() - 1.0
    busy, idle = FakeReplica("busy", 2, reported), FakeReplica("idle", 0, reported)
    router = _router()
    first_two = [_route(router, [busy, idle]) for _ in range(2)]
    assert first_two == ["idle", "idle"]  # 0 then 1 queued there, against 2 on the busy one
    # Now both count 2: one more each, whichever comes first (a router blind to its own sends says idle x4).
    assert Counter(_route(router, [busy, idle]) for _ in range(2)) == {"busy": 1, "idle": 1}


def test_a_newer_report_replaces_the_jobs_sent_before_it():
    reported = time.time() - 1.0
    a, b = FakeReplica("a", 2, reported), FakeReplica("b", 0, reported)
    router = _router()
    assert [_route(router, [a, b]) for _ in range(2)] == ["b", "b"]
    later = time.time() + 1.0
    a.report(2, later)
    b.report(0, later)  # b finished everything it was sent; its report covers those jobs
    assert _route(router, [a, b]) == "b"
    assert _route(router, [a, b]) == "b"  # 1 sent since the report, against 2 reported on a
