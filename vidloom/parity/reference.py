"""The reference side: the checkpoint folder's own diffusers pipeline, run with the same taps as ours."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from vidloom.core.errors import VidloomError
from vidloom.core.request import GenerationRequest
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.parity.families import merged
from vidloom.parity.family import FamilyParity
from vidloom.parity.taps import ModuleTaps, TapRecorder


class ReferenceUnavailable(VidloomError):
    """The reference cannot run here: diffusers is missing, or no parity map covers the pipeline."""


def family_for(checkpoint: Path, request: GenerationRequest | None = None, two_stage: bool = False) -> FamilyParity:
    """The parity map for the pipeline class `checkpoint`'s model_index.json names (its video-to-video
    pipeline when `request` gives an input video, its image-to-video one when it gives a first frame, its
    two-stage chain when `two_stage`)."""
    name = DiffusersDir.open(checkpoint).pipeline_class
    maps, two_stages = merged("pipelines"), merged("two_stage")
    if two_stage:
        if name not in two_stages:
            raise ReferenceUnavailable(f"{checkpoint}: no two-stage parity map for pipeline {name!r}; known: "
                                       f"{', '.join(two_stages)}")
        return two_stages[name]
    if request is not None and request.video is not None:
        name = merged("video_to_video").get(name, name)
    elif request is not None and request.image is not None:
        name = merged("image_to_video").get(name, name)
    if name not in maps:
        raise ReferenceUnavailable(f"{checkpoint}: no parity map for pipeline {name!r}; known: {', '.join(maps)}")
    return maps[name]


def require_diffusers() -> None:
    if importlib.util.find_spec("diffusers") is None:
        raise ReferenceUnavailable(
            "vidloom parity runs the reference diffusers pipeline, and diffusers is not installed: "
            "pip install diffusers transformers"
        )


@dataclass
class Reference:
    """A loaded reference pipeline; reusable across comparisons (each call sets its own scheduler)."""

    pipe: Any
    family: FamilyParity
    scheduler_config: Mapping[str, Any]  # as saved: a comparison's sampler is derived from it, never from the last one

    @classmethod
    def load(
        cls, checkpoint: Path, device: str | torch.device = "cpu", family: FamilyParity | None = None
    ) -> Reference:
        require_diffusers()
        import diffusers

        family = family or family_for(checkpoint)
        pipe = getattr(diffusers, family.pipeline).from_pretrained(str(checkpoint), dtype=torch.float32,
                                                               **family.load_kwargs).to(device)
        pipe.set_progress_bar_config(disable=True)
        return cls.wrap(pipe, family)

    @classmethod
    def wrap(cls, pipe: Any, family: FamilyParity) -> Reference:
        """An already loaded pipeline (a test's fixture) as a Reference."""
        return cls(pipe, family, dict(pipe.scheduler.config))

    def run(self, request: GenerationRequest, recorder: TapRecorder) -> Any:
        """Run the pipeline on the resolved `request`, recording into `recorder`; returns the final frames."""
        family = self.family
        steps_done = 0
        loops = iter(family.stages or (family.loop,))
        loop = next(loops)

        def next_stage() -> None:
            """The chain's next pipeline call begins: its steps are our next loop's, counted from 0."""
            nonlocal loop, steps_done
            loop, steps_done = next(loops), 0

        def on_step_end(pipe: Any, index: int, timestep: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
            nonlocal steps_done
            if not recorder.in_step:  # a step with no network call (none in these pipelines) still gets its latents
                recorder.begin_step(loop, steps_done)
            latents = kwargs["latents"]
            recorder.record("latents", "latents", family.their_latents(latents) if family.their_latents else latents)
            recorder.end_step()
            steps_done += 1
            return {}

        def open_step(module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
            if not recorder.in_step and (family.step_call is None or family.step_call(kwargs)):
                recorder.begin_step(loop, steps_done)

        names = family.reference_denoisers or family.denoisers
        denoisers = [d for name in names if (d := getattr(self.pipe, name, None)) is not None]
        # The openers go first: a denoiser's hooks run in the order they were registered.
        openers = [denoiser.register_forward_pre_hook(open_step, with_kwargs=True) for denoiser in denoisers]
        blocks = {prefix: theirs for prefix, (_, theirs) in family.blocks.items()}
        taps = [ModuleTaps(recorder, denoiser, family.their_inputs, blocks, family.their_rows,
                           skipped=family.their_skipped)
                for denoiser in denoisers]
        callback: dict[str, Any] = {"callback_on_step_end": on_step_end,
                                    "callback_on_step_end_tensor_inputs": ["latents"]}
        if family.stages:
            callback["next_stage"] = next_stage  # the chain's call takes it out before calling a pipeline
        try:
            with torch.inference_mode():
                outputs = family.call(self.pipe, self.scheduler_config, request, callback)
        finally:
            for tap in taps:
                tap.close()
            for opener in openers:
                opener.remove()
            recorder.end_step()
        if not isinstance(outputs, Mapping):
            outputs = {family.output: outputs}
        for name, value in outputs.items():
            recorder.record("stage", name, value)
        return outputs[family.output]
