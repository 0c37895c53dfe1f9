"""Qwen-Image transformer config keys: Qwen/Qwen-Image's published transformer/config.json loads (its
`pooled_projection_dim`, which diffusers' class ignores, included); a variant we have no code for is refused."""

from __future__ import annotations

import pytest

from vidloom.core.errors import CheckpointError
from vidloom.families.qwen_image.transformer import TRANSFORMER_POLICY

# Qwen/Qwen-Image transformer/config.json as published.
PUBLISHED = {"_class_name": "QwenImageTransformer2DModel", "_diffusers_version": "0.34.0.dev0",
             "attention_head_dim": 128, "axes_dims_rope": [16, 56, 56], "guidance_embeds": False, "in_channels": 64,
             "joint_attention_dim": 3584, "num_attention_heads": 24, "num_layers": 60, "out_channels": 16,
             "patch_size": 2, "pooled_projection_dim": 768}


def test_the_published_config_loads():
    TRANSFORMER_POLICY.check(PUBLISHED, "transformer/config.json")


def test_a_variant_without_code_is_refused_by_name():
    with pytest.raises(CheckpointError, match="zero_cond_t"):
        TRANSFORMER_POLICY.check({**PUBLISHED, "zero_cond_t": True}, "transformer/config.json")
