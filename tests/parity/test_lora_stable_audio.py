"""Stable Audio LoRA parity: a PEFT adapter on diffusers' StableAudioDiTModel (diffusers gives the pipeline no LoRA
loader, so PEFT injects it), in the layout save_lora_weights writes, loaded per request by vidloom vs the pipeline
with the adapter injected.

fp32 on CPU, the tiny stereo checkpoint. The base program matches the pipeline to < 1e-5 (test_stable_audio_generation);
the adapter adds two small matmuls per layer in PEFT's order, so 1e-4 holds on the waveform. The adapter moves the
waveform by more than MIN_EFFECT, so a LoRA path that did nothing (or missed a layer kind) could not pass.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.lora_files import LoRASpec, write_peft_lora
from tests.helpers.stable_audio_checkpoints import TINY_STEREO, load_reference, write_tiny_stable_audio
from vidloom.generator import VideoGenerator

pytest.importorskip("torchsde")

TOLERANCE = 1e-4
MIN_EFFECT = 1e-2
# Self- and cross-attention (cross K/V have fewer heads), the feed-forward, and the stream's input projection.
SPEC = LoRASpec(rank=4, alpha=8, targets=r".*(to_q|to_k|to_v|to_out\.0|ff\.net\.0\.proj|ff\.net\.2|proj_in)",
                seed=21, std=0.2)
REQUEST = dict(seconds=TINY_STEREO.max_seconds * 0.6, start=0.1, negative="hiss", guidance=3.0)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = write_tiny_stable_audio(tmp_path_factory.mktemp("stable-audio-lora"), TINY_STEREO)
    pipe = load_reference(folder)
    pipe.set_progress_bar_config(disable=True)
    lora = write_peft_lora(pipe.transformer, SPEC, tmp_path_factory.mktemp("sa-loras"), "stable-audio-lora")
    return pipe, VideoGenerator.from_pretrained(folder, device="cpu"), lora


def _theirs(pipe, *, seconds, start, negative, guidance) -> np.ndarray:
    out = pipe("a dog barks", audio_end_in_s=start + seconds, audio_start_in_s=start, num_inference_steps=4,
               guidance_scale=guidance, negative_prompt=negative, generator=torch.Generator().manual_seed(3))
    return out.audios[0].numpy()


def _ours(gen, loras=None, *, seconds, start, negative, guidance) -> np.ndarray:
    return gen.generate("a dog barks", seconds=seconds, seconds_start=start, negative_prompt=negative,
                        num_inference_steps=4, guidance_scale=guidance, seed=3, loras=loras).audio


def test_a_request_adapter_matches_the_pipeline_with_peft(setup):
    pipe, gen, lora = setup
    gen.load_lora("peft", lora)
    try:
        adapted = _ours(gen, {"peft": 1.0}, **REQUEST)
        plain = _ours(gen, **REQUEST)
    finally:
        gen.unload_lora("peft")
    theirs = _theirs(pipe, **REQUEST)
    assert adapted.shape == theirs.shape
    assert float(np.abs(adapted - theirs).max()) < TOLERANCE
    assert float(np.abs(adapted - plain).max()) > MIN_EFFECT  # the adapter acted
