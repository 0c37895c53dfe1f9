"""VideoGenerator: the offline Python API (from_pretrained, generate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vidloom import registry
from vidloom.core.card import ModelCard
from vidloom.core.output import EventCallback, VideoOutput
from vidloom.core.request import GenerationRequest, Task
from vidloom.media.video import to_uint8
from vidloom.runtime.engine import CancellationToken, Engine


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
    ) -> "VideoGenerator":
        """Load a registered model id or a diffusers checkpoint directory.

        device: defaults to CUDA when available, else CPU. dtype: defaults to the
        card's precision on CUDA and float32 on CPU. Nothing is downloaded.
        """
        card = registry.resolve_card(model)
        checkpoint = registry.resolve_checkpoint(card, Path(cache_dir) if cache_dir else None)
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        instance = registry.load_instance(card, checkpoint, device, dtype)
        program = registry.import_target(card.program)(instance)
        return cls(Engine(instance, program))

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
        out = self.engine.run(request, on_event=on_event, cancel=cancel)
        resolved: GenerationRequest = out["request"]
        return VideoOutput(
            frames=to_uint8(out["video"]),
            fps=resolved.fps,
            metadata=_metadata(self.card, resolved, out["elapsed_s"]),
        )


def _metadata(card: ModelCard, r: GenerationRequest, elapsed_s: float) -> dict[str, Any]:
    return {
        "model": card.model_id,
        "request_id": r.request_id,
        "task": r.task.value,
        "prompt": r.prompt,
        "negative_prompt": r.negative_prompt,
        "height": r.height,
        "width": r.width,
        "num_frames": r.num_frames,
        "fps": r.fps,
        "num_inference_steps": r.num_inference_steps,
        "guidance_scale": r.guidance_scale,
        "flow_shift": r.flow_shift,
        "sampler": r.sampler,
        "seed": r.seed,
        "elapsed_s": round(elapsed_s, 3),
    }
