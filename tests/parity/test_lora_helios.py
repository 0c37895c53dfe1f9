"""Helios LoRA: vidloom's per-request adapters vs HeliosPipeline's load_lora_weights + set_adapters (diffusers'
HeliosLoraLoaderMixin), a file saved by HeliosPipeline.save_lora_weights for HeliosTransformer3DModel; two chunks,
so the adapted history reaches the second; at a scale, two mixed, then unloaded."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.helios_checkpoints import TINY_B, write_tiny_helios
from tests.helpers.lora_files import LoRASpec, write_lora
from tests.helpers.reference_pipelines import reference_pipeline
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator

pytestmark = [pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning"),
              pytest.mark.usefixtures("one_torch_thread")]
# float32 on the CPU. Measured (TINY_B, two chunks, CFG, one adapter at 0.8): frames 4.5e-6, latents 3.6e-6;
# the bound is one uint8 level, the adapters move the frames by far more (MIN_EFFECT).
FRAME_TOLERANCE = 1 / 255
LATENT_TOLERANCE = 1e-4
MIN_EFFECT = 10 / 255
PROMPT = "a lantern floating over a dark lake"
RUN = dict(height=32, width=48, num_inference_steps=2, guidance_scale=3.0)
LORAS = {
    "style": LoRASpec(rank=4, alpha=8, targets=("to_q", "to_k", "to_v", "ffn.net.0.proj"), seed=11,
                      alpha_pattern={"blocks.1.attn1.to_q": 2}),
    "motion": LoRASpec(rank=2, alpha=4, targets=("attn2.to_out.0", "ffn.net.2", "proj_out"), seed=12),
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from diffusers import HeliosPipeline

    folder = write_tiny_helios(tmp_path_factory.mktemp("helios-lora"), TINY_B)
    out = tmp_path_factory.mktemp("loras")
    files = {name: write_lora(folder, "HeliosPipeline", spec, out) for name, spec in LORAS.items()}
    return reference_pipeline(HeliosPipeline, folder), VideoGenerator.from_pretrained(folder, device="cpu"), files


def _ours(gen: VideoGenerator, loras: dict[str, float] | None = None) -> tuple[np.ndarray, torch.Tensor]:
    request = GenerationRequest(prompt=PROMPT, num_frames=65, seed=4, loras=tuple((loras or {}).items()), **RUN)
    out = gen.engine.run(request)
    return out["video"], out["session"]["latents"]


def _theirs(pipe, output_type: str) -> np.ndarray | torch.Tensor:
    frames = pipe(prompt=PROMPT, num_frames=66, generator=torch.Generator("cpu").manual_seed(4),
                  output_type=output_type, **RUN).frames
    return frames if output_type == "latent" else np.asarray(frames[0], dtype=np.float32)


def test_adapters_match_the_pipeline_then_unload_restores_base(setup):
    pipe, gen, files = setup
    base, _ = _ours(gen)
    for name, path in files.items():
        pipe.load_lora_weights(str(path), adapter_name=name)
        gen.load_lora(name, path)
    try:
        pipe.set_adapters(["style"], adapter_weights=[0.8])
        one, latents = _ours(gen, {"style": 0.8})
        assert np.abs(one - _theirs(pipe, "np")).max() <= FRAME_TOLERANCE
        assert (latents - _theirs(pipe, "latent")).abs().max() <= LATENT_TOLERANCE
        assert np.abs(one - base).max() > MIN_EFFECT, "the adapter barely changes the output: parity proves nothing"

        pipe.set_adapters(["style", "motion"], adapter_weights=[0.7, -0.6])
        mixed, _ = _ours(gen, {"style": 0.7, "motion": -0.6})
        assert np.abs(mixed - _theirs(pipe, "np")).max() <= FRAME_TOLERANCE
        assert np.abs(mixed - one).max() > MIN_EFFECT, "the second adapter changes nothing"
    finally:
        pipe.unload_lora_weights()
    for name in files:
        gen.unload_lora(name)
    after, _ = _ours(gen)
    assert np.array_equal(after, base), "unloading must leave the base model bit for bit"
    assert np.abs(base - _theirs(pipe, "np")).max() <= FRAME_TOLERANCE
