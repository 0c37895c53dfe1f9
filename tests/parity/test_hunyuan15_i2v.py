"""HunyuanVideo-1.5 image to video: the final latents of our program (aspect bucket, Lanczos crop, SigLIP tokens,
the first frame's VAE mode in the condition latents, meanflow's timestep_r) vs
HunyuanVideo15ImageToVideoPipeline(output_type="latent") on two tiny checkpoints saved by diffusers.
The first frame is encoded by our Hunyuan15VAE (from the folder's `vae/`) on our side, by diffusers' on theirs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers.hunyuan15_checkpoints import run_until_latents, write_i2v_pipeline
from vidloom.core.deploy import DeployConfig
from vidloom.core.instance import ModelInstance
from vidloom.core.request import GenerationRequest, Task
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.families.hunyuan15.cards import card_from_checkpoint
from vidloom.families.hunyuan15.load import load_denoiser, load_vae
from vidloom.families.hunyuan15.program import build_program

TOLERANCE = 2e-5  # measured <= 2.7e-6 on latents of ~3.5
CASES = {
    # landscape image -> the 48 x 80 bucket; quoted text; CFG on every step
    "p1": dict(size=(50, 30), prompt='a sign that says "open"', negative_prompt=None, num_frames=9, seed=3),
    # portrait image -> the 80 x 48 bucket; 2x2x2 patches; meanflow; CFG from step 1 with rescale
    "p2": dict(size=(45, 80), prompt="a red fox in the snow", negative_prompt="blurry", num_frames=5, seed=5),
}


def _image(size: tuple[int, int]) -> Image.Image:
    g = np.random.default_rng(0)
    return Image.fromarray(g.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


@pytest.mark.parametrize("name", sorted(CASES))
def test_latents_match_the_pipeline(name, tmp_path):
    pipe = write_i2v_pipeline(tmp_path, name)
    case = CASES[name]
    card = card_from_checkpoint(tmp_path)
    assert card.required_inputs == frozenset({"image"}) and "height" not in card.optional_fields
    components = load_denoiser(DiffusersDir.open(tmp_path), torch.device("cpu"), torch.float32, DeployConfig())
    components["vae"] = load_vae(tmp_path / "vae", torch.device("cpu"), torch.float32)
    instance = ModelInstance(card=card, components=components, device=torch.device("cpu"), dtype=torch.float32,
                             checkpoint_dir=str(tmp_path))
    pipe.prompt_template_encode_start_idx = components["text_encoder"].crop  # see test_hunyuan15_generation
    image = _image(case["size"])
    defaults = card.sampling_defaults
    request = GenerationRequest(prompt=case["prompt"], task=Task.I2V, negative_prompt=case["negative_prompt"],
                                num_frames=case["num_frames"], num_inference_steps=4, seed=case["seed"],
                                guidance_scale=defaults.guidance_scale, flow_shift=defaults.flow_shift,
                                image=(image,))
    with torch.no_grad():
        expected = pipe(image=image, prompt=case["prompt"], negative_prompt=case["negative_prompt"],
                        num_frames=case["num_frames"], num_inference_steps=4,
                        generator=torch.Generator().manual_seed(case["seed"]), output_type="latent").frames
    got = run_until_latents(build_program(instance), request)
    assert got.shape == expected.shape
    diff = (got - expected).abs().max().item()
    assert diff < TOLERANCE, diff
