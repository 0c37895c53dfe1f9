"""ModelInstance: a loaded card. Components are shared by reference across requests."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from vidloom.core.card import ModelCard
from vidloom.core.deploy import DeployConfig


@dataclass
class ModelInstance:
    """Resident components of one card on one device (one copy of the weights)."""

    card: ModelCard
    components: dict[str, Any]
    device: torch.device
    dtype: torch.dtype  # compute dtype of the denoiser
    checkpoint_dir: str
    deploy: DeployConfig = field(default_factory=DeployConfig)
    # Config keys the load accepted without effect, one line each (file, key, value, why): registry.load_instance
    # fills it; `vidloom generate` prints them as notes and GET /v1/models/{id} lists them.
    accepted_config_keys: tuple[str, ...] = ()

    def __getitem__(self, name: str) -> Any:
        try:
            return self.components[name]
        except KeyError:
            raise KeyError(f"{self.card.model_id} has no loaded component {name!r}; "
                           f"loaded: {sorted(self.components)}") from None
