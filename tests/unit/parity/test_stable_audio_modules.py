"""Stable Audio modules vs diffusers, component by component, on both tiny configs (same saved weights).

Tolerances: fp32 on CPU, the same operations in the same order; observed max differences are 0 to 1e-6, the
bound is 1e-5 (relative to outputs of order 1). A wrong rotary half, head grouping or Snake parameter moves
outputs by more than 1e-2.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.stable_audio_checkpoints import CONFIGS, load_reference, write_tiny_stable_audio
from vidloom.core.deploy import DeployConfig
from vidloom.registry import load_instance, resolve_card

TOLERANCE = 1e-5


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda spec: spec.name)
def pair(request, tmp_path_factory):
    folder = write_tiny_stable_audio(tmp_path_factory.mktemp(f"stable-audio-{request.param.name}"), request.param)
    ours = load_instance(resolve_card(folder), folder, torch.device("cpu"), None, DeployConfig())
    return load_reference(folder), ours, request.param


def _close(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return float((a - b).abs().max())


@torch.no_grad()
def test_transformer_matches_diffusers(pair):
    from diffusers.models.embeddings import get_1d_rotary_pos_embed

    pipe, ours, spec = pair
    cfg = pipe.transformer.config
    g = torch.Generator().manual_seed(5)
    latents = torch.randn(2, cfg.in_channels, cfg.sample_size, generator=g)
    text = torch.randn(2, 7, cfg.cross_attention_input_dim, generator=g)
    glob = torch.randn(2, 1, cfg.global_states_input_dim, generator=g)
    timestep = torch.tensor([0.7])
    rope = get_1d_rotary_pos_embed(cfg.attention_head_dim // 2, cfg.sample_size + 1, use_real=True,
                                   repeat_interleave_real=False)
    theirs = pipe.transformer(latents, timestep, encoder_hidden_states=text, global_hidden_states=glob,
                              rotary_embedding=rope, return_dict=False)[0]
    mine = ours["transformer"](latents, timestep, text, glob)
    assert _close(mine, theirs) < TOLERANCE
    # The timestep and the global token reach the output (a dropped path would leave it unchanged).
    assert _close(ours["transformer"](latents, torch.tensor([0.2]), text, glob), mine) > 1e-2
    assert _close(ours["transformer"](latents, timestep, text, glob.flip(0)), mine) > 1e-2


@torch.no_grad()
def test_vae_decoder_matches_diffusers(pair):
    pipe, ours, spec = pair
    latents = torch.randn(1, spec.vae["decoder_input_channels"], 9, generator=torch.Generator().manual_seed(2))
    theirs = pipe.vae.decode(latents).sample
    mine = ours["vae"].decode(latents)
    assert mine.shape == (1, spec.vae["audio_channels"], 9 * pipe.vae.hop_length)
    assert _close(mine, theirs) < TOLERANCE


@torch.no_grad()
def test_vae_encoder_matches_diffusers(pair):
    pipe, ours, spec = pair
    audio = torch.randn(1, spec.vae["audio_channels"], 64, generator=torch.Generator().manual_seed(4)) * 0.3
    theirs = pipe.vae.encode(audio).latent_dist.sample(torch.Generator().manual_seed(8))
    mine = ours["vae"].encode_sample(audio, torch.Generator().manual_seed(8))
    assert _close(mine, theirs) < TOLERANCE


@torch.no_grad()
def test_projection_and_text_match_pipeline(pair):
    pipe, ours, spec = pair
    for start, end in ((0.0, 0.5), (0.25, 1.75), (-1.0, 99.0)):  # the last is clamped on both sides
        theirs = pipe.encode_duration(start, end, torch.device("cpu"), False, 1)
        mine = ours["projection_model"].seconds(start, end, torch.device("cpu"))
        assert _close(mine[0], theirs[0]) < TOLERANCE and _close(mine[1], theirs[1]) < TOLERANCE
    prompt = "a dog barks"
    theirs = pipe.encode_prompt(prompt, torch.device("cpu"), False)
    mine = ours["text_encoder"].encode([prompt])
    assert _close(mine, theirs) < TOLERANCE
    # Padding positions are zero, as the pipeline masks them.
    assert float(mine[0, -1].abs().max()) == 0.0
