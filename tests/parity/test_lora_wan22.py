"""Wan2.2 A14B LoRA parity: adapters on the high-noise expert (diffusers' default) and on the low-noise expert
(`load_lora_weights(..., load_into_transformer_2=True)`; ours: `load_lora(..., into="transformer_2")`) vs
WanPipeline(transformer_2=..., boundary_ratio=...), same seed, fp32 CPU.

6 UniPC steps at shift 5 run 3 steps on each expert (test_wan22_a14b_generation), so each adapter must move the
output by > MIN_EFFECT: an adapter loaded into the wrong expert, or into none, could not pass. 1e-4 as the other
LoRA parity tests (the base pipelines agree to ~3e-6).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.lora_files import LoRASpec, write_lora
from tests.helpers.wan22_checkpoints import write_tiny_a14b, write_tiny_ti2v
from tests.helpers.wan_checkpoints import TINY_A
from tests.helpers.reference_pipelines import reference_pipeline
from vidloom.core.errors import InvalidRequest
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator

TOLERANCE = 1e-4
MIN_EFFECT = 10 / 255
PROMPT, NEGATIVE = "a red fox jumps over a frozen river", "blurred, low quality"
KW = dict(height=32, width=48, num_frames=5, num_inference_steps=6, guidance_scale=5.0, guidance_scale_2=2.5, seed=4)
HIGH = LoRASpec(rank=4, alpha=8, targets=("to_q", "to_k", "to_v", "ffn.net.0.proj"), seed=21)
LOW = LoRASpec(rank=2, alpha=4, targets=("attn2.to_out.0", "ffn.net.2", "proj_out"), seed=22)


@pytest.fixture(scope="module")
def a14b(tmp_path_factory):
    from diffusers import WanPipeline

    folder = write_tiny_a14b(tmp_path_factory.mktemp("a14b-lora"), TINY_A)
    out = tmp_path_factory.mktemp("loras")
    files = {"high": write_lora(folder, "WanPipeline", HIGH, out), "low": write_lora(folder, "WanPipeline", LOW, out)}
    pipe = reference_pipeline(WanPipeline, folder)
    return folder, files, pipe


def _ours(gen: VideoGenerator, loras: dict | None = None) -> np.ndarray:
    request = GenerationRequest(prompt=PROMPT, negative_prompt=NEGATIVE, flow_shift=5.0, sampler="unipc",
                                loras=tuple((loras or {}).items()), **KW)
    return gen.engine.run(request)["video"]


def _reference(pipe) -> np.ndarray:
    return pipe(prompt=PROMPT, negative_prompt=NEGATIVE, height=KW["height"], width=KW["width"],
                num_frames=KW["num_frames"], num_inference_steps=KW["num_inference_steps"],
                guidance_scale=KW["guidance_scale"], guidance_scale_2=KW["guidance_scale_2"],
                generator=torch.Generator("cpu").manual_seed(KW["seed"]), output_type="np").frames[0]


def test_adapters_on_each_expert_match_diffusers(a14b):
    folder, files, pipe = a14b
    gen = VideoGenerator.from_pretrained(folder, device="cpu")
    base = _ours(gen)
    assert np.abs(base - _reference(pipe)).max() < TOLERANCE
    pipe.load_lora_weights(str(files["high"]), adapter_name="high")
    pipe.load_lora_weights(str(files["low"]), adapter_name="low", load_into_transformer_2=True)
    gen.load_lora("high", files["high"])
    gen.load_lora("low", files["low"], into="transformer_2")
    try:
        pipe.set_adapters(["high", "low"], adapter_weights=[0.8, 0.6])
        both = _ours(gen, {"high": 0.8, "low": 0.6})
        assert np.abs(both - _reference(pipe)).max() < TOLERANCE
        assert np.abs(both - _ours(gen, {"high": 0.8})).max() > MIN_EFFECT, "the low-noise adapter changes nothing"
        assert np.abs(both - _ours(gen, {"low": 0.6})).max() > MIN_EFFECT, "the high-noise adapter changes nothing"
    finally:
        pipe.unload_lora_weights()
    gen.unload_lora("high")
    gen.unload_lora("low")
    assert np.array_equal(_ours(gen), base)


def test_into_names_only_components_the_model_has(a14b, tmp_path):
    folder, files, _ = a14b
    gen = VideoGenerator.from_pretrained(folder, device="cpu")
    with pytest.raises(InvalidRequest) as err:
        gen.load_lora("x", files["low"], into="vae")
    assert err.value.field == "into" and "transformer_2" in str(err.value)
    # A one-expert Wan2.2 (TI2V-5B) has no low-noise expert to load into.
    ti2v = VideoGenerator.from_pretrained(write_tiny_ti2v(tmp_path / "ti2v"), device="cpu")
    with pytest.raises(InvalidRequest) as err:
        ti2v.load_lora("x", files["low"], into="transformer_2")
    assert err.value.field == "into"
