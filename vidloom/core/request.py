"""GenerationRequest, the Task enum, and validation against a model card."""

from __future__ import annotations

import dataclasses
import math
import secrets
import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

import numpy as np

from vidloom.core.errors import InvalidRequest, LimitExceeded

if TYPE_CHECKING:
    from vidloom.core.card import ModelCard

# Hard bounds every request meets, whatever the deployment: past them a value cannot be a real
# request (and fails deep in the run: a seed torch cannot take, an fps the encoder cannot write,
# a guidance that overflows the noise prediction to inf).
MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed takes a 64-bit unsigned seed
MAX_FPS = 240
MAX_GUIDANCE = 100.0  # CFG scales in use are 1..20; beyond 100 the update is all guidance
MAX_FLOW_SHIFT = 100.0  # Wan uses 3..17; larger shifts put every step at sigma ~1


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
    image: tuple[Any, ...] | None = field(default=None, compare=False, repr=False)
    """Input images, RGB PIL images (VideoGenerator reads paths and arrays): I2V's first frame (one, at
    the video's size) or an image model's reference images. Without height/width an edit takes the first
    image's size (floored to the size multiple)."""
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
    if request.image:
        filled.update(_size_from_image(request, card))
    resolved = dataclasses.replace(request, **filled)
    _validate(resolved, card)
    return resolved


def _validate(r: GenerationRequest, card: ModelCard) -> None:
    from vidloom.core.limits import RequestLimits  # limits imports this module

    max_chars = RequestLimits.prompt_chars(card)
    _check_text("prompt", r.prompt, max_chars)
    if not r.prompt.strip():
        raise InvalidRequest("prompt", "must be a non-empty string")
    if r.negative_prompt is not None:
        _check_text("negative_prompt", r.negative_prompt, max_chars)
    try:
        task = Task(r.task)
    except ValueError:
        known = ", ".join(t.value for t in Task)
        raise InvalidRequest("task", f"unknown task {r.task!r}; known: {known}") from None
    if task not in card.tasks:
        served = ", ".join(sorted(t.value for t in card.tasks))
        raise InvalidRequest("task", f"{card.model_id} does not serve {task.value}; it serves: {served}")
    _check_int("num_inference_steps", r.num_inference_steps, minimum=1)
    _check_int("fps", r.fps, minimum=1, maximum=MAX_FPS)
    _check_int("seed", r.seed, minimum=0, maximum=MAX_SEED)
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
    _check_conditioning(r, task, card)
    _check_float("guidance_scale", r.guidance_scale, minimum=0.0, maximum=MAX_GUIDANCE, open_min=False)
    _check_float("flow_shift", r.flow_shift, minimum=0.0, maximum=MAX_FLOW_SHIFT, open_min=True)
    if r.step_cache_threshold is not None:
        _check_float("step_cache_threshold", r.step_cache_threshold, minimum=0.0, maximum=math.inf, open_min=False)
    samplers = card.samplers
    if r.sampler not in samplers:
        raise InvalidRequest("sampler", f"unknown sampler {r.sampler!r}; known: {', '.join(samplers)}")


def _size_from_image(request: GenerationRequest, card: ModelCard) -> dict[str, int]:
    """height/width the caller left out, from the first image floored to the size multiple."""
    first = request.image[0] if isinstance(request.image, tuple) else None
    size = getattr(first, "size", None)
    if not isinstance(size, tuple):  # not a PIL image: validation names the problem
        return {}
    multiple = card.geometry.spatial_multiple
    out = {}
    for name, value in (("width", size[0]), ("height", size[1])):
        if getattr(request, name) is None:
            out[name] = max(multiple, value // multiple * multiple)
    return out


def _check_images(images: object, card: ModelCard, limit: int, limit_name: str) -> None:
    if not isinstance(images, tuple) or not images:
        raise InvalidRequest("image", "must be one or more images")
    if len(images) > limit:
        raise LimitExceeded("image", f"{len(images)} images is more than the limit of {limit}", limit_name)
    for i, img in enumerate(images):
        size = getattr(img, "size", None)
        if getattr(img, "mode", None) != "RGB" or not isinstance(size, tuple):
            raise InvalidRequest("image", f"image {i} must be an RGB PIL image, got {type(img).__name__}")
        if min(size) < card.min_image_side:
            raise InvalidRequest("image", f"image {i} is {size[0]}x{size[1]}; both sides must be at least "
                                          f"{card.min_image_side} px")


def _check_conditioning(r: GenerationRequest, task: Task, card: ModelCard) -> None:
    """I2V needs one image at the video's size and V2V a clip; elsewhere images are the card's reference images."""
    if task == Task.I2V:
        if r.image is None:
            raise InvalidRequest("image", "task i2v needs a conditioning image")
        _check_images(r.image, card, 1, "one first frame")
        width, height = r.image[0].size
        if (height, width) != (r.height, r.width):
            raise InvalidRequest("image", f"is {width}x{height} (WxH) but the video is {r.width}x{r.height}; resize it")
    elif r.image is not None:
        if card.max_reference_images == 0:
            raise InvalidRequest("image", f"{card.model_id} does not take input images for task {task.value}")
        _check_images(r.image, card, card.max_reference_images, "max_reference_images")
    if r.video is None:
        if task == Task.V2V:
            raise InvalidRequest("video", "task v2v needs a conditioning video")
        return
    if task != Task.V2V:
        raise InvalidRequest("video", f"a video is only read by task v2v, not {task.value}")
    value = r.video
    if not isinstance(value, np.ndarray) or value.dtype != np.uint8 or value.ndim != 4 or value.shape[-1] != 3:
        got = f"{value.dtype} {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__
        raise InvalidRequest("video", f"must be a uint8 RGB array [frames, height, width, 3], got {got}")
    if value.shape[1:3] != (r.height, r.width):
        raise InvalidRequest("video", f"is {value.shape[2]}x{value.shape[1]} (WxH) but the video is "
                                      f"{r.width}x{r.height}; resize it")
    step = card.geometry.temporal_factor
    if (value.shape[0] - 1) % step:
        raise InvalidRequest("video", f"has {value.shape[0]} frames; the VAE needs {step}k+1 (e.g. 1, {step + 1})")


def _check_text(name: str, value: object, max_chars: int) -> None:
    if not isinstance(value, str):
        raise InvalidRequest(name, f"must be a string, got {type(value).__name__}")
    if len(value) > max_chars:
        raise LimitExceeded(name, f"{len(value)} characters is more than the limit of {max_chars} "
                                  "(max_prompt_chars: the text encoder reads only so many tokens)", "max_prompt_chars")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: no tokenizer, database or JSON encoder takes it
        raise InvalidRequest(name, f"is not valid Unicode (unpaired surrogate at character {exc.start})") from None


def _check_float(name: str, value: object, *, minimum: float, maximum: float, open_min: bool) -> None:
    """A real number in [minimum, maximum] ((minimum, maximum] with open_min); NaN and inf are refused."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InvalidRequest(name, f"must be a number, got {value!r}")
    bound = f"> {minimum:g}" if open_min else f">= {minimum:g}"
    if not math.isfinite(value) and not (maximum == math.inf and value == math.inf):
        raise InvalidRequest(name, f"must be a finite number {bound}, got {value!r}")
    if value < minimum or (open_min and value == minimum):
        raise InvalidRequest(name, f"must be a number {bound}, got {value!r}")
    if value > maximum:
        raise InvalidRequest(name, f"must be at most {maximum:g}, got {value!r}")


def _check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidRequest(name, f"must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidRequest(name, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise InvalidRequest(name, f"must be at most {maximum}, got {value}")
