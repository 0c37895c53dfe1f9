"""FleetConfig: the `fleet:` section of a deployment card (the rest of the card is every replica's ServeConfig)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from vidloom.core.deploy import DeployConfig
from vidloom.serving.config import ServeConfig
from vidloom.serving.deploy_card import CardLayer, DeployCardError, build, build_section, load_card


@dataclass(frozen=True)
class FleetModel:
    """One model of the fleet: `replicas` copies, each one vidloom engine on its own devices."""

    model: str  # registered model id or checkpoint directory (every Ray node must see it)
    replicas: int = 1
    num_cpus: float = 1.0  # Ray resources per replica
    num_gpus: float = 0.0  # = deploy.devices on GPU nodes (a multi-device plan needs them all)
    slots: int | None = None  # None: the card's
    queue_size: int | None = None
    device: str | None = None
    dtype: str | None = None
    deploy: DeployConfig | None = None  # None: the card's `deploy`

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas: must be >= 1, got {self.replicas}")
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError("num_cpus and num_gpus must be >= 0")


@dataclass(frozen=True)
class FleetConfig:
    """How the fleet runs on Ray; the HTTP address is the card's host and port."""

    models: tuple[FleetModel, ...] = ()
    ray_address: str | None = None  # an existing cluster ("auto", "ray://..."); None starts a local Ray
    num_cpus: int | None = None  # CPUs of a local Ray (None: the machine's)
    object_store_mb: int = 256  # object store of a local Ray (jobs pass no tensors through it)
    app_name: str = "vidloom"
    health_check_period_s: float = 5.0  # Ray Serve calls each replica's check_health this often
    graceful_shutdown_s: float = 10.0  # Ray waits this long for a stopping replica (it drains its jobs)

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("models: a fleet needs at least one model (fleet.models: [{model: ..., replicas: N}])")
        ids = [m.model for m in self.models]
        if len(set(ids)) != len(ids):
            raise ValueError(f"models: each model once (use replicas for copies), got {ids}")
        if self.object_store_mb < 64:
            raise ValueError(f"object_store_mb: must be >= 64, got {self.object_store_mb}")


@dataclass(frozen=True)
class FleetCard:
    base: ServeConfig  # the ingress's settings, and every replica's unless its model overrides them
    fleet: FleetConfig

    def replica_config(self, model: FleetModel) -> ServeConfig:
        changes = {k: getattr(model, k) for k in ("slots", "queue_size", "device", "dtype", "deploy")
                   if getattr(model, k) is not None}
        return dataclasses.replace(self.base, model=model.model, **changes)


def load_fleet_card(path: Path, overrides: CardLayer | None = None) -> FleetCard:
    """A card with a `fleet:` section; a fleet needs a shared job store (PostgreSQL)."""
    from vidloom.serving.deploy_card import merge

    layer = load_card(path)
    if overrides is not None:
        layer = merge(layer, overrides)
    if "fleet" not in layer.values:
        raise DeployCardError(f"{path}: a fleet card needs a `fleet:` section with `models:`")
    base = build(ServeConfig, layer, ignore=("fleet",))
    fleet = build_section(FleetConfig, layer, "fleet")
    if base.store is None or not base.store.startswith(("postgresql://", "postgres://")):
        where = layer.where(("store",)) if "store" in layer.values else str(path)
        raise DeployCardError(f"{where}: store: a fleet's replicas share one job table; "
                              "set store: postgresql://... (SQLite serves one process)")
    return FleetCard(base, fleet)
