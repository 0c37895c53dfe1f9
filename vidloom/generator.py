"""VideoGenerator: the offline Python API (from_pretrained, generate)."""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom import registry
from vidloom.core.card import ModelCard
from vidloom.core.deploy import DeployConfig
from vidloom.core.output import EventCallback, VideoOutput
from vidloom.core.request import GenerationRequest, Task
from vidloom.runtime.engine import CancellationToken, Engine
from vidloom.runtime.results import video_output


class VideoGenerator:
    """A loaded model plus a sync engine. One instance serves many `generate` calls."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @classmethod
    def from_pretrained(
        cls,
        model: str | Path = registry.DEFAULT_MODEL,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        cache_dir: str | Path | None = None,
        deploy: DeployConfig | None = None,
    ) -> "VideoGenerator":
        """Load a registered model id or a diffusers checkpoint directory.

        device: defaults to CUDA when available, else CPU. dtype: defaults to the
        card's precision on CUDA and float32 on CPU. deploy: performance and memory
        options (default: the plain reference path). Nothing is downloaded.
        """
        card = registry.resolve_card(model)
        checkpoint = registry.resolve_checkpoint(card, Path(cache_dir) if cache_dir else None)
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        instance = registry.load_instance(card, checkpoint, device, dtype, deploy or DeployConfig())
        program = registry.import_target(card.program)(instance)
        engine = Engine(instance, program)
        engine.warmup(instance.deploy.warmup_shapes)
        return cls(engine)

    @property
    def card(self) -> ModelCard:
        return self.engine.instance.card

    def generate(
        self,
        prompt: str,
        *,
        negative_prompt: str | None = None,
        height: int | None = None,
        width: int | None = None,
        num_frames: int | None = None,
        fps: int | None = None,
        num_inference_steps: int | None = None,
        guidance_scale: float | None = None,
        flow_shift: float | None = None,
        sampler: str | None = None,
        seed: int | None = None,
        on_event: EventCallback | None = None,
        cancel: CancellationToken | None = None,
    ) -> VideoOutput:
        """Generate a video; fields left None take the card's sampling defaults."""
        request = GenerationRequest(
            prompt=prompt, task=Task.T2V, negative_prompt=negative_prompt, height=height, width=width,
            num_frames=num_frames, fps=fps, num_inference_steps=num_inference_steps,
            guidance_scale=guidance_scale, flow_shift=flow_shift, sampler=sampler, seed=seed,
        )
        return self.run(request, on_event=on_event, cancel=cancel)

    def run(
        self,
        request: GenerationRequest,
        on_event: EventCallback | None = None,
        cancel: CancellationToken | None = None,
    ) -> VideoOutput:
        """Run a prepared request (InvalidRequest before any work; Cancelled at a step boundary)."""
        return video_output(self.card, self.engine.run(request, on_event=on_event, cancel=cancel))

