"""The fleet's model replicas on Ray Serve: one Serve application per model (N replicas each), without Ray's HTTP proxy.

Ray Serve's proxy cannot apply the single server's connection limits (header deadline, connection
cap, probe reserve), so it stays off; the ingress runs on our own uvicorn (fleet/server.py) and calls
the replicas through the Serve handles returned here.
"""

from __future__ import annotations

from typing import Any

from vidloom.fleet.config import FleetCard
from vidloom.fleet.replica import ModelReplica


def start_ray(card: FleetCard) -> None:
    """Start or join Ray, and Serve's controller with its HTTP proxy disabled."""
    import ray
    from ray import serve

    fleet = card.fleet
    if not ray.is_initialized():
        if fleet.ray_address:
            ray.init(address=fleet.ray_address)
        else:
            ray.init(num_cpus=fleet.num_cpus, object_store_memory=fleet.object_store_mb * 2**20,
                     include_dashboard=False)
    serve.start(proxy_location="Disabled")


def deploy_replicas(card: FleetCard) -> dict[str, Any]:
    """Deploy (or redeploy, e.g. with other replica counts) every model; model id -> its DeploymentHandle."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from vidloom.fleet.router import ROUTER_PATH, STATS_PERIOD_S

    fleet = card.fleet
    handles: dict[str, Any] = {}
    for index, model in enumerate(fleet.models):
        config = card.replica_config(model)
        deployment = serve.deployment(ModelReplica).options(
            name=f"model{index}", num_replicas=model.replicas,
            ray_actor_options={"num_cpus": model.num_cpus, "num_gpus": model.num_gpus},
            health_check_period_s=fleet.health_check_period_s,
            graceful_shutdown_timeout_s=fleet.graceful_shutdown_s,
            # Creates return once queued; images and chat streams stay ongoing while they run.
            max_ongoing_requests=max(8, (config.queue_size + config.slots) * 2),
            request_router_config=RequestRouterConfig(
                request_router_class=ROUTER_PATH, request_routing_stats_period_s=STATS_PERIOD_S),
        )
        handles[model.model] = serve.run(deployment.bind(config), name=f"{fleet.app_name}-model{index}",
                                         route_prefix=None)
    return handles
