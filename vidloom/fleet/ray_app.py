"""The fleet as a Ray Serve application: one ingress deployment, one deployment per model (N replicas each).

Entry points: `vidloom fleet up --config fleet.yaml`, or Ray's own CLI with the app builder:
`serve run vidloom.fleet.ray_app:app_builder config=fleet.yaml`.
"""

from __future__ import annotations

from typing import Any

from vidloom.fleet.config import FleetCard, load_fleet_card
from vidloom.fleet.ingress import FleetJobs, attach_jobs, create_fleet_app
from vidloom.fleet.replica import ModelReplica


def fleet_application(card: FleetCard) -> Any:  # -> ray.serve.Application
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from vidloom.fleet.router import ROUTER_PATH, STATS_PERIOD_S

    fleet = card.fleet
    app = create_fleet_app(card.base)

    @serve.deployment(name="ingress", num_replicas=1, ray_actor_options={"num_cpus": 0})
    @serve.ingress(app)
    class FleetIngress:
        def __init__(self, replicas: dict[str, Any]) -> None:
            from vidloom.serving.job_store import open_job_store

            # Reads and flags only: recovery is the replicas' job (they know who is alive).
            attach_jobs(FleetJobs(open_job_store(card.base.store, card.base.data_dir), card.base, replicas))

    replicas = {}
    for index, model in enumerate(fleet.models):
        deployment = serve.deployment(ModelReplica).options(
            name=f"model{index}", num_replicas=model.replicas,
            ray_actor_options={"num_cpus": model.num_cpus, "num_gpus": model.num_gpus},
            health_check_period_s=fleet.health_check_period_s,
            graceful_shutdown_timeout_s=fleet.graceful_shutdown_s,
            max_ongoing_requests=max(8, card.replica_config(model).queue_size * 2),
            request_router_config=RequestRouterConfig(
                request_router_class=ROUTER_PATH, request_routing_stats_period_s=STATS_PERIOD_S),
        )
        replicas[model.model] = deployment.bind(card.replica_config(model))
    return FleetIngress.bind(replicas)


def app_builder(args: dict[str, str]) -> Any:
    """For `serve run vidloom.fleet.ray_app:app_builder config=fleet.yaml`."""
    if "config" not in args:
        raise ValueError("pass the fleet card: serve run vidloom.fleet.ray_app:app_builder config=fleet.yaml")
    return fleet_application(load_fleet_card(args["config"]))
