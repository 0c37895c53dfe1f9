"""LoRA parity: vidloom's per-request adapters vs diffusers' load_lora_weights + set_adapters, same seed.

Wan2.1 T2V (WanPipeline), Flux2 Klein (Flux2KleinPipeline), Qwen-Image (QwenImagePipeline, true CFG) and AnyFlow-FAR (AnyFlowFARPipeline, KV-cached rollout) on tiny random checkpoints with random adapters
(different ranks, alphas, an alpha_pattern and target sets): one adapter, two mixed at scales, then unloaded.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.far_checkpoints import FAR_A, write_tiny_far
from tests.helpers.flux2_checkpoints import TINY_DISTILLED, write_tiny_flux2
from tests.helpers.qwen_image_checkpoints import write_qwen_image_wide
from tests.helpers.lora_files import LoRASpec, write_lora
from tests.helpers.wan_checkpoints import TINY_A, write_tiny_wan
from tests.helpers.reference_pipelines import reference_pipeline
from vidloom.generator import VideoGenerator

# fp32 on CPU: the base pipelines match to ~3e-6 (see test_wan_generation / test_flux2_generation); the adapters
# add two small matmuls per layer in PEFT's order, so the same 1e-4 bound holds, far inside one uint8 level
# (3.9e-3). The adapters move the output by > MIN_EFFECT, so a LoRA path that did nothing could not pass.
TOLERANCE = 1e-4
MIN_EFFECT = 10 / 255
PROMPT = "a lighthouse on a cliff at dusk"
NEGATIVE = "blurred"

WAN_LORAS = {
    "style": LoRASpec(rank=4, alpha=8, targets=("to_q", "to_k", "to_v", "ffn.net.0.proj"), seed=1,
                      alpha_pattern={"blocks.1.attn1.to_q": 2}),
    "motion": LoRASpec(rank=2, alpha=2, targets=("attn2.to_out.0", "ffn.net.2", "proj_out"), seed=2),
}
FLUX2_LORAS = {
    "style": LoRASpec(rank=4, alpha=4, targets=("to_q", "to_k", "to_v", "to_qkv_mlp_proj"), seed=3),
    "ink": LoRASpec(rank=8, alpha=4, seed=4,
                    # A regex (PEFT matches a string whole): single blocks' attn.to_out is a Linear, the double
                    # blocks' a ModuleList around one.
                    targets=r".*(to_out\.0|to_add_out|ff\.linear_in|single_transformer_blocks\.\d+\.attn\.to_out)"),
}
QWEN_IMAGE_LORAS = {
    "style": LoRASpec(rank=4, alpha=8, targets=("to_q", "to_k", "to_v", "add_k_proj", "img_mlp.net.0.proj"), seed=7),
    "ink": LoRASpec(rank=4, alpha=12, seed=8, targets=r".*(to_out\.0|to_add_out|txt_mlp\.net\.2|img_mod\.1)"),
}
FAR_LORAS = {
    "style": LoRASpec(rank=4, alpha=8, targets=("to_q", "to_k", "to_v", "ffn.net.0.proj"), seed=5),
    "motion": LoRASpec(rank=2, alpha=4, targets=("attn2.to_out.0", "ffn.net.2", "delta_embedder.linear_1"), seed=6),
}


def _wan_reference(pipe, **kw) -> np.ndarray:
    out = pipe(prompt=PROMPT, negative_prompt=NEGATIVE, height=32, width=32, num_frames=5, num_inference_steps=3, guidance_scale=4.0,
               generator=torch.Generator("cpu").manual_seed(5), output_type="np")
    return out.frames[0]


def _flux2_reference(pipe, **kw) -> np.ndarray:
    out = pipe(prompt=PROMPT, height=32, width=48, num_inference_steps=3, guidance_scale=1.0,
               generator=torch.Generator("cpu").manual_seed(5), output_type="np")
    return out.images[0][None]


def _qwen_image_reference(pipe, **kw) -> np.ndarray:
    out = pipe(prompt=PROMPT, negative_prompt=NEGATIVE, true_cfg_scale=4.0, height=32, width=48,
               num_inference_steps=3, generator=torch.Generator("cpu").manual_seed(5), output_type="np")
    return out.images[0][None]


def _far_reference(pipe, **kw) -> np.ndarray:
    out = pipe(prompt=PROMPT, negative_prompt=NEGATIVE, height=48, width=80, num_frames=17, num_inference_steps=2,
               guidance_scale=1.0, chunk_partition=[1, 2, 2], use_kv_cache=True,
               generator=torch.Generator("cpu").manual_seed(5), output_type="np")
    return out.frames[0]


FAMILIES = {
    "wan": (lambda d: write_tiny_wan(d, TINY_A), "WanPipeline", WAN_LORAS, _wan_reference,
            dict(height=32, width=32, num_frames=5, num_inference_steps=3, guidance_scale=4.0, seed=5,
                 negative_prompt=NEGATIVE, sampler="unipc", flow_shift=3.0)),
    "flux2": (lambda d: write_tiny_flux2(d, TINY_DISTILLED), "Flux2KleinPipeline", FLUX2_LORAS, _flux2_reference,
              dict(height=32, width=48, num_inference_steps=3, guidance_scale=1.0, seed=5)),
    "qwen-image": (write_qwen_image_wide, "QwenImagePipeline", QWEN_IMAGE_LORAS, _qwen_image_reference,
                   dict(height=32, width=48, num_inference_steps=3, guidance_scale=4.0, seed=5,
                        negative_prompt=NEGATIVE)),
    "far": (lambda d: write_tiny_far(d, FAR_A), "AnyFlowFARPipeline", FAR_LORAS, _far_reference,
            dict(height=48, width=80, num_frames=17, num_inference_steps=2, guidance_scale=1.0, seed=5,
                 negative_prompt=NEGATIVE)),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    import diffusers

    write, pipeline, specs, reference, kw = FAMILIES[request.param]
    folder = write(tmp_path_factory.mktemp(request.param))
    files = {name: write_lora(folder, pipeline, spec, tmp_path_factory.mktemp("loras")) for name, spec in specs.items()}
    pipe = reference_pipeline(getattr(diffusers, pipeline), folder)
    gen = VideoGenerator.from_pretrained(folder, device="cpu")
    return pipe, gen, files, reference, kw


def _ours(gen: VideoGenerator, kw: dict, loras: dict | None = None) -> np.ndarray:
    return gen.generate(PROMPT, loras=loras, **kw).frames.astype(np.float64) / 255.0


def _ours_float(gen: VideoGenerator, kw: dict, loras: dict | None = None) -> np.ndarray:
    from vidloom.generator import build_request

    return gen.engine.run(build_request(gen.card, PROMPT, loras=loras, **kw))["video"]


def test_one_and_two_adapters_match_diffusers_then_unload_restores_base(family):
    pipe, gen, files, reference, kw = family
    (first, path_1), (second, path_2) = files.items()
    base = _ours_float(gen, kw)
    assert np.abs(base - reference(pipe)).max() < TOLERANCE

    pipe.load_lora_weights(str(path_1), adapter_name=first)
    pipe.load_lora_weights(str(path_2), adapter_name=second)
    gen.load_lora(first, path_1)
    gen.load_lora(second, path_2)
    try:
        pipe.set_adapters([first], adapter_weights=[0.8])
        one = _ours_float(gen, kw, {first: 0.8})
        assert np.abs(one - reference(pipe)).max() < TOLERANCE
        assert np.abs(one - base).max() > MIN_EFFECT, "the adapter barely changes the output: parity proves nothing"

        pipe.set_adapters([first, second], adapter_weights=[0.7, -0.6])
        mixed = _ours_float(gen, kw, {first: 0.7, second: -0.6})
        assert np.abs(mixed - reference(pipe)).max() < TOLERANCE
        assert np.abs(mixed - one).max() > MIN_EFFECT, "the second adapter changes nothing"
    finally:
        pipe.unload_lora_weights()
    gen.unload_lora(first)
    gen.unload_lora(second)
    assert np.array_equal(_ours_float(gen, kw), base), "unloading must leave the base model bit for bit"


def test_requests_with_different_adapters_do_not_leak_into_each_other(family):
    _, gen, files, _, kw = family
    (first, path_1), _ = files.items()
    base = _ours_float(gen, kw)
    gen.load_lora(first, path_1)
    try:
        adapted = _ours_float(gen, kw, {first: 1.0})
        # The adapters live in the request, not on the modules: the next request without them is the base.
        assert np.array_equal(_ours_float(gen, kw), base)
        assert np.array_equal(_ours_float(gen, kw, {first: 1.0}), adapted)
        assert np.array_equal(_ours_float(gen, kw, {first: 0.0}), base)
    finally:
        gen.unload_lora(first)
