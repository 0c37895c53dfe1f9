"""HunyuanVideo-1.5 text to video: the final latents of our program (text path, guider, schedule, loop) vs
HunyuanVideo15Pipeline(output_type="latent") on two tiny checkpoints saved by diffusers (the VAE is not run)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.hunyuan15_checkpoints import run_until_latents, write_pipeline
from vidloom.core.deploy import DeployConfig
from vidloom.core.instance import ModelInstance
from vidloom.core.request import GenerationRequest
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.families.hunyuan15.cards import card_from_checkpoint
from vidloom.families.hunyuan15.load import load_denoiser
from vidloom.families.hunyuan15.program import build_program

TOLERANCE = 2e-5  # measured <= 2.7e-6 on latents of ~3.5
CASES = {
    # quoted text (glyph tokens), the default negative prompt, CFG on every step
    "p1": dict(prompt='a cat holding a sign that says "hello"', negative_prompt=None, height=32, width=48,
               num_frames=9, num_inference_steps=4, seed=3),
    # no quotes in the prompt, a quoted negative prompt, CFG from step 1 with rescale, 2x2x2 patches
    "p2": dict(prompt="a red fox jumps over the lazy dog", negative_prompt='blurry "text"', height=32, width=64,
               num_frames=5, num_inference_steps=4, seed=5),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_latents_match_the_pipeline(name, tmp_path):
    pipe = write_pipeline(tmp_path, name)
    case = CASES[name]
    card = card_from_checkpoint(tmp_path)
    components = load_denoiser(DiffusersDir.open(tmp_path), torch.device("cpu"), torch.float32, DeployConfig())
    instance = ModelInstance(card=card, components=components, device=torch.device("cpu"), dtype=torch.float32,
                             checkpoint_dir=str(tmp_path))
    # The pipeline crops a fixed 108 template tokens (Qwen2.5-VL's own count); ours counts the tiny tokenizer's.
    pipe.prompt_template_encode_start_idx = components["text_encoder"].crop
    defaults = card.sampling_defaults
    request = GenerationRequest(**case, guidance_scale=defaults.guidance_scale, flow_shift=defaults.flow_shift)
    with torch.no_grad():
        expected = pipe(prompt=case["prompt"], negative_prompt=case["negative_prompt"], height=case["height"],
                        width=case["width"], num_frames=case["num_frames"],
                        num_inference_steps=case["num_inference_steps"],
                        generator=torch.Generator().manual_seed(case["seed"]), output_type="latent").frames
    got = run_until_latents(build_program(instance), request)
    assert got.shape == expected.shape
    diff = (got - expected).abs().max().item()
    assert diff < TOLERANCE, diff
    # The prompt moves the result: parity does not pass on an inert text path.
    other = run_until_latents(build_program(instance), GenerationRequest(**{**case, "prompt": "an empty room"},
                              guidance_scale=defaults.guidance_scale, flow_shift=defaults.flow_shift))
    assert (other - got).abs().max().item() > 1e-3
