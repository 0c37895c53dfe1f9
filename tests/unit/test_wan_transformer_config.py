"""WanTransformerConfig: reading diffusers configs, rejecting what we cannot run, and shape checks."""

from __future__ import annotations

import pytest
import torch

from vidloom.core.errors import CheckpointError
from vidloom.models.wan.transformer import WanTransformer
from vidloom.models.wan.transformer_config import WanTransformerConfig

# transformer/config.json of Wan-AI/Wan2.1-T2V-1.3B-Diffusers, as published.
WAN21_T2V_1_3B = {
    "_class_name": "WanTransformer3DModel",
    "_diffusers_version": "0.33.0.dev0",
    "added_kv_proj_dim": None,
    "attention_head_dim": 128,
    "cross_attn_norm": True,
    "eps": 1e-06,
    "ffn_dim": 8960,
    "freq_dim": 256,
    "image_dim": None,
    "in_channels": 16,
    "num_attention_heads": 12,
    "num_layers": 30,
    "out_channels": 16,
    "patch_size": [1, 2, 2],
    "qk_norm": "rms_norm_across_heads",
    "rope_max_seq_len": 1024,
    "text_dim": 4096,
}


def test_reads_published_t2v_config() -> None:
    config = WanTransformerConfig.from_diffusers(WAN21_T2V_1_3B)
    assert config.patch_size == (1, 2, 2)
    assert config.inner_dim == 1536
    assert config.num_layers == 30
    exported = config.to_diffusers()
    assert {k: v for k, v in exported.items() if v is not None} == {
        k: v for k, v in WAN21_T2V_1_3B.items() if v is not None and k != "_diffusers_version"
    }


def test_missing_fields_take_diffusers_defaults() -> None:
    config = WanTransformerConfig.from_diffusers({"out_channels": None, "in_channels": 8})
    assert config == WanTransformerConfig(in_channels=8, out_channels=8)


def test_image_conditioning_fields_are_read_and_written_back() -> None:
    i2v = {**WAN21_T2V_1_3B, "in_channels": 36, "image_dim": 1280, "added_kv_proj_dim": 1536, "pos_embed_seq_len": 514}
    config = WanTransformerConfig.from_diffusers(i2v)
    assert (config.image_dim, config.added_kv_proj_dim, config.pos_embed_seq_len) == (1280, 1536, 514)
    assert config.takes_image and config.out_channels == 16
    assert WanTransformerConfig.from_diffusers(config.to_diffusers()) == config


@pytest.mark.parametrize(
    ("fields", "message"),
    [({"image_dim": 1280}, "set together"), ({"added_kv_proj_dim": 1536}, "set together"),
     ({"pos_embed_seq_len": 514}, "needs image_dim")],
)
def test_half_configured_image_conditioning_is_rejected(fields: dict, message: str) -> None:
    with pytest.raises(CheckpointError, match=message):
        WanTransformerConfig.from_diffusers({**WAN21_T2V_1_3B, **fields})


def test_unsupported_qk_norm_and_class_are_rejected() -> None:
    with pytest.raises(CheckpointError, match="qk_norm='layer_norm'"):
        WanTransformerConfig.from_diffusers({**WAN21_T2V_1_3B, "qk_norm": "layer_norm"})
    with pytest.raises(CheckpointError, match="_class_name='WanVACETransformer3DModel'"):
        WanTransformerConfig.from_diffusers({**WAN21_T2V_1_3B, "_class_name": "WanVACETransformer3DModel"})
    with pytest.raises(CheckpointError, match="attention_head_dim"):
        WanTransformerConfig.from_diffusers({**WAN21_T2V_1_3B, "attention_head_dim": 127})


def test_config_is_frozen_and_hashable() -> None:
    config = WanTransformerConfig.from_diffusers(WAN21_T2V_1_3B)
    with pytest.raises(AttributeError):
        config.num_layers = 2  # type: ignore[misc]
    assert hash(config) == hash(WanTransformerConfig.from_diffusers(WAN21_T2V_1_3B))


def test_forward_rejects_latents_not_divisible_by_patch() -> None:
    config = WanTransformerConfig(
        num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
        text_dim=8, freq_dim=8, ffn_dim=16, num_layers=1,
    )
    model = WanTransformer(config)
    with pytest.raises(ValueError, match="not divisible by patch_size"):
        model(torch.zeros(1, 4, 2, 5, 4), torch.tensor([1.0]), torch.zeros(1, 3, 8))


def test_builds_on_meta_device() -> None:
    # Loaders build on meta and assign weights later; nothing may be computed at init.
    with torch.device("meta"):
        model = WanTransformer(WanTransformerConfig.from_diffusers(WAN21_T2V_1_3B))
    assert next(model.parameters()).is_meta
    assert not list(model.buffers())
