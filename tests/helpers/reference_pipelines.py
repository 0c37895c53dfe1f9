"""The reference side of a parity test: a diffusers pipeline loaded as every parity test runs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def reference_pipeline(pipeline_class: Any, folder: Path | str, **kwargs: Any) -> Any:
    """`pipeline_class` (a diffusers pipeline) from `folder` in float32, its progress bar off."""
    pipe = pipeline_class.from_pretrained(str(folder), dtype=torch.float32, **kwargs)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def ltx2_two_stage(reference: Any, folder: Path, prompt: str, negative: str, seed: int,
                   stage2_lora: tuple[Path, float] | None = None) -> tuple[Any, Any]:
    """(frames, waveform) of LTX-2's two-stage recipe as the diffusers docs chain it: LTX2Pipeline (64x64 latents,
    2 steps, STG on block 1) -> LTX2LatentUpsamplePipeline -> LTX2Pipeline refine at 128x128 over the distilled
    stage-2 sigmas, with `stage2_lora` (file, weight) loaded for the refinement only."""
    from diffusers import FlowMatchEulerDiscreteScheduler, LTX2LatentUpsamplePipeline, LTX2Pipeline
    from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel
    from diffusers.pipelines.ltx2.utils import STAGE_2_DISTILLED_SIGMA_VALUES

    pipe = LTX2Pipeline(**reference.components)
    pipe.set_progress_bar_config(disable=True)
    g = torch.Generator().manual_seed(seed)
    common = dict(prompt=prompt, negative_prompt=negative, num_frames=9, frame_rate=25.0,
                  spatio_temporal_guidance_blocks=[1])
    video, audio = pipe(height=64, width=64, num_inference_steps=2, generator=g, output_type="latent",
                        return_dict=False, **common)
    upsampler = LTX2LatentUpsamplerModel.from_pretrained(str(folder / "latent_upsampler"))
    upsampled = LTX2LatentUpsamplePipeline(vae=pipe.vae, latent_upsampler=upsampler)(
        latents=video, output_type="latent", return_dict=False)[0]
    pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(pipe.scheduler.config, use_dynamic_shifting=False,
                                                                 shift_terminal=None)
    if stage2_lora is not None:
        pipe.load_lora_weights(str(stage2_lora[0]), adapter_name="stage2")
    try:
        if stage2_lora is not None:
            pipe.set_adapters(["stage2"], adapter_weights=[stage2_lora[1]])
        frames, waveform = pipe(latents=upsampled, audio_latents=audio, height=128, width=128, num_inference_steps=3,
                                noise_scale=STAGE_2_DISTILLED_SIGMA_VALUES[0], sigmas=STAGE_2_DISTILLED_SIGMA_VALUES,
                                guidance_scale=1.0, generator=g, output_type="np", return_dict=False, **common)
    finally:
        if stage2_lora is not None:
            pipe.unload_lora_weights()
    return frames, waveform
