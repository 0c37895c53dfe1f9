"""Read and check a diffusers `AutoencoderKLLTX2Video` config.json into an LTX2VideoVAEConfig.

Every key diffusers accepts is either read or refused by name; a value our modules would run differently
from diffusers (or that diffusers itself cannot run) is a CheckpointError naming the key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from vidloom.core.errors import CheckpointError
from vidloom.loading.key_policy import KeyPolicy, Refusal
from vidloom.models.ltx2.video_vae_coders import DOWN_STRIDES, UP_STRIDES

if TYPE_CHECKING:
    from vidloom.models.ltx2.video_vae import LTX2VideoVAEConfig

PADDING_MODES = ("zeros", "reflect", "replicate", "circular")
SOURCE = "video VAE config.json"
# Keys read only to be checked against the fields (they carry no state of their own).
CHECKED_KEYS = ("down_block_types", "spatial_compression_ratio", "temporal_compression_ratio")
# diffusers' encoder runs only patch_size_t=1 (its patchify reshapes time by 1).
PATCH_SIZE_T = Refusal((1,), "diffusers' encoder only runs patch_size_t=1")


def video_vae_policy(fields: frozenset[str]) -> KeyPolicy:
    """AutoencoderKLLTX2Video has had the same __init__ keys since LTX-2's first diffusers release (2026-01), and
    convert_ltx2_to_diffusers.py writes only those: each is a field, a checked key or patch_size_t."""
    return KeyPolicy(fields | frozenset(CHECKED_KEYS), refused={"patch_size_t": PATCH_SIZE_T})


def read_diffusers_config(cls: type[LTX2VideoVAEConfig], cfg: Mapping[str, Any]) -> LTX2VideoVAEConfig:
    cls.policy().check(cfg, SOURCE)
    defaults = cls()
    encoder_blocks = len(_ints(cfg, "block_out_channels", defaults.block_out_channels))
    decoder_blocks = len(_ints(cfg, "decoder_block_out_channels", defaults.decoder_block_out_channels))
    values: dict[str, Any] = {
        "in_channels": read_scalar(cfg, "in_channels", int, defaults.in_channels),
        "out_channels": read_scalar(cfg, "out_channels", int, defaults.out_channels),
        "latent_channels": read_scalar(cfg, "latent_channels", int, defaults.latent_channels),
        "block_out_channels": _ints(cfg, "block_out_channels", defaults.block_out_channels),
        "decoder_block_out_channels": _ints(cfg, "decoder_block_out_channels", defaults.decoder_block_out_channels),
        "layers_per_block": _ints(cfg, "layers_per_block", defaults.layers_per_block, encoder_blocks + 1),
        "decoder_layers_per_block": _ints(cfg, "decoder_layers_per_block", defaults.decoder_layers_per_block,
                                          decoder_blocks + 1),
        # diffusers expands a bare bool to one entry per block (per block and the mid block for noise).
        "spatio_temporal_scaling": _flags(cfg, "spatio_temporal_scaling", defaults.spatio_temporal_scaling,
                                          encoder_blocks),
        "decoder_spatio_temporal_scaling": _flags(cfg, "decoder_spatio_temporal_scaling",
                                                  defaults.decoder_spatio_temporal_scaling, decoder_blocks),
        "decoder_inject_noise": _flags(cfg, "decoder_inject_noise", defaults.decoder_inject_noise, decoder_blocks + 1),
        "upsample_residual": _flags(cfg, "upsample_residual", defaults.upsample_residual, decoder_blocks),
        "downsample_type": _choices(cfg, "downsample_type", defaults.downsample_type, encoder_blocks, DOWN_STRIDES),
        "upsample_type": _choices(cfg, "upsample_type", defaults.upsample_type, decoder_blocks, UP_STRIDES),
        "upsample_factor": _ints(cfg, "upsample_factor", defaults.upsample_factor, decoder_blocks),
        "timestep_conditioning": read_scalar(cfg, "timestep_conditioning", bool, defaults.timestep_conditioning),
        "patch_size": read_scalar(cfg, "patch_size", int, defaults.patch_size),
        "resnet_norm_eps": read_scalar(cfg, "resnet_norm_eps", float, defaults.resnet_norm_eps),
        "scaling_factor": read_scalar(cfg, "scaling_factor", float, defaults.scaling_factor),
        "encoder_causal": read_scalar(cfg, "encoder_causal", bool, defaults.encoder_causal),
        "decoder_causal": read_scalar(cfg, "decoder_causal", bool, defaults.decoder_causal),
        "encoder_spatial_padding_mode": _padding(cfg, "encoder_spatial_padding_mode",
                                                 defaults.encoder_spatial_padding_mode),
        "decoder_spatial_padding_mode": _padding(cfg, "decoder_spatial_padding_mode",
                                                 defaults.decoder_spatial_padding_mode),
    }
    _check_block_types(cfg, encoder_blocks)
    config = cls(**values)
    _check_compression(config, cfg)
    _check_decoder(config)
    return config


def read_scalar(cfg: Mapping[str, Any], key: str, kind: type, default: Any, source: str = SOURCE) -> Any:
    """One int / float / bool entry; JSON strings or bools-for-numbers are refused rather than coerced."""
    value = cfg.get(key, default)
    if not isinstance(value, (int, float)) or (kind is bool) != isinstance(value, bool):
        raise CheckpointError(f"{source}: {key}={value!r} should be a {kind.__name__}")
    return kind(value)


def _ints(cfg: Mapping[str, Any], key: str, default: tuple[int, ...], length: int | None = None) -> tuple[int, ...]:
    value = cfg.get(key, default)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and v > 0 for v in value):
        raise CheckpointError(f"{SOURCE}: {key}={value!r} must be a list of positive integers")
    if length is not None and len(value) != length:
        raise CheckpointError(f"{SOURCE}: {key} has {len(value)} entries, expected {length}")
    return tuple(int(v) for v in value)


def _flags(cfg: Mapping[str, Any], key: str, default: tuple[bool, ...], length: int) -> tuple[bool, ...]:
    value = cfg.get(key, default)
    if isinstance(value, bool):
        return (value,) * length
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, bool) for v in value):
        raise CheckpointError(f"{SOURCE}: {key}={value!r} must be a bool or a list of bools")
    if len(value) != length:
        raise CheckpointError(f"{SOURCE}: {key} has {len(value)} entries, expected {length}")
    return tuple(value)


def _choices(cfg: Mapping[str, Any], key: str, default: tuple[str, ...], length: int,
             allowed: Mapping[str, Any]) -> tuple[str, ...]:
    value = tuple(cfg.get(key, default))
    for item in value:
        if item not in allowed:
            raise CheckpointError(f"{SOURCE}: {key} entry {item!r} is not supported (known: {', '.join(allowed)})")
    if len(value) != length:
        raise CheckpointError(f"{SOURCE}: {key} has {len(value)} entries, expected {length}")
    return value


def _padding(cfg: Mapping[str, Any], key: str, default: str) -> str:
    value = cfg.get(key, default)
    if value not in PADDING_MODES:
        raise CheckpointError(f"{SOURCE}: {key}={value!r} is not supported (known: {', '.join(PADDING_MODES)})")
    return str(value)


def _check_block_types(cfg: Mapping[str, Any], blocks: int) -> None:
    kinds = list(cfg.get("down_block_types", ["LTX2VideoDownBlock3D"] * blocks))
    odd = [k for k in kinds if k != "LTX2VideoDownBlock3D"]
    if odd:
        raise CheckpointError(f"{SOURCE}: down_block_types entry {odd[0]!r} is not supported "
                              f"(only LTX2VideoDownBlock3D)")
    if len(kinds) != blocks:
        raise CheckpointError(f"{SOURCE}: down_block_types has {len(kinds)} entries, expected {blocks}")


def _check_compression(config: LTX2VideoVAEConfig, cfg: Mapping[str, Any]) -> None:
    # diffusers falls back to patch_size * 2**sum(scaling) when the ratios are absent, which is wrong for
    # LTX-2's mixed spatial/temporal stages; we derive them from the strides and hold a stated value to it.
    for key, derived in (("spatial_compression_ratio", config.spatial_compression_ratio),
                         ("temporal_compression_ratio", config.temporal_compression_ratio)):
        stated = cfg.get(key)
        if stated is not None and int(stated) != derived:
            raise CheckpointError(f"{SOURCE}: {key}={stated}, but the encoder's strides give {derived}")


def _check_decoder(config: LTX2VideoVAEConfig) -> None:
    spatial, temporal = config.patch_size, 1
    for kind, on in zip(config.upsample_type, reversed(config.decoder_spatio_temporal_scaling)):
        if on:
            temporal, spatial = temporal * UP_STRIDES[kind][0], spatial * UP_STRIDES[kind][1]
    if (spatial, temporal) != (config.spatial_compression_ratio, config.temporal_compression_ratio):
        raise CheckpointError(
            f"{SOURCE}: upsample_type/decoder_spatio_temporal_scaling upsample {spatial}x{temporal} (space x time) "
            f"but the encoder downsamples {config.spatial_compression_ratio}x{config.temporal_compression_ratio}"
        )
    if config.timestep_conditioning:
        widths = tuple(reversed(config.decoder_block_out_channels))
        factors = tuple(reversed(config.upsample_factor))
        width = widths[0]
        for i, block_width in enumerate(widths):
            if width // factors[i] != block_width // factors[i]:
                raise CheckpointError(f"{SOURCE}: decoder_block_out_channels {list(config.decoder_block_out_channels)} "
                                      f"need a width-changing up block, which diffusers cannot timestep-condition")
            width = block_width // factors[i]
