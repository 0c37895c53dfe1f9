"""Cosmos3GenConfig: the generation pathways' sizes and sequence-layout settings, from transformer/config.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from vidloom.core.errors import CheckpointError
from vidloom.families.cosmos3.config import Cosmos3TextConfig


@dataclass(frozen=True)
class Cosmos3GenConfig:
    """What the vision/sound pathways add to the text backbone's config (Cosmos3OmniTransformer's keys)."""

    text: Cosmos3TextConfig
    latent_channel: int  # VAE latent channels (48 for the Wan2.2 VAE)
    latent_patch_size: int  # spatial patch side over the latent grid
    patch_latent_dim: int  # latent_channel * patch^2: proj_in's input width
    timestep_scale: float  # sigma*1000 timesteps are scaled by this before the sinusoidal features
    base_fps: float
    enable_fps_modulation: bool  # temporal rope positions of video tokens follow the fps
    temporal_margin: int  # rope offset between the text and the generated modalities
    reset_spatial_ids: bool  # h/w rope positions restart at 0 for the vision grid
    use_und_k_norm_for_gen: bool  # a separate k norm for text keys read by the generation pathway
    sound_dim: int | None  # sound latent channels; None: no sound pathway
    sound_latent_fps: float
    action_dim: int | None = None  # padded action width of the action pathway; None: no action pathway
    action_domains: int = 0  # embodiment domains the action projections hold a weight for

    def __post_init__(self) -> None:
        if self.patch_latent_dim != self.latent_channel * self.latent_patch_size ** 2:
            raise CheckpointError(
                f"transformer/config.json: patch_latent_dim {self.patch_latent_dim} must be latent_channel "
                f"{self.latent_channel} x latent_patch_size^2 ({self.latent_patch_size}^2)")

    @property
    def und_k_norm_for_gen(self) -> bool:
        """Whether the checkpoint has `k_norm_und_for_gen` (diffusers builds it only without text q/k norms)."""
        return self.use_und_k_norm_for_gen and not self.text.qk_norm

    @property
    def actions(self) -> bool:
        return self.action_dim is not None

    @property
    def sound(self) -> bool:
        return self.sound_dim is not None

    @classmethod
    def from_transformer_config(cls, raw: Mapping[str, Any]) -> Cosmos3GenConfig:
        """From Cosmos3OmniTransformer's config.json (its defaults where a key is absent)."""
        sound_gen = bool(raw.get("sound_gen", False))
        try:
            return cls(
                text=Cosmos3TextConfig.from_transformer_config(raw),
                latent_channel=int(raw.get("latent_channel", 48)),
                latent_patch_size=int(raw.get("latent_patch_size", 2)),
                patch_latent_dim=int(raw.get("patch_latent_dim", 192)),
                timestep_scale=float(raw.get("timestep_scale", 0.001)),
                base_fps=float(raw.get("base_fps", 24)),
                enable_fps_modulation=bool(raw.get("enable_fps_modulation", True)),
                temporal_margin=int(raw.get("unified_3d_mrope_temporal_modality_margin", 15000)),
                reset_spatial_ids=bool(raw.get("unified_3d_mrope_reset_spatial_ids", True)),
                use_und_k_norm_for_gen=bool(raw.get("use_und_k_norm_for_gen", False)),
                sound_dim=int(raw["sound_dim"]) if sound_gen and raw.get("sound_dim") is not None else None,
                sound_latent_fps=float(raw.get("sound_latent_fps", 25.0)),
                action_dim=int(raw["action_dim"]) if raw.get("action_gen") else None,
                action_domains=int(raw.get("num_embodiment_domains", 32)) if raw.get("action_gen") else 0,
            )
        except (TypeError, ValueError, KeyError) as exc:
            raise CheckpointError(f"transformer/config.json: {exc}") from None
