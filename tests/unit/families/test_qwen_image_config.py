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
    with pytest.raises(CheckpointError, match="use_layer3d_rope"):
        TRANSFORMER_POLICY.check({**PUBLISHED, "use_layer3d_rope": True}, "transformer/config.json")


def test_qwen_image_edit_2511_s_zero_cond_t_is_read():
    from vidloom.families.qwen_image.transformer import QwenImageTransformerConfig

    assert QwenImageTransformerConfig.from_diffusers({**PUBLISHED, "zero_cond_t": True}).zero_cond_t
    assert not QwenImageTransformerConfig.from_diffusers(PUBLISHED).zero_cond_t


def test_one_step_under_a_terminal_stretch_is_refused_at_submit():
    """The stretch scales by 1 - sigma, and one step's only sigma is 1: 0 / 0, NaN latents in diffusers too."""
    from vidloom.core.errors import InvalidRequest
    from vidloom.core.request import GenerationRequest
    from vidloom.families.qwen_image.schedule import QwenImageSchedule

    stretched = QwenImageSchedule(shift_terminal=0.02)
    stretched.check(GenerationRequest(prompt="x", num_inference_steps=2))
    with pytest.raises(InvalidRequest, match="shift_terminal 0.02, which needs at least 2 steps") as err:
        stretched.check(GenerationRequest(prompt="x", num_inference_steps=1))
    assert err.value.field == "num_inference_steps"
    QwenImageSchedule().check(GenerationRequest(prompt="x", num_inference_steps=1))  # no stretch: one step runs
    assert bool(QwenImageSchedule().sigmas(1, 256).isfinite().all())
