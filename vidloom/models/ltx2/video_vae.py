"""The LTX-2 video VAE (diffusers `AutoencoderKLLTX2Video`): 32x spatial, 8x temporal, 128 latent channels.

`encode` returns the posterior mode (what LTX2ImageToVideoPipeline uses) or, given `sample=True`, a draw
from it (what LTX2LatentUpsamplePipeline does with a video input). `decode` takes raw (denormalised)
latents and, when the checkpoint enables it, a per-sample decode timestep. The pipelines' latent
(de)normalisation and decode-noise mixing live in `normalize_latents` / `decode_normalized`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping

import torch
from torch import Tensor, nn

from vidloom.core.errors import InvalidRequest
from vidloom.loading.key_policy import KeyPolicy
from vidloom.loading.name_map import NameMap
from vidloom.models.ltx2.video_vae_coders import DOWN_STRIDES, Decoder, Encoder
from vidloom.models.ltx2.video_vae_config import read_diffusers_config, video_vae_policy
from vidloom.models.wan.vae_tiling import SpatialTiling, decode_tiled

LOGVAR_RANGE = (-30.0, 20.0)  # diffusers DiagonalGaussianDistribution clamp


@dataclass(frozen=True)
class LTX2VideoVAEConfig:
    """Architecture of one LTX-2 video VAE; defaults are the published LTX-2 checkpoint's."""

    in_channels: int = 3
    out_channels: int = 3
    latent_channels: int = 128
    block_out_channels: tuple[int, ...] = (256, 512, 1024, 2048)
    decoder_block_out_channels: tuple[int, ...] = (256, 512, 1024)
    layers_per_block: tuple[int, ...] = (4, 6, 6, 2, 2)
    decoder_layers_per_block: tuple[int, ...] = (5, 5, 5, 5)
    spatio_temporal_scaling: tuple[bool, ...] = (True, True, True, True)
    decoder_spatio_temporal_scaling: tuple[bool, ...] = (True, True, True)
    decoder_inject_noise: tuple[bool, ...] = (False, False, False, False)
    downsample_type: tuple[str, ...] = ("spatial", "temporal", "spatiotemporal", "spatiotemporal")
    upsample_type: tuple[str, ...] = ("spatiotemporal", "spatiotemporal", "spatiotemporal")
    upsample_residual: tuple[bool, ...] = (True, True, True)
    upsample_factor: tuple[int, ...] = (2, 2, 2)
    timestep_conditioning: bool = False
    patch_size: int = 4
    resnet_norm_eps: float = 1e-6
    scaling_factor: float = 1.0
    encoder_causal: bool = True
    decoder_causal: bool = True
    encoder_spatial_padding_mode: str = "zeros"
    decoder_spatial_padding_mode: str = "reflect"

    @property
    def spatial_compression_ratio(self) -> int:
        """Pixels per latent cell along height and width (the encoder's strides, times the patch)."""
        return self.patch_size * math.prod(
            DOWN_STRIDES[kind][1] for kind, on in zip(self.downsample_type, self.spatio_temporal_scaling) if on
        )

    @property
    def temporal_compression_ratio(self) -> int:
        """Frames per latent frame after the first (a video has 1 + ratio*k frames)."""
        return math.prod(
            DOWN_STRIDES[kind][0] for kind, on in zip(self.downsample_type, self.spatio_temporal_scaling) if on
        )

    @classmethod
    def policy(cls) -> KeyPolicy:
        """How from_diffusers classifies each config.json key (fields, checked keys, patch_size_t refused)."""
        return VIDEO_VAE_POLICY

    @classmethod
    def config_keys(cls) -> frozenset[str]:
        """Every config.json key from_diffusers classifies; any other is refused."""
        return cls.policy().known

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> LTX2VideoVAEConfig:
        """Read an `AutoencoderKLLTX2Video` config.json; unknown keys or unsupported values -> CheckpointError."""
        return read_diffusers_config(cls, cfg)

    def to_diffusers(self) -> dict[str, Any]:
        """The config.json diffusers would write for this architecture (compression ratios explicit)."""
        out: dict[str, Any] = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        out.update(patch_size_t=1, spatial_compression_ratio=self.spatial_compression_ratio,
                   temporal_compression_ratio=self.temporal_compression_ratio,
                   down_block_types=["LTX2VideoDownBlock3D"] * len(self.block_out_channels))
        return out


# Our tree keeps diffusers' names except for the pieces we flatten: the one-element resampler lists and
# the PixArt-alpha embedder wrapper around the timestep MLP.
LTX2_VIDEO_VAE_NAME_MAP = NameMap(
    (
        ("encoder.down_blocks.{n}.downsamplers.0", "encoder.down_blocks.{n}.downsample"),
        ("decoder.up_blocks.{n}.upsamplers.0", "decoder.up_blocks.{n}.upsample"),
        ("decoder.up_blocks.{n}.time_embedder.timestep_embedder", "decoder.up_blocks.{n}.time_embedder"),
        ("decoder.mid_block.time_embedder.timestep_embedder", "decoder.mid_block.time_embedder"),
        ("decoder.time_embedder.timestep_embedder", "decoder.time_embedder"),
    )
)


VIDEO_VAE_POLICY = video_vae_policy(frozenset(LTX2VideoVAEConfig.__dataclass_fields__))


class LTX2VideoVAE(nn.Module):
    """Encoder + decoder + the latent statistics the pipelines normalise with (buffers, loaded from the checkpoint)."""

    def __init__(self, config: LTX2VideoVAEConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.register_buffer("latents_mean", torch.zeros(config.latent_channels))
        self.register_buffer("latents_std", torch.ones(config.latent_channels))
        self.spatial_compression_ratio = config.spatial_compression_ratio
        self.temporal_compression_ratio = config.temporal_compression_ratio
        self.scaling_factor = config.scaling_factor

    # -- encode ------------------------------------------------------------------------------------

    def check_video(self, video: Tensor) -> None:
        """Raise InvalidRequest naming the problem if the encoder cannot take `video` [B, C, F, H, W]."""
        c, s, t = self.config.in_channels, self.spatial_compression_ratio, self.temporal_compression_ratio
        if video.ndim != 5 or video.shape[1] != c:
            raise InvalidRequest("video", f"expected [batch, {c}, frames, height, width], got {tuple(video.shape)}")
        frames, height, width = video.shape[2:]
        if (frames - 1) % t:
            raise InvalidRequest("video", f"{frames} frames; the LTX-2 VAE encodes 1 + {t}*k frames (e.g. {t + 1})")
        if height % s or width % s:
            raise InvalidRequest("video", f"size {height}x{width} is not a multiple of {s} (the VAE's spatial factor)")

    @torch.no_grad()
    def encode(self, video: Tensor, sample: bool = False, generator: torch.Generator | None = None) -> Tensor:
        """[B, 3, 1+t*k, H, W] in [-1, 1] -> raw latents [B, latent, 1+k, H/s, W/s]: the mode, or a sample."""
        self.check_video(video)
        moments = self.encoder(video.to(self.latents_mean.dtype)).float()  # a bf16 VAE's latents, widened
        mean = moments[:, : self.config.latent_channels]
        if not sample:
            return mean
        # As diffusers' DiagonalGaussianDistribution.sample: one normal draw of the mean's shape.
        std = torch.exp(0.5 * moments[:, -1:].clamp(*LOGVAR_RANGE))
        noise = _randn(mean, generator)
        return mean + std * noise

    # -- decode ------------------------------------------------------------------------------------

    def check_latents(self, latents: Tensor) -> None:
        c = self.config.latent_channels
        if latents.ndim != 5 or latents.shape[1] != c:
            raise InvalidRequest(
                "latents", f"expected [batch, {c}, frames, height, width] for this VAE, got {tuple(latents.shape)}"
            )
        if self.config.decoder_spatial_padding_mode == "reflect" and min(latents.shape[3:]) < 2:
            # Reflect padding needs two cells on each side; a 1-cell latent has nothing to reflect.
            raise InvalidRequest("latents", f"latent size {latents.shape[3]}x{latents.shape[4]} is below the "
                                            f"2x2 this VAE decodes (at least {2 * self.spatial_compression_ratio} px)")

    @torch.no_grad()
    def decode(self, latents: Tensor, timestep: Tensor | float | None = None,
               generator: torch.Generator | None = None, tiling: SpatialTiling | None = None) -> Tensor:
        """Raw latents [B, latent, F, h, w] -> video [B, 3, 1 + t*(F-1), s*h, s*w], nominally in [-1, 1].

        Unclamped, like diffusers (its pipelines clamp when converting to pixels).
        `timestep` ([B] or a float) is required exactly when the checkpoint has timestep conditioning.
        `generator` feeds the decoder's per-block noise injection where the config enables it; None uses
        torch's global RNG, as diffusers does. With `tiling`, a latent larger than one tile is decoded in
        overlapping spatial tiles blended at the seams (diffusers' `enable_tiling` rule), bounding memory.
        """
        self.check_latents(latents)
        timestep = self._check_timestep(latents, timestep)
        if tiling is not None and self._needs_tiles(latents, tiling):
            return decode_tiled(latents, lambda tile, _done, _total: self.decoder(tile, timestep, generator),
                                tiling, self.spatial_compression_ratio)
        return self.decoder(latents, timestep, generator)

    def _needs_tiles(self, latents: Tensor, tiling: SpatialTiling) -> bool:
        s = self.spatial_compression_ratio
        if tiling.tile % s or tiling.stride % s:
            raise InvalidRequest("tiling", f"tile ({tiling.tile}) and stride ({tiling.stride}) must be multiples of {s}")
        tile, stride = tiling.tile // s, tiling.stride // s
        height, width = latents.shape[3:]
        if height <= tile and width <= tile:
            return False
        if self.config.decoder_spatial_padding_mode == "reflect":
            edges = [size - (size - 1) // stride * stride for size in (height, width)]
            if min(min(edge, tile) for edge in edges) < 2:
                raise InvalidRequest("tiling", f"stride {tiling.stride} leaves a 1-cell edge tile on a "
                                               f"{height}x{width} latent, which this VAE's reflect padding cannot take")
        return True

    def _check_timestep(self, latents: Tensor, timestep: Tensor | float | None) -> Tensor | None:
        if self.config.timestep_conditioning:
            if timestep is None:
                raise InvalidRequest("timestep", "this LTX-2 VAE is timestep-conditioned; pass the decode timestep")
            timestep = torch.as_tensor(timestep, dtype=latents.dtype, device=latents.device)
            timestep = timestep.reshape(-1).expand(latents.shape[0]) if timestep.numel() == 1 else timestep
            if timestep.shape != (latents.shape[0],):
                raise InvalidRequest("timestep", f"expected one value per batch item, got {tuple(timestep.shape)}")
            return timestep
        if timestep is not None:
            raise InvalidRequest("timestep", "this LTX-2 VAE has no timestep conditioning (timestep_conditioning=false)")
        return None

    # -- latent statistics (LTX2Pipeline._normalize_latents / _denormalize_latents) ----------------

    def normalize_latents(self, latents: Tensor, scaling_factor: float | None = None) -> Tensor:
        """Raw VAE latents -> the transformer's space. LTX2ImageToVideoPipeline passes scaling 1.0."""
        scale = self.scaling_factor if scaling_factor is None else scaling_factor
        mean, std = self._stats(latents)
        return (latents - mean) * scale / std

    def denormalize_latents(self, latents: Tensor, scaling_factor: float | None = None) -> Tensor:
        scale = self.scaling_factor if scaling_factor is None else scaling_factor
        mean, std = self._stats(latents)
        return latents * std / scale + mean

    def _stats(self, latents: Tensor) -> tuple[Tensor, Tensor]:
        view = (1, -1, 1, 1, 1)
        return (self.latents_mean.view(view).to(latents.device, latents.dtype),
                self.latents_std.view(view).to(latents.device, latents.dtype))

    def decode_normalized(self, latents: Tensor, decode_timestep: float | list[float] = 0.0,
                          decode_noise_scale: float | list[float] | None = None,
                          generator: torch.Generator | None = None, tiling: SpatialTiling | None = None) -> Tensor:
        """What LTX2Pipeline does after denoising: (with timestep conditioning) mix in noise drawn from
        `generator` at `decode_noise_scale` (default: the timestep), denormalise, decode at `decode_timestep`.
        """
        timestep = None
        if self.config.timestep_conditioning:
            batch = latents.shape[0]
            times = _per_item("decode_timestep", decode_timestep, batch)
            scales = times if decode_noise_scale is None else _per_item("decode_noise_scale", decode_noise_scale, batch)
            noise = _randn(latents, generator)
            timestep = torch.tensor(times, device=latents.device, dtype=latents.dtype)
            scale = torch.tensor(scales, device=latents.device, dtype=latents.dtype)[:, None, None, None, None]
            latents = (1 - scale) * latents + scale * noise
        raw = self.denormalize_latents(latents).to(self.latents_mean.dtype)  # the pipeline casts to the VAE's dtype
        return self.decode(raw, timestep, tiling=tiling)


def _per_item(field: str, value: float | list[float], batch: int) -> list[float]:
    values = list(value) if isinstance(value, (list, tuple)) else [float(value)] * batch
    if len(values) != batch:
        raise InvalidRequest(field, f"{len(values)} values for a batch of {batch}")
    return values


def _randn(like: Tensor, generator: torch.Generator | None) -> Tensor:
    """Standard normal of `like`'s shape, drawn on the generator's device (diffusers' randn_tensor rule)."""
    device = generator.device if generator is not None else like.device
    return torch.randn(like.shape, generator=generator, device=device, dtype=like.dtype).to(like.device)

