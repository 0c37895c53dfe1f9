"""The warm-up requests a deployment's `warmup_shapes` run at load: one short request per shape, built so that the
card accepts it, so compiled graphs, CUDA graphs and the allocator have seen the shape before users arrive."""

from __future__ import annotations

import numpy as np

from vidloom.core.card import ModelCard
from vidloom.core.request import GenerationRequest, Task

WARMUP_PROMPT = "warmup"
WARMUP_SEED = 0
GRAY = 128  # the warm-up frame's value (uint8): any content warms the same shapes
FRAME_INPUTS = ("image", "last_image")  # the still frames a card may require of every request


def warmup_request(card: ModelCard, shape: tuple[int, int, int], steps: int,
                   guidance: float | None = None) -> GenerationRequest:
    """A `steps`-step request of `shape` (height, width, num_frames) that `card` runs: text to video (an image model:
    text to image). A card whose every request gives a first frame (image to video, an image edit) gets a gray
    height x width one, and where the card takes no height and width (its size is the frame's, as HunyuanVideo-1.5's
    aspect buckets) the frame alone sets the size: the size a user's frame of that shape runs at."""
    height, width, num_frames = shape
    frames = {name: np.full((height, width, 3), GRAY, np.uint8) for name in FRAME_INPUTS
              if name in card.required_inputs}
    if "image" in frames:
        task = Task.I2V if Task.I2V in card.tasks else Task.T2I
    else:
        task = Task.T2V if Task.T2V in card.tasks else Task.T2I
    sized = card.optional_fields is None or {"height", "width"} <= card.optional_fields or not frames
    size = dict(height=height, width=width) if sized else {}
    return GenerationRequest(
        prompt=WARMUP_PROMPT, task=task, num_frames=num_frames, num_inference_steps=steps, seed=WARMUP_SEED,
        **size, **frames, **({} if guidance is None else {"guidance_scale": guidance}),
    )
