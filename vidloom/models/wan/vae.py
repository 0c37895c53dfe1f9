"""The Wan causal video VAE (Wan2.1, and Wan2.2's 48-channel residual one), numerically equivalent
to diffusers' AutoencoderKLWan."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.memory_format import channels_last, use_channels_last
from vidloom.loading.name_map import NameMap
from vidloom.models.wan.vae_config import (  # noqa: F401 (the config names are re-exported)
    WAN21_LATENTS_MEAN,
    WAN21_LATENTS_STD,
    WAN_VAE_POLICY,
    WanVAEConfig,
)
from vidloom.models.wan.vae_tiling import SpatialTiling, decode_tiled
from vidloom.models.wan.vae_residual import ResidualDownStage, ResidualUpStage, patchify, unpatchify
from vidloom.models.wan.vae_blocks import (
    CausalCache,
    CausalConv3d,
    Downsample,
    MidBlock,
    RMSNorm,
    ResidualBlock,
    Upsample,
)


@dataclass(frozen=True)
class LatentDistribution:
    """Diagonal Gaussian over latents, as the encoder predicts it."""

    mean: Tensor
    """[B, z, T, h, w]."""
    logvar: Tensor
    """[B, z, T, h, w], clamped to [-30, 20] so exp() stays finite."""

    @classmethod
    def from_moments(cls, moments: Tensor) -> LatentDistribution:
        """Split the encoder's [B, 2z, ...] output into mean and (clamped) log-variance."""
        mean, logvar = moments.chunk(2, dim=1)
        return cls(mean=mean, logvar=logvar.clamp(-30.0, 20.0))

    @property
    def std(self) -> Tensor:
        """Standard deviation, exp(logvar / 2)."""
        return torch.exp(0.5 * self.logvar)

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """mean + std * noise; the same generator state gives diffusers' sample."""
        # A CPU generator draws on the CPU whatever the latents' device, as diffusers does,
        # so a seed means the same noise everywhere.
        device = generator.device if generator is not None else self.mean.device
        noise = torch.randn(self.mean.shape, generator=generator, device=device, dtype=self.mean.dtype)
        return self.mean + self.std * noise.to(self.mean.device)


class Encoder(nn.Module):
    """Video [B, 3, F, H, W] -> latent moments [B, 2z, T, h, w], one time chunk per call."""

    def __init__(self, config: WanVAEConfig) -> None:
        super().__init__()
        dims = [config.base_dim * m for m in (1, *config.dim_mult)]
        self.conv_in = CausalConv3d(config.in_channels, dims[0], 3, padding=1)
        # Flat, like diffusers' down_blocks, so checkpoint indices carry over one to one.
        layers: list[nn.Module] = []
        for stage, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):
            down = stage < len(config.temporal_downsample)
            temporal = down and config.temporal_downsample[stage]
            if config.is_residual:  # Wan2.2: one module per stage, with its shortcut
                layers.append(ResidualDownStage(in_dim, out_dim, config.num_res_blocks, down, temporal))
                continue
            for _ in range(config.num_res_blocks):
                layers.append(ResidualBlock(in_dim, out_dim))
                in_dim = out_dim
            if down:
                layers.append(Downsample(out_dim, temporal=temporal))
        self.layers = nn.ModuleList(layers)
        self.mid = MidBlock(dims[-1])
        self.norm_out = RMSNorm(dims[-1], spatial_dims=3)
        self.conv_out = CausalConv3d(dims[-1], config.z_dim * 2, 3, padding=1)

    def forward(self, x: Tensor, cache: CausalCache) -> Tensor:
        x = cache.stream(self.conv_in, x)
        for layer in self.layers:
            x = layer(x, cache)
        x = self.mid(x, cache)
        return cache.stream(self.conv_out, F.silu(self.norm_out(x)))


class DecoderStage(nn.Module):
    """Residual blocks at one resolution, then an optional upsample."""

    def __init__(self, in_dim: int, out_dim: int, depth: int, upsample: Upsample | None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(ResidualBlock(in_dim if i == 0 else out_dim, out_dim) for i in range(depth))
        self.up = upsample

    def forward(self, x: Tensor, cache: CausalCache) -> Tensor:
        for block in self.blocks:
            x = block(x, cache)
        return x if self.up is None else self.up(x, cache)


class Decoder(nn.Module):
    """Latents [B, z, T, h, w] -> video [B, 3, F, H, W], one latent frame per call."""

    def __init__(self, config: WanVAEConfig) -> None:
        super().__init__()
        mult = config.dim_mult
        dims = [config.decoder_dim * m for m in (mult[-1], *reversed(mult))]
        temporal_upsample = tuple(reversed(config.temporal_downsample))
        self.conv_in = CausalConv3d(config.z_dim, dims[0], 3, padding=1)
        self.mid = MidBlock(dims[0])
        stages: list[nn.Module] = []
        in_dim = dims[0]
        for stage, out_dim in enumerate(dims[1:]):
            up = stage != len(mult) - 1
            temporal = up and temporal_upsample[stage]
            if config.is_residual:  # Wan2.2: channel-keeping upsamples and a duplicating shortcut
                stages.append(ResidualUpStage(in_dim, out_dim, config.num_res_blocks + 1, up, temporal))
                in_dim = out_dim
                continue
            upsample = Upsample(out_dim, temporal=temporal) if up else None
            stages.append(DecoderStage(in_dim, out_dim, config.num_res_blocks + 1, upsample))
            # Wan2.1's upsample convs halve the channels on their way out.
            in_dim = out_dim // 2
        self.stages = nn.ModuleList(stages)
        self.norm_out = RMSNorm(dims[-1], spatial_dims=3)
        self.conv_out = CausalConv3d(dims[-1], config.out_channels, 3, padding=1)

    def forward(self, x: Tensor, cache: CausalCache) -> Tensor:
        x = cache.stream(self.conv_in, x)
        x = self.mid(x, cache)
        for stage in self.stages:
            x = stage(x, cache)
        return cache.stream(self.conv_out, F.silu(self.norm_out(x)))


class WanVAE(nn.Module):
    """Wan2.1 VAE encoder and decoder.

    The module holds weights only: each encode/decode call keeps its causal state in a
    CausalCache of its own, so one instance can serve concurrent calls.
    """

    def __init__(self, config: WanVAEConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.quant_conv = CausalConv3d(config.z_dim * 2, config.z_dim * 2, 1)
        self.post_quant_conv = CausalConv3d(config.z_dim, config.z_dim, 1)
        self.decoder = Decoder(config)
        use_channels_last(self)

    @torch.no_grad()
    def encode(self, video: Tensor) -> LatentDistribution:
        """Video [B, 3, 1 + k*temporal_factor, H, W] in [-1, 1] -> latent distribution with 1 + k frames."""
        step = self.config.temporal_factor
        if video.ndim != 5 or video.shape[1] * (self.config.patch_size or 1) ** 2 != self.config.in_channels:
            raise ValueError(f"video must be [B, 3, F, H, W]; got shape {tuple(video.shape)}")
        frames = video.shape[2]
        if frames < 1 or (frames - 1) % step:
            raise ValueError(f"video has {frames} frames; the Wan VAE needs 1 + {step}*k frames")
        # The first frame is encoded alone (it gets its own latent frame), then each
        # group of `step` frames becomes one latent frame.
        chunks = [video[:, :, :1]]
        if frames > 1:  # split() of an empty time axis would still yield one empty chunk
            chunks += video[:, :, 1:].split(step, dim=2)
        chunks = [channels_last(patchify(chunk, self.config.patch_size or 1)) for chunk in chunks]
        cache = CausalCache()
        moments = []
        for index, chunk in enumerate(chunks):
            cache.begin_chunk(last=index == len(chunks) - 1)
            moments.append(self.encoder(chunk, cache))
        return LatentDistribution.from_moments(self.quant_conv(torch.cat(moments, dim=2)))

    @torch.no_grad()
    def decode(
        self,
        latents: Tensor,
        progress: Callable[[int, int], None] | None = None,
        tiling: SpatialTiling | None = None,
    ) -> Tensor:
        """Raw latents [B, z, T, h, w] -> video [B, 3, 1 + (T-1)*temporal_factor, H, W] clamped to [-1, 1].

        `progress(done, total)` is called after each latent frame (of each tile) is decoded.
        With `tiling`, overlapping spatial tiles are decoded one at a time and blended,
        so peak activation memory follows the tile size instead of the frame size.
        """
        if latents.ndim != 5 or latents.shape[1] != self.config.z_dim:
            raise ValueError(
                f"latents must be [B, {self.config.z_dim}, T, h, w]; got shape {tuple(latents.shape)}"
            )
        x = self.post_quant_conv(channels_last(latents))
        patch = self.config.patch_size or 1
        if tiling is None:
            return unpatchify(self._decode_frames(x, progress, 0, x.shape[2]), patch).clamp(-1.0, 1.0)
        # Wan2.2 (patch 2): tiles decode to the patched grid and blend there, unpatched once at the end, as
        # diffusers' AutoencoderKLWan.tiled_decode does (its tile sizes divided by the patch).
        if tiling.tile % self.config.spatial_factor or tiling.stride % self.config.spatial_factor:
            raise ValueError(f"tile ({tiling.tile}) and stride ({tiling.stride}) must be multiples of "
                             f"{self.config.spatial_factor}")
        patched = SpatialTiling(tile=tiling.tile // patch, stride=tiling.stride // patch)
        tiled = decode_tiled(x, lambda tile, done, total: self._decode_frames(tile, progress, done, total),
                             patched, self.config.spatial_factor // patch)
        return unpatchify(tiled, patch).clamp(-1.0, 1.0)

    def _decode_frames(
        self, x: Tensor, progress: Callable[[int, int], None] | None, done: int, total: int
    ) -> Tensor:
        """Causal decode of post-quant latents [B, z, T, h, w] to the patched pixel grid (Wan2.2: 3 * patch^2
        channels at 1/patch the size); unclamped."""
        cache = CausalCache()
        frames = []
        # One latent frame at a time bounds activation memory by a single chunk.
        for index in range(x.shape[2]):
            cache.begin_chunk(last=index == x.shape[2] - 1)
            frames.append(self.decoder(x[:, :, index : index + 1], cache))
            if progress is not None:
                progress(done + index + 1, total)
        return torch.cat(frames, dim=2)

    def normalize_latents(self, raw: Tensor) -> Tensor:
        """Encoder latents -> the standardised latents the transformer works in."""
        mean, inv_std = self._latent_stats(raw)
        return (raw - mean) * inv_std

    def denormalize_latents(self, z: Tensor) -> Tensor:
        """Transformer latents -> raw latents for `decode`."""
        mean, inv_std = self._latent_stats(z)
        # Dividing by the reciprocal (not multiplying by std) is what WanPipeline does;
        # keeping it makes our latents match bit for bit.
        return z / inv_std + mean

    def _latent_stats(self, like: Tensor) -> tuple[Tensor, Tensor]:
        shape = (1, self.config.z_dim, 1, 1, 1)
        mean = torch.tensor(self.config.latents_mean, dtype=torch.float32).view(shape)
        # The reciprocal is taken in fp32 before casting, as diffusers does.
        inv_std = 1.0 / torch.tensor(self.config.latents_std, dtype=torch.float32).view(shape)
        return mean.to(like.device, like.dtype), inv_std.to(like.device, like.dtype)


# diffusers AutoencoderKLWan state_dict keys -> WanVAE state_dict keys. Unlisted keys
# (conv_in, conv_out, norm_out, quant_conv, post_quant_conv, norm1/conv1/...) keep their names.
WAN_VAE_NAME_MAP = NameMap(
    (
        # Wan2.2 (is_residual): one down/up block per stage with nested resnets and resamplers.
        ("encoder.down_blocks.{n}.resnets.{n}.conv_shortcut", "encoder.layers.{n}.blocks.{n}.skip"),
        ("encoder.down_blocks.{n}.resnets.{n}", "encoder.layers.{n}.blocks.{n}"),
        ("encoder.down_blocks.{n}.downsampler.resample.1", "encoder.layers.{n}.down.spatial"),
        ("encoder.down_blocks.{n}.downsampler.time_conv", "encoder.layers.{n}.down.temporal"),
        ("decoder.up_blocks.{n}.upsampler.resample.1", "decoder.stages.{n}.upsampler.spatial"),
        ("decoder.up_blocks.{n}.upsampler.time_conv", "decoder.stages.{n}.upsampler.temporal"),
        # Wan2.1
        ("encoder.down_blocks.{n}.conv_shortcut", "encoder.layers.{n}.skip"),
        ("encoder.down_blocks.{n}.resample.1", "encoder.layers.{n}.spatial"),
        ("encoder.down_blocks.{n}.time_conv", "encoder.layers.{n}.temporal"),
        ("encoder.down_blocks.{n}", "encoder.layers.{n}"),
        ("encoder.mid_block.resnets.0", "encoder.mid.res_in"),
        ("encoder.mid_block.attentions.0", "encoder.mid.attn"),
        ("encoder.mid_block.resnets.1", "encoder.mid.res_out"),
        ("decoder.mid_block.resnets.0", "decoder.mid.res_in"),
        ("decoder.mid_block.attentions.0", "decoder.mid.attn"),
        ("decoder.mid_block.resnets.1", "decoder.mid.res_out"),
        ("decoder.up_blocks.{n}.resnets.{n}.conv_shortcut", "decoder.stages.{n}.blocks.{n}.skip"),
        ("decoder.up_blocks.{n}.resnets.{n}", "decoder.stages.{n}.blocks.{n}"),
        ("decoder.up_blocks.{n}.upsamplers.0.resample.1", "decoder.stages.{n}.up.spatial"),
        ("decoder.up_blocks.{n}.upsamplers.0.time_conv", "decoder.stages.{n}.up.temporal"),
    )
)
