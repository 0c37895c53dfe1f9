"""Stable Audio Open's conditioning projection: T5 states to the DiT's text width, and seconds to tokens.

Layout (diffusers `StableAudioProjectionModel`): a linear on the text states (identity when the widths already
agree) and, for the start and the end time each, a number conditioner: the value clamped to [min_value,
max_value] and scaled to [0, 1], then [t, sin(2 pi t w), cos(2 pi t w)] with learned frequencies w, then a linear
to the conditioning width. The arithmetic follows the reference's operation order so the tokens match it bit
for bit (see NOTICE).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import Tensor, nn

from vidloom.loading.config_keys import check_class_name, positive_int, read_key
from vidloom.loading.key_policy import KeyPolicy
from vidloom.loading.name_map import NameMap

DIFFUSERS_CLASS_NAME = "StableAudioProjectionModel"
NUMBER_FEATURES = 256  # StableAudioNumberConditioner's internal_dim (the pipeline never changes it)


@dataclass(frozen=True)
class ProjectionConfig:
    text_dim: int = 768  # text_encoder_dim
    conditioning_dim: int = 768
    min_value: float = 0.0  # seconds
    max_value: float = 512.0

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> ProjectionConfig:
        where = "projection_model/config.json"
        check_class_name(cfg, (DIFFUSERS_CLASS_NAME,), where)
        KeyPolicy(frozenset({"text_encoder_dim", "conditioning_dim", "min_value", "max_value"})).check(cfg, where)
        d = cls()
        config = cls(
            text_dim=read_key(cfg, "text_encoder_dim", d.text_dim, positive_int, where),
            conditioning_dim=read_key(cfg, "conditioning_dim", d.conditioning_dim, positive_int, where),
            min_value=read_key(cfg, "min_value", d.min_value, _finite, where),
            max_value=read_key(cfg, "max_value", d.max_value, _finite, where),
        )
        if config.max_value <= config.min_value:
            raise ValueError(f"{where}: max_value {config.max_value} must exceed min_value {config.min_value}")
        return config


def _finite(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError("expected a finite number")
    return float(value)


class NumberConditioner(nn.Module):
    """A number of seconds -> one [1, dim] token."""

    def __init__(self, dim: int, min_value: float, max_value: float) -> None:
        super().__init__()
        self.min_value, self.max_value = min_value, max_value
        self.freqs = nn.Parameter(torch.zeros(NUMBER_FEATURES // 2))
        self.linear = nn.Linear(NUMBER_FEATURES + 1, dim)

    def forward(self, seconds: Tensor) -> Tensor:
        """seconds [B] (float32) -> [B, 1, dim]."""
        t = (seconds.clamp(self.min_value, self.max_value) - self.min_value) / (self.max_value - self.min_value)
        t = t.to(self.freqs.dtype)[..., None]
        angles = t * self.freqs[None] * 2 * math.pi
        features = torch.cat([t, angles.sin(), angles.cos()], dim=-1)
        return self.linear(features).view(-1, 1, self.linear.out_features)


class StableAudioProjection(nn.Module):
    def __init__(self, config: ProjectionConfig) -> None:
        super().__init__()
        self.config = config
        same = config.text_dim == config.conditioning_dim
        self.text_projection = nn.Identity() if same else nn.Linear(config.text_dim, config.conditioning_dim)
        self.start_number_conditioner = NumberConditioner(config.conditioning_dim, config.min_value, config.max_value)
        self.end_number_conditioner = NumberConditioner(config.conditioning_dim, config.min_value, config.max_value)

    def seconds(self, start: float, end: float, device: torch.device) -> tuple[Tensor, Tensor]:
        """The start and end tokens [1, 1, dim] for one request."""
        start_t = torch.tensor([float(start)], device=device)
        end_t = torch.tensor([float(end)], device=device)
        return self.start_number_conditioner(start_t), self.end_number_conditioner(end_t)


# Checkpoint names: the number conditioners keep their features and linear in a Sequential.
STABLE_AUDIO_PROJECTION_NAME_MAP = NameMap((
    ("start_number_conditioner.time_positional_embedding.0.weights", "start_number_conditioner.freqs"),
    ("start_number_conditioner.time_positional_embedding.1", "start_number_conditioner.linear"),
    ("end_number_conditioner.time_positional_embedding.0.weights", "end_number_conditioner.freqs"),
    ("end_number_conditioner.time_positional_embedding.1", "end_number_conditioner.linear"),
))
