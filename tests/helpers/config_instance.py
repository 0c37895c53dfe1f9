"""An instance as the memory estimators read it (component configs, deployment, dtype, device): no weights."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import torch

from vidloom.core.deploy import DeployConfig


@dataclasses.dataclass
class ConfigInstance:
    components: dict
    deploy: DeployConfig = DeployConfig()
    dtype: torch.dtype = torch.bfloat16
    device: torch.device = torch.device("cuda")
    card: Any = None

    def __getitem__(self, name: str) -> Any:
        return self.components[name]


def config_instance(transformer: Any, vae: Any, card: Any = None, **deploy: Any) -> ConfigInstance:
    """A bf16 CUDA instance of a transformer and a VAE of these configs, deployed with `deploy`."""
    components = {"transformer": SimpleNamespace(config=transformer), "vae": SimpleNamespace(config=vae)}
    return ConfigInstance(components, DeployConfig(**deploy), card=card)
