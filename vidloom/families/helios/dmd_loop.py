"""Helios-Distilled's chunk loop: the pyramid's rollout with DMD steps (dmd.py) and no guidance; with
amplify_first_chunk the first chunk runs twice the steps in every stage (HeliosPyramidPipeline's
is_amplify_first_chunk)."""

from __future__ import annotations

from typing import Any

from vidloom.core.request import GenerationRequest
from vidloom.diffusion.sampler import Schedule
from vidloom.families.helios.dmd import HeliosDMDSampler, dmd_stage_schedule
from vidloom.families.helios.options import AMPLIFY_FIRST_CHUNK
from vidloom.families.helios.pyramid import StageRange, split_steps
from vidloom.families.helios.pyramid_loop import HeliosPyramidLoop


class HeliosDMDLoop(HeliosPyramidLoop):
    """The distilled pyramid: each stage's steps re-noise toward the stage's start point."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, zero_star=False, **kwargs)

    def _sampler(self, request: GenerationRequest) -> HeliosDMDSampler:
        return HeliosDMDSampler()

    def _stage_schedule(self, stage: StageRange, num_steps: int, tokens: int) -> Schedule:
        return dmd_stage_schedule(self.schedule, stage, num_steps, tokens)

    def _first_chunk_schedules(self, request: GenerationRequest, h: int, w: int) -> tuple[Schedule, ...]:
        if not request.option(AMPLIFY_FIRST_CHUNK):
            return ()
        steps = split_steps(request.num_inference_steps, self.schedule.stages)
        return self._stage_schedules(tuple(2 * n for n in steps), h, w)
