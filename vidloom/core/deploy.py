"""DeployConfig: how a model is deployed on its device, fixed when it is loaded."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeployConfig:
    """Load-time performance and memory options; defaults are the plain reference path.

    One field per feature, each read by the loader, the program builder or the runtime.
    """
