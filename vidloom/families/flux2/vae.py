"""The Flux2 image VAE: a 2D conv encoder/decoder with batch-norm statistics over patchified latents.

Loads diffusers `AutoencoderKLFlux2` checkpoints through FLUX2_VAE_NAME_MAP. Encoding returns the
posterior mean (what the Klein pipeline uses for reference images); decoding returns [-1, 1] pixels,
whole or (`tiling`) in overlapping spatial tiles blended at the seams, diffusers' `tiled_decode` rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.attention import attention
from vidloom.layers.memory_format import channels_last, use_channels_last
from vidloom.layers.tiling import SpatialTiling, decode_tiles_2d
from vidloom.loading.config_keys import check_class_name, read_key, strict_bool
from vidloom.loading.key_policy import KeyPolicy
from vidloom.loading.name_map import NameMap

GROUP_NORM_EPS = 1e-6  # diffusers' Encoder/Decoder ResNet and attention groupnorm eps


DIFFUSERS_CLASS_NAME = "AutoencoderKLFlux2"
# Every AutoencoderKLFlux2.__init__ argument since its first release (diffusers 0.36.0, 2025-11-25). The block
# types and act_fn are read and checked (one value each).
CONFIG_KEYS = frozenset({
    "in_channels", "out_channels", "down_block_types", "up_block_types", "block_out_channels",
    "decoder_block_out_channels", "layers_per_block", "act_fn", "latent_channels", "norm_num_groups",
    "use_quant_conv", "use_post_quant_conv", "mid_block_add_attention", "batch_norm_eps", "patch_size",
})
FLUX2_VAE_POLICY = KeyPolicy(CONFIG_KEYS, harmless={
    "sample_size": "sizes only diffusers' default decode tiles; ours come from the deployment's vae_tile",
    "batch_norm_momentum": "moves the latent statistics only while training",
    # diffusers 0.36.0 (#12711, 2025-11-25) until after 2026-08, not in 0.42.1; the published FLUX.2-klein-4B/9B
    # vae/config.json carry it. diffusers' pipelines upcast a float16 VAE to float32 when it is true.
    "force_upcast": "a float16 precision hint for diffusers' pipelines; the card's VAE dtype sets ours",
})


@dataclass(frozen=True)
class Flux2VAEConfig:
    in_channels: int = 3
    out_channels: int = 3
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    decoder_block_out_channels: tuple[int, ...] | None = None
    layers_per_block: int = 2
    latent_channels: int = 32
    norm_num_groups: int = 32
    use_quant_conv: bool = True
    use_post_quant_conv: bool = True
    mid_attention: bool = True
    batch_norm_eps: float = 1e-4
    patch_size: tuple[int, int] = (2, 2)

    @property
    def spatial_factor(self) -> int:
        """Pixels per latent cell (before the 2x2 patchify)."""
        return 2 ** (len(self.block_out_channels) - 1)

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> Flux2VAEConfig:
        where = "VAE config"
        check_class_name(cfg, (DIFFUSERS_CLASS_NAME,), where)
        FLUX2_VAE_POLICY.check(cfg, where)
        for key, allowed in (("down_block_types", "DownEncoderBlock2D"), ("up_block_types", "UpDecoderBlock2D")):
            kinds = set(cfg.get(key, [allowed]))
            if kinds != {allowed}:
                raise ValueError(f"{key} {sorted(kinds)} is not supported; expected only {allowed}")
        if cfg.get("act_fn", "silu") != "silu":
            raise ValueError(f"act_fn {cfg['act_fn']!r} is not supported; expected 'silu'")
        decoder = cfg.get("decoder_block_out_channels")
        return cls(
            in_channels=int(cfg.get("in_channels", 3)),
            out_channels=int(cfg.get("out_channels", 3)),
            block_out_channels=tuple(int(c) for c in cfg.get("block_out_channels", (128, 256, 512, 512))),
            decoder_block_out_channels=tuple(int(c) for c in decoder) if decoder else None,
            layers_per_block=int(cfg.get("layers_per_block", 2)),
            latent_channels=int(cfg.get("latent_channels", 32)),
            norm_num_groups=int(cfg.get("norm_num_groups", 32)),
            use_quant_conv=read_key(cfg, "use_quant_conv", True, strict_bool, where),
            use_post_quant_conv=read_key(cfg, "use_post_quant_conv", True, strict_bool, where),
            mid_attention=read_key(cfg, "mid_block_add_attention", True, strict_bool, where),
            batch_norm_eps=float(cfg.get("batch_norm_eps", 1e-4)),
            patch_size=tuple(int(p) for p in cfg.get("patch_size", (2, 2))),
        )


# diffusers names are kept for the conv trunk (they are already per-layer data); only the
# pieces we restructure are renamed.
FLUX2_VAE_NAME_MAP = NameMap(
    (
        ("encoder.mid_block.attentions.0", "encoder.mid_attn"),
        ("decoder.mid_block.attentions.0", "decoder.mid_attn"),
        ("encoder.mid_block.resnets.{n}", "encoder.mid_resnets.{n}"),
        ("decoder.mid_block.resnets.{n}", "decoder.mid_resnets.{n}"),
        ("encoder.down_blocks.{n}.downsamplers.0.conv", "encoder.down_blocks.{n}.downsample"),
        ("decoder.up_blocks.{n}.upsamplers.0.conv", "decoder.up_blocks.{n}.upsample"),
        ("bn.running_mean", "latent_mean"),
        ("bn.running_var", "latent_var"),
        ("bn.num_batches_tracked", "latent_count"),
    )
)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, groups: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin, eps=GROUP_NORM_EPS)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, cout, eps=GROUP_NORM_EPS)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.conv_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (x if self.conv_shortcut is None else self.conv_shortcut(x)) + h


class SpatialAttention(nn.Module):
    """Single-head self-attention over all pixels of a feature map, with a residual."""

    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.group_norm = nn.GroupNorm(groups, channels, eps=GROUP_NORM_EPS)
        self.to_q = nn.Linear(channels, channels)
        self.to_k = nn.Linear(channels, channels)
        self.to_v = nn.Linear(channels, channels)
        self.to_out = nn.ModuleList([nn.Linear(channels, channels)])

    def forward(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        tokens = self.group_norm(x).flatten(2).transpose(1, 2)  # [B, HW, C]
        q, k, v = (proj(tokens)[:, :, None, :] for proj in (self.to_q, self.to_k, self.to_v))
        out = self.to_out[0](attention(q, k, v)[:, :, 0, :])
        return x + out.transpose(1, 2).reshape(b, c, h, w)


class _Stage(nn.Module):
    def __init__(self, channels: list[tuple[int, int]], groups: int) -> None:
        super().__init__()
        self.resnets = nn.ModuleList(ResnetBlock(cin, cout, groups) for cin, cout in channels)


class Encoder(nn.Module):
    def __init__(self, cfg: Flux2VAEConfig) -> None:
        super().__init__()
        chans, g = cfg.block_out_channels, cfg.norm_num_groups
        self.conv_in = nn.Conv2d(cfg.in_channels, chans[0], 3, padding=1)
        self.down_blocks = nn.ModuleList()
        prev = chans[0]
        for i, c in enumerate(chans):
            stage = _Stage([(prev if j == 0 else c, c) for j in range(cfg.layers_per_block)], g)
            if i < len(chans) - 1:
                stage.downsample = nn.Conv2d(c, c, 3, stride=2)
            self.down_blocks.append(stage)
            prev = c
        self.mid_resnets = nn.ModuleList([ResnetBlock(prev, prev, g), ResnetBlock(prev, prev, g)])
        self.mid_attn = SpatialAttention(prev, g) if cfg.mid_attention else None
        self.conv_norm_out = nn.GroupNorm(g, prev, eps=GROUP_NORM_EPS)
        self.conv_out = nn.Conv2d(prev, 2 * cfg.latent_channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv_in(x)
        for stage in self.down_blocks:
            for resnet in stage.resnets:
                x = resnet(x)
            if hasattr(stage, "downsample"):
                # Asymmetric pad (right/bottom only) before the stride-2 conv, as the reference does.
                x = stage.downsample(F.pad(x, (0, 1, 0, 1)))
        x = _mid(x, self.mid_resnets, self.mid_attn)
        return self.conv_out(F.silu(self.conv_norm_out(x)))


class Decoder(nn.Module):
    def __init__(self, cfg: Flux2VAEConfig) -> None:
        super().__init__()
        chans = list(reversed(cfg.decoder_block_out_channels or cfg.block_out_channels))
        g = cfg.norm_num_groups
        self.conv_in = nn.Conv2d(cfg.latent_channels, chans[0], 3, padding=1)
        self.mid_resnets = nn.ModuleList([ResnetBlock(chans[0], chans[0], g), ResnetBlock(chans[0], chans[0], g)])
        self.mid_attn = SpatialAttention(chans[0], g) if cfg.mid_attention else None
        self.up_blocks = nn.ModuleList()
        prev = chans[0]
        for i, c in enumerate(chans):
            stage = _Stage([(prev if j == 0 else c, c) for j in range(cfg.layers_per_block + 1)], g)
            if i < len(chans) - 1:
                stage.upsample = nn.Conv2d(c, c, 3, padding=1)
            self.up_blocks.append(stage)
            prev = c
        self.conv_norm_out = nn.GroupNorm(g, prev, eps=GROUP_NORM_EPS)
        self.conv_out = nn.Conv2d(prev, cfg.out_channels, 3, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        x = _mid(self.conv_in(z), self.mid_resnets, self.mid_attn)
        for stage in self.up_blocks:
            for resnet in stage.resnets:
                x = resnet(x)
            if hasattr(stage, "upsample"):
                x = stage.upsample(F.interpolate(x, scale_factor=2.0, mode="nearest"))
        return self.conv_out(F.silu(self.conv_norm_out(x)))


def _mid(x: Tensor, resnets: nn.ModuleList, attn: SpatialAttention | None) -> Tensor:
    x = resnets[0](x)
    if attn is not None:
        x = attn(x)
    return resnets[1](x)


class Flux2VAE(nn.Module):
    """Image <-> normalized, patchified latents [B, 4 * latent_channels, H / 16, W / 16]."""

    def __init__(self, config: Flux2VAEConfig) -> None:
        super().__init__()
        self.config = config
        zc = config.latent_channels
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.quant_conv = nn.Conv2d(2 * zc, 2 * zc, 1) if config.use_quant_conv else None
        self.post_quant_conv = nn.Conv2d(zc, zc, 1) if config.use_post_quant_conv else None
        patched = zc * config.patch_size[0] * config.patch_size[1]
        # Running statistics of the patchified latents (a BatchNorm2d's buffers in the checkpoint).
        self.register_buffer("latent_mean", torch.zeros(patched))
        self.register_buffer("latent_var", torch.ones(patched))
        self.register_buffer("latent_count", torch.zeros((), dtype=torch.long))
        use_channels_last(self)

    def _dtype(self) -> torch.dtype:
        return self.decoder.conv_in.weight.dtype

    def _stats(self, like: Tensor) -> tuple[Tensor, Tensor]:
        mean = self.latent_mean.view(1, -1, 1, 1).to(like.device, like.dtype)
        std = torch.sqrt(self.latent_var.view(1, -1, 1, 1) + self.config.batch_norm_eps).to(like.device, like.dtype)
        return mean, std

    def encode(self, image: Tensor) -> Tensor:
        """[B, 3, H, W] in [-1, 1] -> normalized patchified latents (posterior mean)."""
        moments = self.encoder(channels_last(image.to(self._dtype())))
        if self.quant_conv is not None:
            moments = self.quant_conv(moments)
        # The statistics apply in float32 whatever the weights' dtype (bfloat16 on the CPU fast path).
        latents = patchify(moments[:, : self.config.latent_channels].float())
        mean, std = self._stats(latents)
        return (latents - mean) / std

    def decode(self, latents: Tensor, tiling: SpatialTiling | None = None) -> Tensor:
        """Normalized patchified latents -> [B, 3, H, W] in about [-1, 1].

        With `tiling` (pixels; multiples of `config.spatial_factor`), the unpatchified latent is decoded in
        overlapping tiles blended at the seams, as diffusers' AutoencoderKLFlux2.tiled_decode does (its
        `tile_sample_min_size` T and overlap 0.25 are tile=T, stride=3T/4 here): peak memory follows the tile.
        """
        mean, std = self._stats(latents)
        z = channels_last(unpatchify(latents * std + mean)).to(self._dtype())
        if tiling is None:
            return self._decode_raw(z)
        return decode_tiles_2d(z, self._decode_raw, tiling, self.config.spatial_factor)

    def _decode_raw(self, z: Tensor) -> Tensor:
        if self.post_quant_conv is not None:
            z = self.post_quant_conv(z)
        return self.decoder(z)


def patchify(x: Tensor) -> Tensor:
    """[B, C, H, W] -> [B, 4C, H/2, W/2], channel-major over each 2x2 cell (the pipeline's layout)."""
    b, c, h, w = x.shape
    return x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(b, c * 4, h // 2, w // 2)


def unpatchify(x: Tensor) -> Tensor:
    b, c, h, w = x.shape
    return x.reshape(b, c // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3).reshape(b, c // 4, h * 2, w * 2)
