"""GenerationRequest, the Task enum, and validation against a model card."""

from __future__ import annotations

import dataclasses
import secrets
import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

from vidloom.core.errors import InvalidRequest

if TYPE_CHECKING:
    from vidloom.core.card import ModelCard


class Task(str, Enum):
    """What a request asks the model to produce (and from what)."""

    T2V = "t2v"  # text -> video
    I2V = "i2v"  # image (+ text) -> video
    T2I = "t2i"  # text -> image
    V2V = "v2v"  # video (+ text) -> video
    T2A = "t2a"  # text -> audio


@dataclass(frozen=True)
class GenerationRequest:
    """One generation call. Fields left None are filled from the card's sampling defaults."""

    prompt: str
    task: Task = Task.T2V
    negative_prompt: str | None = None
    height: int | None = None
    width: int | None = None
    num_frames: int | None = None
    fps: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    flow_shift: float | None = None
    sampler: str | None = None
    seed: int | None = None
    step_cache_threshold: float | None = None  # overrides the deployment's step-cache threshold; 0 never skips
    image: np.ndarray | None = field(default=None, compare=False, repr=False)
    """I2V conditioning frame: uint8 [height, width, 3] RGB (VideoGenerator converts PIL images and paths)."""
    video: np.ndarray | None = field(default=None, compare=False, repr=False)
    """V2V context to continue: uint8 [frames, height, width, 3] RGB, frames = temporal_factor * k + 1."""
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def uses_cfg(self) -> bool:
        """Classic CFG runs only when guidance amplifies (diffusers: guidance_scale > 1)."""
        return self.guidance_scale is not None and self.guidance_scale > 1.0


def resolve_request(request: GenerationRequest, card: ModelCard) -> GenerationRequest:
    """Fill defaults from `card` and validate; raises InvalidRequest naming the field."""
    defaults = card.sampling_defaults
    filled = {
        f.name: getattr(defaults, f.name)
        for f in dataclasses.fields(defaults)
        if getattr(request, f.name) is None
    }
    if request.seed is None:
        filled["seed"] = secrets.randbelow(2**31)
    resolved = dataclasses.replace(request, **filled)
    _validate(resolved, card)
    return resolved


def _validate(r: GenerationRequest, card: ModelCard) -> None:
    if not isinstance(r.prompt, str) or not r.prompt.strip():
        raise InvalidRequest("prompt", "must be a non-empty string")
    if r.negative_prompt is not None and not isinstance(r.negative_prompt, str):
        raise InvalidRequest("negative_prompt", "must be a string")
    try:
        task = Task(r.task)
    except ValueError:
        known = ", ".join(t.value for t in Task)
        raise InvalidRequest("task", f"unknown task {r.task!r}; known: {known}") from None
    if task not in card.tasks:
        served = ", ".join(sorted(t.value for t in card.tasks))
        raise InvalidRequest("task", f"{card.model_id} does not serve {task.value}; it serves: {served}")
    _check_int("num_inference_steps", r.num_inference_steps, minimum=1)
    _check_int("fps", r.fps, minimum=1)
    _check_int("seed", r.seed, minimum=0)
    multiple = card.geometry.spatial_multiple
    for name in ("height", "width"):
        value = getattr(r, name)
        _check_int(name, value, minimum=multiple)
        if value % multiple:
            raise InvalidRequest(name, f"{value} is not divisible by {multiple}, the model's spatial factor")
    _check_int("num_frames", r.num_frames, minimum=1)
    step = card.geometry.temporal_factor
    if (r.num_frames - 1) % step:
        raise InvalidRequest(
            "num_frames",
            f"{r.num_frames} frames cannot be encoded; the VAE needs {step}k+1 frames (e.g. 1, {step + 1}, {2 * step + 1}, ...)",
        )
    _check_conditioning(r, task, card.geometry.temporal_factor)
    if not isinstance(r.guidance_scale, (int, float)) or isinstance(r.guidance_scale, bool) or r.guidance_scale < 0:
        raise InvalidRequest("guidance_scale", f"must be a number >= 0, got {r.guidance_scale!r}")
    if not isinstance(r.flow_shift, (int, float)) or isinstance(r.flow_shift, bool) or r.flow_shift <= 0:
        raise InvalidRequest("flow_shift", f"must be a number > 0, got {r.flow_shift!r}")
    t = r.step_cache_threshold
    if t is not None and (not isinstance(t, (int, float)) or isinstance(t, bool) or not t >= 0):
        raise InvalidRequest("step_cache_threshold", f"must be a number >= 0, got {t!r}")
    samplers = card.samplers
    if r.sampler not in samplers:
        raise InvalidRequest("sampler", f"unknown sampler {r.sampler!r}; known: {', '.join(samplers)}")


def _check_conditioning(r: GenerationRequest, task: Task, temporal_factor: int) -> None:
    """image belongs to i2v and video to v2v, each required there and refused elsewhere."""
    for name, owner, ndim, layout in (("image", Task.I2V, 3, "[height, width, 3]"),
                                      ("video", Task.V2V, 4, "[frames, height, width, 3]")):
        value = getattr(r, name)
        if value is None:
            if task == owner:
                raise InvalidRequest(name, f"task {owner.value} needs a conditioning {name}")
            continue
        if task != owner:
            raise InvalidRequest(name, f"a {name} is only read by task {owner.value}, not {task.value}")
        if not isinstance(value, np.ndarray) or value.dtype != np.uint8 or value.ndim != ndim or value.shape[-1] != 3:
            got = f"{value.dtype} {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__
            raise InvalidRequest(name, f"must be a uint8 RGB array {layout}, got {got}")
        height, width = value.shape[-3:-1]
        if (height, width) != (r.height, r.width):
            raise InvalidRequest(name, f"is {width}x{height} (WxH) but the video is {r.width}x{r.height}; resize it")
    if r.video is not None and (r.video.shape[0] - 1) % temporal_factor:
        raise InvalidRequest(
            "video", f"has {r.video.shape[0]} frames; the VAE needs {temporal_factor}k+1 (e.g. 1, {temporal_factor + 1})"
        )


def _check_int(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidRequest(name, f"must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidRequest(name, f"must be >= {minimum}, got {value}")
