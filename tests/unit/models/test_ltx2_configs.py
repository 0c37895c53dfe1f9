"""Reading LTX-2 video VAE / latent upsampler config.json files: what is accepted and what is refused by name."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
from diffusers import AutoencoderKLLTX2Video
from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel

from tests.helpers.ltx2_vae_fixtures import VAE_A, VAE_A_TIMESTEP, VAE_B
from vidloom.core.errors import CheckpointError
from vidloom.models.ltx2.checkpoint import load_latent_upsampler, load_video_vae
from vidloom.models.ltx2.upsampler import LTX2LatentUpsamplerConfig
from vidloom.models.ltx2.video_vae import LTX2VideoVAEConfig


def _signature_defaults(cls: type) -> dict:
    return {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
            if name != "self" and p.default is not inspect.Parameter.empty}


def test_vae_defaults_are_diffusers_defaults_with_ltx2_ratios() -> None:
    # diffusers' defaults are the LTX-2 layout; its published config states the 32x / 8x ratios.
    published = {**_signature_defaults(AutoencoderKLLTX2Video), "spatial_compression_ratio": 32,
                 "temporal_compression_ratio": 8, "_class_name": "AutoencoderKLLTX2Video"}
    config = LTX2VideoVAEConfig.from_diffusers(published)
    assert config == LTX2VideoVAEConfig()
    assert (config.spatial_compression_ratio, config.temporal_compression_ratio) == (32, 8)


@pytest.mark.parametrize("spec", [VAE_A, VAE_A_TIMESTEP, VAE_B], ids=lambda s: s.name)
def test_vae_config_round_trips(spec) -> None:
    config = LTX2VideoVAEConfig.from_diffusers(spec.config)
    assert LTX2VideoVAEConfig.from_diffusers(config.to_diffusers()) == config


def test_vae_ratios_are_derived_when_absent() -> None:
    cfg = {k: v for k, v in VAE_B.config.items() if not k.endswith("compression_ratio")}
    config = LTX2VideoVAEConfig.from_diffusers(cfg)
    assert (config.spatial_compression_ratio, config.temporal_compression_ratio) == (32, 4)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"attention_heads": 4}, r"unsupported config key\(s\) attention_heads"),
        ({"downsample_type": ["spatial", "temporal", "pixel", "spatial"]}, "downsample_type entry 'pixel'"),
        ({"upsample_type": ["spatial", "spatial"]}, "upsample_type has 2 entries, expected 3"),
        ({"down_block_types": ["LTXVideoDownBlock3D"] * 4}, "down_block_types entry 'LTXVideoDownBlock3D'"),
        ({"patch_size_t": 2}, "patch_size_t=2 is not supported"),
        ({"spatial_compression_ratio": 64}, "spatial_compression_ratio=64, but the encoder's strides give 32"),
        ({"temporal_compression_ratio": 16}, "temporal_compression_ratio=16, but the encoder's strides give 8"),
        ({"decoder_spatial_padding_mode": "wrap"}, "decoder_spatial_padding_mode='wrap'"),
        ({"layers_per_block": [1, 1, 1]}, "layers_per_block has 3 entries, expected 5"),
        ({"decoder_inject_noise": [True, False]}, "decoder_inject_noise has 2 entries, expected 4"),
        ({"upsample_type": ["spatial", "spatiotemporal", "spatiotemporal"]}, "upsample 32x4 .* downsamples 32x8"),
        ({"block_out_channels": [8, -16, 32, 32]}, "block_out_channels=.* positive integers"),
        ({"timestep_conditioning": "false"}, "timestep_conditioning='false' should be a bool"),
        ({"scaling_factor": None}, "scaling_factor=None should be a float"),
    ],
)
def test_vae_config_refuses_by_key(change: dict, message: str) -> None:
    with pytest.raises(CheckpointError, match=message):
        LTX2VideoVAEConfig.from_diffusers({**VAE_A.config, **change})


def test_vae_refuses_timestep_conditioning_with_width_changing_up_blocks() -> None:
    with pytest.raises(CheckpointError, match="width-changing up block"):
        LTX2VideoVAEConfig.from_diffusers({**VAE_B.config, "timestep_conditioning": True})


def test_upsampler_defaults_are_diffusers_defaults() -> None:
    assert LTX2LatentUpsamplerConfig.from_diffusers(_signature_defaults(LTX2LatentUpsamplerModel)) == \
        LTX2LatentUpsamplerConfig()


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"upsample_mode": "nearest"}, r"unsupported config key\(s\) upsample_mode"),
        ({"dims": 1}, "dims=1 is not supported"),
        ({"spatial_upsample": False, "temporal_upsample": False}, "both false"),
        ({"dims": 2, "temporal_upsample": True}, "temporal_upsample needs dims=3"),
        ({"rational_spatial_scale": 3.0}, "rational_spatial_scale=3.0 is not supported"),
        ({"mid_channels": 48}, "mid_channels=48 is not a multiple of 32"),
        ({"mid_channels": "64"}, "mid_channels='64' should be a int"),
        ({"spatial_upsample": 1}, "spatial_upsample=1 should be a bool"),
    ],
)
def test_upsampler_config_refuses_by_key(cfg: dict, message: str) -> None:
    with pytest.raises(CheckpointError, match=message):
        LTX2LatentUpsamplerConfig.from_diffusers(cfg)


def test_loaders_refuse_the_wrong_component(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKLWan"}))
    with pytest.raises(CheckpointError, match="_class_name is 'AutoencoderKLWan', expected 'AutoencoderKLLTX2Video'"):
        load_video_vae(tmp_path)
    with pytest.raises(CheckpointError, match="expected 'LTX2LatentUpsamplerModel'"):
        load_latent_upsampler(tmp_path)


def test_loader_names_the_folder_of_a_bad_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**VAE_A.config, "patch_size_t": 2}))
    with pytest.raises(CheckpointError, match=rf"{tmp_path}: video VAE config.json: patch_size_t=2"):
        load_video_vae(tmp_path)
