"""Tiny Wan2.2 checkpoints written by diffusers + transformers: TI2V-5B's layout (48-channel-style
residual VAE, per-token timesteps) and A14B's two experts switched at a boundary."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.helpers.wan_checkpoints import TinyWan, _scheduler_kwargs, reference_parts, reference_transformer, wan_dit

# The TI2V-5B VAE layout at a tiny width: residual stages, 2x2 patching, a wider decoder.
TI2V_VAE = dict(base_dim=8, decoder_base_dim=12, z_dim=6, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                attn_scales=[], temperal_downsample=[False, True, True], dropout=0.0, is_residual=True,
                patch_size=2, in_channels=12, out_channels=12, scale_factor_spatial=16, scale_factor_temporal=4)
TINY_TI2V = TinyWan(
    name="tiny-ti2v",
    transformer=wan_dit(heads=2, head_dim=12, channels=6, ffn_dim=32, layers=2, freq_dim=16),
    vae=TI2V_VAE,
)
TINY_TI2V_B = TinyWan(
    name="tiny-ti2v-b",
    transformer=wan_dit(heads=3, head_dim=8, channels=8, ffn_dim=40, layers=3, freq_dim=32, cross_attn_norm=False),
    vae=dict(TI2V_VAE, base_dim=8, decoder_base_dim=None, z_dim=8, dim_mult=[1, 2, 4, 4]),
)


def _common(spec: TinyWan, seed: int):
    from diffusers import UniPCMultistepScheduler

    scheduler = UniPCMultistepScheduler(**{**_scheduler_kwargs(), "flow_shift": 5.0})
    return dict(reference_parts(spec, seed, vae_seed=seed + 1), scheduler=scheduler)


def _transformer(kwargs: dict, seed: int, time_scale: float = 1.0):
    transformer = reference_transformer(kwargs, seed)
    if time_scale != 1.0:
        # Random init barely reacts to the timestep; amplify it so per-token timesteps matter.
        with torch.no_grad():
            for name, p in transformer.named_parameters():
                if "time_embedder" in name or "time_proj" in name:
                    p.mul_(time_scale)
    return transformer


def write_tiny_ti2v(folder: Path, spec: TinyWan = TINY_TI2V, seed: int = 0) -> Path:
    """A WanPipeline folder with expand_timesteps=True, as the official TI2V-5B repo ships."""
    from diffusers import WanPipeline

    pipe = WanPipeline(**_common(spec, seed), transformer=_transformer(spec.transformer, seed, 3.0),
                       expand_timesteps=True)
    pipe.save_pretrained(str(folder))
    return folder


def write_tiny_a14b(folder: Path, spec: TinyWan, boundary_ratio: float = 0.875, seed: int = 0) -> Path:
    """A WanPipeline folder with two T2V experts (`transformer` high-noise, `transformer_2` low-noise)."""
    from diffusers import WanPipeline

    pipe = WanPipeline(**_common(spec, seed), transformer=_transformer(spec.transformer, seed),
                       transformer_2=_transformer(spec.transformer, seed + 10), boundary_ratio=boundary_ratio)
    pipe.save_pretrained(str(folder))
    return folder


def write_tiny_a14b_i2v(folder: Path, spec: TinyWan, boundary_ratio: float = 0.9, seed: int = 0) -> Path:
    """A WanImageToVideoPipeline folder laid out as Wan2.2-I2V-A14B-Diffusers: two I2V experts (noise + 4 mask +
    first-frame latent channels in), no CLIP image encoder, boundary_ratio 0.9 (the published I2V value)."""
    from diffusers import WanImageToVideoPipeline

    z = spec.vae["z_dim"]
    kwargs = {**spec.transformer, "in_channels": 2 * z + 4, "out_channels": z}
    pipe = WanImageToVideoPipeline(**_common(spec, seed), image_processor=None, image_encoder=None,
                                   transformer=_transformer(kwargs, seed), transformer_2=_transformer(kwargs, seed + 10),
                                   boundary_ratio=boundary_ratio)
    pipe.save_pretrained(str(folder))
    return folder
