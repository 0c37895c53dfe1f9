"""LTX-2 transformer parity: our LTX2Transformer vs diffusers' LTX2VideoTransformer3DModel, one forward."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.ltx2_checkpoints import CONFIGS, TinyLTX2
from vidloom.core.errors import CheckpointError
from vidloom.loading.safetensors_io import load_weights
from vidloom.models.ltx2.rope import audio_positions, video_positions
from vidloom.models.ltx2.transformer import LTX2_TRANSFORMER_NAME_MAP, LTX2Positions, LTX2Transformer, \
    LTX2TransformerConfig

# fp32 on CPU; the bound for one forward. Observed differences are ~1e-7 (same op order).
TOLERANCE = 1e-5


def _pair(spec: TinyLTX2, tmp_path):
    from diffusers import LTX2VideoTransformer3DModel

    torch.manual_seed(3)
    ref = LTX2VideoTransformer3DModel(caption_channels=spec.text_hidden, **spec.transformer).eval()
    with torch.no_grad():  # random tables/gates so every modulation path carries signal
        for name, p in ref.named_parameters():
            if "table" in name or "gate" in name:
                p.normal_(0, 0.5)
    ref.save_pretrained(str(tmp_path))
    import json

    config = LTX2TransformerConfig.from_diffusers(json.loads((tmp_path / "config.json").read_text()))
    ours = LTX2Transformer(config).eval()
    load_weights(ours, tmp_path, LTX2_TRANSFORMER_NAME_MAP)
    return ref, ours


def _inputs(ours: LTX2Transformer, batch: int = 2, frames: int = 3, h: int = 2, w: int = 3, audio: int = 5):
    c = ours.config
    g = torch.Generator().manual_seed(0)
    video = torch.randn(batch, frames * h * w, c.in_channels, generator=g)
    aud = torch.randn(batch, audio, c.audio_in_channels, generator=g)
    text = torch.randn(batch, 8, c.caption_channels, generator=g)
    atext = torch.randn(batch, 8, c.caption_channels, generator=g)
    mask = torch.ones(batch, 8)
    mask[0, :3] = 0  # left padding on one prompt
    t = torch.tensor([900.0, 250.0])[:batch]
    vpos = video_positions(batch, frames, h, w, patch_t=1, patch=1, scale=c.vae_scale_factors,
                           causal_offset=c.causal_offset, fps=24.0, device=torch.device("cpu"))
    apos = audio_positions(batch, audio, patch_t=1, scale=c.audio_scale_factor, causal_offset=c.causal_offset,
                           hop_length=c.audio_hop_length, sample_rate=c.audio_sampling_rate, device=torch.device("cpu"))
    return video, aud, text, atext, mask, t, vpos, apos


@pytest.mark.parametrize("spec", CONFIGS, ids=lambda s: s.name)
@pytest.mark.parametrize("cross_timestep", [False, True])
def test_forward_matches_diffusers(spec, cross_timestep, tmp_path):
    ref, ours = _pair(spec, tmp_path)
    video, aud, text, atext, mask, t, vpos, apos = _inputs(ours)
    with torch.no_grad():
        rv, ra = ref(hidden_states=video, audio_hidden_states=aud, encoder_hidden_states=text,
                     audio_encoder_hidden_states=atext, timestep=t, sigma=t, encoder_attention_mask=mask,
                     audio_encoder_attention_mask=mask, video_coords=vpos, audio_coords=apos,
                     use_cross_timestep=cross_timestep, return_dict=False)
        ov, oa = ours(video, aud, text, atext, mask, t, t, t, LTX2Positions(vpos, apos),
                      use_cross_timestep=cross_timestep)
    assert rv.abs().max() > 0.1 and ra.abs().max() > 0.1
    assert (ov - rv).abs().max() < TOLERANCE
    assert (oa - ra).abs().max() < TOLERANCE


@pytest.mark.parametrize("spec", CONFIGS, ids=lambda s: s.name)
def test_per_token_timestep_isolation_and_stg_match(spec, tmp_path):
    """I2V's per-token video timesteps, modality isolation and spatio-temporal guidance's perturbed blocks."""
    ref, ours = _pair(spec, tmp_path)
    video, aud, text, atext, mask, t, vpos, apos = _inputs(ours)
    per_token = t[:, None].repeat(1, video.shape[1])
    per_token[:, :6] = 0.0  # the conditioning first frame
    with torch.no_grad():
        for isolate, stg in ((True, None), (False, [1])):
            rv, ra = ref(hidden_states=video, audio_hidden_states=aud, encoder_hidden_states=text,
                         audio_encoder_hidden_states=atext, timestep=per_token, audio_timestep=t, sigma=t,
                         encoder_attention_mask=mask, audio_encoder_attention_mask=mask, video_coords=vpos,
                         audio_coords=apos, isolate_modalities=isolate, spatio_temporal_guidance_blocks=stg,
                         return_dict=False)
            ov, oa = ours(video, aud, text, atext, mask, per_token, t, t, LTX2Positions(vpos, apos),
                          isolate_modalities=isolate, skip_self_attention=frozenset(stg or ()))
            assert (ov - rv).abs().max() < TOLERANCE
            assert (oa - ra).abs().max() < TOLERANCE


def test_unsupported_config_key_is_named():
    with pytest.raises(CheckpointError, match="use_keyframes_abs_pos_embedding=True is not supported"):
        LTX2TransformerConfig.from_diffusers({"use_keyframes_abs_pos_embedding": True})
    with pytest.raises(CheckpointError, match="unsupported config key\\(s\\) frobnicate"):
        LTX2TransformerConfig.from_diffusers({"frobnicate": 1})
    with pytest.raises(ValueError, match="rope_type"):
        LTX2TransformerConfig.from_diffusers({"rope_type": "spiral"})


def test_mis_shaped_checkpoint_is_a_checkpoint_error(tmp_path):
    ref, ours = _pair(CONFIGS[0], tmp_path)
    wrong = LTX2Transformer(LTX2TransformerConfig.from_diffusers({**dict(ref.config), "num_layers": 1}))
    with pytest.raises(CheckpointError, match="transformer_blocks.1"):
        load_weights(wrong, tmp_path, LTX2_TRANSFORMER_NAME_MAP)


@pytest.mark.parametrize("spec", CONFIGS, ids=lambda s: s.name)
def test_prepared_text_and_ropes_match_diffusers(spec, tmp_path):
    """A request's text keys/values and rotary tables computed once (LTX2Network reuses them across steps) give
    the reference's output; a mask that keeps every token is elided. A checkpoint with prompt AdaLN refuses."""
    ref, ours = _pair(spec, tmp_path)
    video, aud, text, atext, mask, t, vpos, apos = _inputs(ours)
    positions = LTX2Positions(vpos, apos)
    if not ours.static_text:
        with pytest.raises(ValueError, match="prompt AdaLN"):
            ours.prepare_text(text, atext, mask, torch.float32)
        return
    with torch.no_grad():
        for text_mask in (mask, torch.ones_like(mask)):
            prepared = ours.prepare_text(text, atext, text_mask, torch.float32)
            assert (prepared.mask is None) == bool(text_mask.all())
            assert len(prepared.video.keys) == len(prepared.audio.keys) == ours.num_blocks
            rv, ra = ref(hidden_states=video, audio_hidden_states=aud, encoder_hidden_states=text,
                         audio_encoder_hidden_states=atext, timestep=t, sigma=t, encoder_attention_mask=text_mask,
                         audio_encoder_attention_mask=text_mask, video_coords=vpos, audio_coords=apos,
                         return_dict=False)
            stream, cond = ours.embed(video, aud, text, atext, text_mask, t, t, t, positions,
                                      ropes=ours.rope_tables(positions), text=prepared)
            ov, oa = ours.head(ours.run_blocks(stream, cond), cond)
            assert (ov - rv).abs().max() < TOLERANCE
            assert (oa - ra).abs().max() < TOLERANCE


def test_only_perturbed_blocks_count():
    """STG perturbs a block only on a perturbed_attn checkpoint and only if the block exists (diffusers' rule)."""
    plain = LTX2Transformer(LTX2TransformerConfig(num_layers=2, num_attention_heads=1, attention_head_dim=8,
                                                  audio_num_attention_heads=1, audio_attention_head_dim=8,
                                                  audio_cross_attention_dim=8, cross_attention_dim=8,
                                                  caption_channels=8, in_channels=4, audio_in_channels=4))
    assert plain.perturbed_blocks({0, 1, 28}) == frozenset()
    perturbed = LTX2Transformer(LTX2TransformerConfig(**{**plain.config.__dict__, "perturbed_attn": True}))
    assert perturbed.perturbed_blocks({1, 28, -1}) == {1}
