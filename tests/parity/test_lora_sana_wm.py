"""SANA-WM LoRA parity: a PEFT adapter on diffusers' stage-1 SanaWMTransformer3DModel (diffusers gives the pipeline no
LoRA loader, so PEFT injects it), in the layout save_lora_weights writes, loaded per request by vidloom vs the
pipeline with the adapter injected.

fp32 on CPU, tiny config B (Q/K/V short convs, plucker projections on some blocks). The adapter adds two small
matmuls per targeted linear in PEFT's order: observed 3e-6 on frames in [0, 1], bound 1e-4 (as the base parity,
test_sana_wm_generation). Config A is not used: its softmax block's bf16 SDPA (mirrored from the reference) flips
roundings that an adapter carries to frames (~2e-3 observed with a std-0.2 adapter), though with the bf16 round trip off both configs
agree to < 1e-6. The adapter moves frames by ~0.25 (> MIN_EFFECT), so a LoRA path that did nothing (or missed a
layer kind) could not pass.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers.lora_files import LoRASpec, write_peft_lora
from tests.helpers.reference_pipelines import reference_pipeline
from tests.helpers.sana_wm_checkpoints import SANA_WM_B, write_tiny_sana_wm
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator

TOLERANCE = 1e-4
MIN_EFFECT = 1e-2
# Every linear kind of a block (GDN and softmax self-attention with its camera branch, cross-attention, the plucker
# projection) and the caption, timestep and output projections.
SPEC = LoRASpec(rank=4, alpha=8, seed=23, std=0.05, targets=(
    r".*(attn\.(qkv|proj|beta_proj|gate_proj|output_gate|[qkv]_proj_cam|out_proj_cam)|cross_attn\.(q_linear|kv_linear"
    r"|proj)|plucker_proj|y_proj\.fc[12]|t_embedder\.linear_[12]|t_block\.1|final_layer\.linear)"))
PROMPT, NEGATIVE, CAMERA = "a car driving across a vast desert plain", "blurry", "w-8,jw-8,ik-4"
BASE = dict(height=64, width=96, num_frames=17, num_inference_steps=2, seed=3, guidance_scale=5.0)
INTRINSICS = [50.0, 52.0, 35.0, 20.0]
IMAGE = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 70, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from diffusers import SanaWMPipeline

    folder = write_tiny_sana_wm(tmp_path_factory.mktemp("sana-wm-lora") / "ckpt", SANA_WM_B)
    pipe = reference_pipeline(SanaWMPipeline, folder)
    lora = write_peft_lora(pipe.transformer, SPEC, tmp_path_factory.mktemp("sana-wm-loras"), "sana-wm-lora")
    return pipe, VideoGenerator.from_pretrained(folder, device="cpu"), lora


def _theirs(pipe) -> np.ndarray:
    return pipe(image=IMAGE, prompt=PROMPT, negative_prompt=NEGATIVE, intrinsics=INTRINSICS, action=CAMERA,
                height=BASE["height"], width=BASE["width"], num_frames=BASE["num_frames"],
                num_inference_steps=BASE["num_inference_steps"], guidance_scale=BASE["guidance_scale"],
                generator=torch.Generator().manual_seed(BASE["seed"]), output_type="np").frames


def _ours(gen: VideoGenerator, loras: tuple[tuple[str, float], ...] = ()) -> np.ndarray:
    request = GenerationRequest(prompt=PROMPT, negative_prompt=NEGATIVE, image=IMAGE, intrinsics=INTRINSICS,
                                camera=CAMERA, loras=loras, **BASE)
    return gen.engine.run(request)["video"]


def test_a_request_adapter_matches_the_pipeline_with_peft(setup):
    pipe, gen, lora = setup
    gen.load_lora("peft", lora)
    try:
        adapted = _ours(gen, (("peft", 1.0),))
        plain = _ours(gen)
    finally:
        gen.unload_lora("peft")
    theirs = _theirs(pipe)
    assert adapted.shape == theirs.shape == (17, 64, 96, 3)
    assert float(np.abs(adapted - theirs).max()) < TOLERANCE
    assert float(np.abs(adapted - plain).max()) > MIN_EFFECT  # the adapter acted
