"""LeastJobsRouter: sends a new job to the replica with the fewest jobs queued or running.

Ray Serve's default router balances ongoing *calls*, but a create call returns as soon as the job is
queued, so every replica looks idle to it. Replicas report their engine's queue depth and jobs in
flight (`ModelReplica.record_routing_stats`); the router adds the jobs it has sent each replica since
that report, so a burst of creates spreads out before the next report arrives.
"""

from __future__ import annotations

import random
import time
from typing import Any

from ray.serve.request_router import FIFOMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

ROUTER_PATH = "vidloom.fleet.router:LeastJobsRouter"
STATS_PERIOD_S = 0.5  # how often replicas report their load


class LeastJobsRouter(FIFOMixin, RequestRouter):
    def initialize_state(self, **kwargs: Any) -> None:
        self._sent: dict[ReplicaID, list[float]] = {}

    def _load(self, replica: RunningReplica) -> float:
        stats = replica.routing_stats or {}
        reported_at = float(stats.get("at", 0.0))
        since = [t for t in self._sent.get(replica.replica_id, []) if t > reported_at]
        self._sent[replica.replica_id] = since
        return float(stats.get("jobs", 0)) + len(since)

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        ranked = sorted(candidate_replicas, key=lambda r: (self._load(r), random.random()))
        return [[r] for r in ranked]  # try the least loaded first; the next if it refuses

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        self._sent.setdefault(replica_id, []).append(time.time())
