"""Registered ids of the Wan checkpoints beyond Wan2.1 T2V: image-to-video, first-last-frame, Wan2.2.

Defaults follow each release's model card / README (Wan-AI/Wan2.1, Wan-AI/Wan2.2): sizes, frame rates,
flow shifts, guidance scales, and for the A14B experts the second expert's guidance.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from vidloom.core.card import Geometry, ModelCard, SamplingDefaults
from vidloom.core.request import Task
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.families.wan.cards import (
    DEFAULTS_480P, DEFAULTS_720P, WAN_NEGATIVE_PROMPT, checkpoint_geometry, wan_t2v_card,
)

I2V = frozenset({Task.I2V})
FIRST_FRAME = frozenset({"image", "last_image"})
# Wan2.2's VAE compresses 16x in space (8x and 2x2 patching), the DiT patchifies 2x2 more.
WAN22_5B_GEOMETRY = Geometry(spatial_multiple=32, temporal_factor=4)


def wan21_i2v_14b_480p() -> ModelCard:
    return wan_t2v_card(
        "wan2.1-i2v-14b-480p", "hf:Wan-AI/Wan2.1-I2V-14B-480P-Diffusers", DEFAULTS_480P,
        description="Wan2.1 image-to-video, 14B DiT + CLIP, 480p",
        tasks=I2V, inputs=FIRST_FRAME, required_inputs=frozenset({"image"}),
    )


def wan21_i2v_14b_720p() -> ModelCard:
    return wan_t2v_card(
        "wan2.1-i2v-14b-720p", "hf:Wan-AI/Wan2.1-I2V-14B-720P-Diffusers", DEFAULTS_720P,
        description="Wan2.1 image-to-video, 14B DiT + CLIP, 720p",
        tasks=I2V, inputs=FIRST_FRAME, required_inputs=frozenset({"image"}),
    )


def wan21_flf2v_14b_720p() -> ModelCard:
    return wan_t2v_card(
        "wan2.1-flf2v-14b-720p", "hf:Wan-AI/Wan2.1-FLF2V-14B-720P-diffusers", DEFAULTS_720P,
        description="Wan2.1 first-last-frame-to-video, 14B DiT + CLIP, 720p",
        tasks=I2V, inputs=FIRST_FRAME, required_inputs=FIRST_FRAME,
    )


def wan22_ti2v_5b() -> ModelCard:
    # Wan2.2 README: TI2V-5B at 1280x704 (or 704x1280), 121 frames at 24 fps, shift 5.0, guidance 5.0.
    defaults = SamplingDefaults(
        height=704, width=1280, num_frames=121, fps=24, num_inference_steps=50, guidance_scale=5.0,
        flow_shift=5.0, sampler="unipc", negative_prompt=WAN_NEGATIVE_PROMPT,
    )
    return wan_t2v_card(
        "wan2.2-ti2v-5b", "hf:Wan-AI/Wan2.2-TI2V-5B-Diffusers", defaults,
        description="Wan2.2 text/image-to-video, 5B DiT, 48-channel VAE, 720p 24 fps",
        tasks=frozenset({Task.T2V, Task.I2V}), inputs=frozenset({"image"}), family="wan2.2",
        geometry=WAN22_5B_GEOMETRY,
    )


def _a14b_defaults(guidance_scale: float, guidance_scale_2: float, flow_shift: float) -> SamplingDefaults:
    """Wan2.2 A14B: 720p, 81 frames at 16 fps, 40 UniPC steps; the high-noise expert's guidance, then the
    low-noise expert's."""
    return SamplingDefaults(
        height=720, width=1280, num_frames=81, fps=16, num_inference_steps=40, guidance_scale=guidance_scale,
        flow_shift=flow_shift, sampler="unipc", negative_prompt=WAN_NEGATIVE_PROMPT, guidance_scale_2=guidance_scale_2,
    )


def wan22_t2v_a14b() -> ModelCard:
    # Wan2.2 A14B T2V: 40 steps, shift 12.0, guidance 3.0 (low noise) / 4.0 (high noise), boundary 0.875.
    return wan_t2v_card(
        "wan2.2-t2v-a14b", "hf:Wan-AI/Wan2.2-T2V-A14B-Diffusers", _a14b_defaults(4.0, 3.0, flow_shift=12.0),
        description="Wan2.2 text-to-video, two 14B experts (high/low noise), 720p",
        tasks=frozenset({Task.T2V}), inputs=frozenset({"guidance_scale_2"}), family="wan2.2",
    )


def wan22_i2v_a14b() -> ModelCard:
    # Wan2.2 A14B I2V: 40 steps, shift 5.0, guidance 3.5 for both experts, boundary 0.900.
    return wan_t2v_card(
        "wan2.2-i2v-a14b", "hf:Wan-AI/Wan2.2-I2V-A14B-Diffusers", _a14b_defaults(3.5, 3.5, flow_shift=5.0),
        description="Wan2.2 image-to-video, two 14B experts (high/low noise), 720p",
        tasks=I2V, inputs=FIRST_FRAME | {"guidance_scale_2"}, required_inputs=frozenset({"image"}), family="wan2.2",
    )


# FastVideo's FastWan checkpoints: DMD-distilled for 3 steps at these timesteps, run without CFG
# (FastVideo configs/pipelines/wan.py: dmd_denoising_steps [1000, 757, 522], flow_shift 8.0 for
# FastWan2.1-T2V-1.3B and 5.0 for FastWan2.2-TI2V-5B; configs/sample/wan.py: 448x832, 61 frames, 16 fps).
FASTWAN_TIMESTEPS = (1000, 757, 522)
FASTWAN_NOTE = (
    "DMD-distilled: runs only its 3 distilled steps with the dmd sampler and no CFG (guidance 1); "
    "other samplers or step counts are refused."
)


def fastwan21_t2v_1_3b(model_id: str = "fastwan2.1-t2v-1.3b", quantization: str | None = None) -> ModelCard:
    defaults = SamplingDefaults(
        height=448, width=832, num_frames=61, fps=16, num_inference_steps=len(FASTWAN_TIMESTEPS),
        guidance_scale=1.0, flow_shift=8.0, sampler="dmd",
    )
    return wan_t2v_card(
        model_id, "hf:FastVideo/FastWan2.1-T2V-1.3B-Diffusers", defaults, method="dmd-distilled",
        description="FastWan2.1 text-to-video, 1.3B, 3-step DMD" + (", FP8 weights" if quantization else ""),
        notes=(FASTWAN_NOTE,), tasks=frozenset({Task.T2V}), inputs=frozenset(),
        recipe_sampler="dmd", recipe_timesteps=FASTWAN_TIMESTEPS, quantization=quantization,
    )


def fastwan21_t2v_1_3b_fp8() -> ModelCard:
    # The recipe says FP8 (quantization-aware distillation): the loader quantizes the DiT blocks after load.
    return fastwan21_t2v_1_3b("fastwan2.1-t2v-1.3b-fp8", quantization="fp8")


def fastwan22_ti2v_5b() -> ModelCard:
    defaults = SamplingDefaults(
        height=704, width=1280, num_frames=121, fps=24, num_inference_steps=len(FASTWAN_TIMESTEPS),
        guidance_scale=1.0, flow_shift=5.0, sampler="dmd",
    )
    return wan_t2v_card(
        "fastwan2.2-ti2v-5b", "hf:FastVideo/FastWan2.2-TI2V-5B-FullAttn-Diffusers", defaults, method="dmd-distilled",
        description="FastWan2.2 text/image-to-video, 5B, 3-step DMD", notes=(FASTWAN_NOTE,),
        tasks=frozenset({Task.T2V, Task.I2V}), inputs=frozenset({"image"}), family="wan2.2",
        geometry=WAN22_5B_GEOMETRY, recipe_sampler="dmd", recipe_timesteps=FASTWAN_TIMESTEPS,
    )


# FastVideo's pipeline class for its DMD-distilled Wan repos: fastvideo/registry.py finds FastWan2.1 by it,
# and FastWan2.2-TI2V-5B writes it with Wan2.2's expand_timesteps. Not a diffusers class; the folder is a Wan
# diffusers folder whose weights want the FastWan recipe, whatever its scheduler_config.json says (FastVideo
# builds its own scheduler from the recipe's shift as well).
FASTWAN_PIPELINE = "WanDMDPipeline"


def fastwan_card_from_checkpoint(path: str | Path) -> ModelCard:
    """The registered FastWan card of the folder's kind (TI2V-5B when model_index.json expands timesteps, else
    the Wan2.1 T2V one), with the folder as its source and the folder's pixel multiples."""
    ckpt = DiffusersDir.open(path)
    base = fastwan22_ti2v_5b() if ckpt.index.get("expand_timesteps") else fastwan21_t2v_1_3b()
    return dataclasses.replace(
        base, model_id=ckpt.root.name, source=str(ckpt.root), teacache=None,
        description=f"FastWan ({FASTWAN_PIPELINE}, 3-step DMD) from {ckpt.root}",
        geometry=checkpoint_geometry(ckpt, ckpt.component_config("transformer")),
    )
