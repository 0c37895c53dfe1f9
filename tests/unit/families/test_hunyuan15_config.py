"""HunyuanVideo-1.5 config reading: the published transformer config's keys, refusals naming the key, the guider's
CFG window, the aspect buckets, glyph prompts, and a bfloat16 forward that stays near the float32 one."""

from __future__ import annotations

import pytest
import torch

from vidloom.core.errors import CheckpointError
from vidloom.loading.precision import cast_module
from vidloom.families.hunyuan15.schedule import Hunyuan15Guider, Hunyuan15Schedule
from vidloom.families.hunyuan15.sizes import closest_bucket
from vidloom.families.hunyuan15.text import glyph_text
from vidloom.families.hunyuan15.transformer import Hunyuan15Transformer, Hunyuan15TransformerConfig

# The 480p text-to-video transformer/config.json as published (written by diffusers 0.36.0.dev0).
PUBLISHED_480P_T2V = {
    "_class_name": "HunyuanVideo15Transformer3DModel", "_diffusers_version": "0.36.0.dev0", "attention_head_dim": 128,
    "image_embed_dim": 1152, "in_channels": 65, "mlp_ratio": 4.0, "num_attention_heads": 16, "num_layers": 54,
    "num_refiner_layers": 2, "out_channels": 32, "patch_size": 1, "patch_size_t": 1, "qk_norm": "rms_norm",
    "rope_axes_dim": [16, 56, 56], "rope_theta": 256.0, "target_size": 640, "task_type": "t2v",
    "text_embed_2_dim": 1472, "text_embed_dim": 3584, "use_meanflow": False,
}


def test_the_published_transformer_config_reads_every_key():
    config = Hunyuan15TransformerConfig.from_diffusers(PUBLISHED_480P_T2V)
    assert (config.dim, config.latent_channels, config.rope_axes, config.target_size) == (2048, 32, (16, 56, 56), 640)
    assert (config.text_dim, config.glyph_dim, config.image_dim, config.use_meanflow) == (3584, 1472, 1152, False)


@pytest.mark.parametrize(("key", "value"), [("qk_norm", "layer_norm"), ("guidance_embeds", True)])
def test_a_key_needing_other_code_is_refused_by_name(key, value):
    with pytest.raises((CheckpointError, ValueError), match=key):
        Hunyuan15TransformerConfig.from_diffusers({**PUBLISHED_480P_T2V, key: value})


def test_the_guider_window_and_scale_decide_each_step():
    guider = Hunyuan15Guider.from_diffusers({"_class_name": "ClassifierFreeGuidance", "guidance_scale": 6.0,
                                             "start": 0.25, "stop": 0.75})
    assert [guider.cfg_at(i, 8, 6.0) for i in range(8)] == [False, False, True, True, True, True, False, False]
    assert not guider.cfg_at(3, 8, 1.0)  # scale 1: the conditional prediction alone


def test_the_schedule_shifts_linear_sigmas():
    sigmas = Hunyuan15Schedule.from_diffusers({"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 5.0}).sigmas(4)
    expected = torch.tensor([1.0, 0.9375, 0.8333333, 0.625, 0.0])
    assert torch.allclose(sigmas, expected, atol=1e-6)


def test_default_sizes_are_the_16_9_buckets():
    assert closest_bucket(9, 16, 640, 16) == (480, 848)
    assert closest_bucket(9, 16, 960, 16) == (720, 1280)


def test_only_quoted_text_reaches_the_glyph_encoder():
    assert glyph_text("a plain prompt") is None
    assert glyph_text('say "hi" and \u201cbye\u201d, "hi" again') == 'Text "hi". Text "bye". '


def test_a_bfloat16_forward_stays_near_the_float32_one():
    torch.manual_seed(0)
    config = Hunyuan15TransformerConfig(in_channels=9, out_channels=4, num_heads=2, head_dim=16, num_layers=2,
                                        num_refiner_layers=1, text_dim=24, glyph_dim=20, image_dim=12,
                                        rope_axes=(4, 6, 6))
    model = Hunyuan15Transformer(config).eval()
    half = Hunyuan15Transformer(config).eval()
    half.load_state_dict(model.state_dict())
    cast_module(half, torch.bfloat16, Hunyuan15Transformer.KEEP_FP32)
    args = (torch.randn(1, 9, 2, 4, 4), torch.tensor([500.0]), torch.randn(1, 5, 24), torch.ones(1, 5),
            torch.randn(1, 3, 20), torch.ones(1, 3))
    with torch.inference_mode():
        full, low = model(*args), half(*args)
    assert low.dtype == torch.float32 and torch.isfinite(low).all()
    assert (low - full).abs().max().item() < 0.05 * full.abs().max().item()
