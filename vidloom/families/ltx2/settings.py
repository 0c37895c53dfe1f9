"""Per-card LTX-2 sampling settings the request does not carry (defaults: LTX2Pipeline.__call__'s)."""

from __future__ import annotations

from dataclasses import dataclass

from vidloom.diffusion.av_guidance import AudioVideoScales

# diffusers.pipelines.ltx2.utils.STAGE_2_DISTILLED_SIGMA_VALUES: the refinement pass's sigmas, used as
# they are (the stage-2 scheduler turns dynamic shifting and the terminal stretch off), the first one
# also being the noise the upsampled latents are mixed with (Lightricks' ti2vid_two_stages).
STAGE_2_SIGMAS = (0.909375, 0.725, 0.421875)


@dataclass(frozen=True)
class LTX2Settings:
    """Guidance of each pass and the other pipeline knobs; request.guidance_scale sets stage 1's video CFG."""

    stage1: AudioVideoScales = AudioVideoScales()
    # The diffusers two-stage recipe calls stage 2 with guidance_scale=1.0 and the other defaults.
    stage2: AudioVideoScales = AudioVideoScales(video_cfg=1.0)
    stage2_sigmas: tuple[float, ...] = STAGE_2_SIGMAS
    use_cross_timestep: bool = True  # the pipeline default (LTX-2.3 behaviour; False is legacy LTX-2.0)
    motion_speed: float = 1.0  # rotary positions run at fps / motion_speed
    decode_timestep: float = 0.0  # timestep-conditioned VAEs decode at this timestep (and noise)
    # I2V: H.264 CRF the conditioning image is re-compressed at first (0: off); 33 is the pipeline's
    # default for Gemma3-based LTX-2.0/2.3 (diffusers ltx2/utils.py DEFAULT_IMAGE_CRF).
    image_crf: int = 33
