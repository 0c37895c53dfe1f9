"""API bodies -> GenerationRequest: size parsing, the seconds/num_frames rule, API field names.

Frame rule (documented in the README): `num_frames`, when given, wins and must already be
valid (temporal_factor*k + 1, i.e. 4k+1 for Wan). Otherwise, when `seconds` is given,
frames = round(seconds * fps) snapped to the nearest valid count (ties go to the longer
clip, at least 1 frame). Otherwise the card's default frame count. The job reports the
actual duration back as `seconds` = num_frames / fps.
"""

from __future__ import annotations

import math
import re
import uuid
from dataclasses import dataclass
from typing import Any

from vidloom.core.card import ModelCard
from vidloom.core.errors import InvalidRequest, LimitExceeded, UnknownModel
from vidloom.core.request import MAX_FPS, GenerationRequest, Task
from vidloom.core.request_checks import check_int
from vidloom.media.image import IMAGE_FORMATS
from vidloom.serving.option_fields import option_values
from vidloom.serving.protocol import ImageGenerationBody, SamplingExtensions, VideoCreateBody

# ASCII digits only ("６４x48" is not a size), no spaces, at most 6 digits a side.
_SIZE = re.compile(r"([0-9]{1,6})[xX]([0-9]{1,6})")

# InvalidRequest.field (GenerationRequest names) -> the API parameter a client sent.
_API_FIELDS = {"height": "size", "width": "size", "image": "input_reference"}


def api_field(field: str) -> str:
    return _API_FIELDS.get(field, field)


def image_api_field(field: str) -> str:
    """The Images API names its uploads `image`, as the request field."""
    return "size" if field in ("height", "width") else field


def new_video_id() -> str:
    return f"video_{uuid.uuid4().hex}"


@dataclass(frozen=True)
class PlannedVideo:
    """A request ready for the engine plus the OpenAI-facing size and duration it will have."""

    request: GenerationRequest
    size: str  # "WxH"
    seconds: str  # num_frames / fps, e.g. "4.125"


def plan_video(body: VideoCreateBody, card: ModelCard, max_frames: int | None) -> PlannedVideo:
    """Map a create-video body onto a GenerationRequest; raises InvalidRequest naming the API field.

    `max_frames` (None: unchecked) is checked here so an over-long `seconds` is named as such;
    the other work limits apply to the resolved request (JobManager, core.limits).
    """
    check_model(body.model, card)
    media = _media(body, max_frames)
    options = option_values(body, card)
    if "action" in options:
        return _plan_action(body, card, media, options)
    width, height = parse_size(body.size, card)
    fps = body.fps if body.fps is not None else card.sampling_defaults.fps
    frames = choose_frames(body, card, fps)
    if body.video is not None and body.num_frames is None and body.seconds is None:
        frames = len(media["video"])  # video-to-video: as many frames as the input (limits apply to them too)
    if max_frames is not None and frames > max_frames:
        field = "num_frames" if body.num_frames is not None else "seconds" if body.seconds is not None else "video"
        raise LimitExceeded(field, f"{frames} frames is more than this server's limit of {max_frames} (max_frames)",
                            "max_frames")
    request = GenerationRequest(
        prompt=body.prompt, task=Task.T2V, height=height, width=width, num_frames=frames, fps=fps,
        request_id=new_video_id(), **sampling_fields(body), **media, options=options,
    )
    return PlannedVideo(request, f"{width}x{height}", format_seconds(frames, fps))


def plan_resolved(body: VideoCreateBody, card: ModelCard, max_frames: int | None) -> PlannedVideo:
    """plan_video, then resolve_request (JobManager takes it as resolved): for the media pool, where uploads are
    checked from their headers and option blocks' parsers (a camera's 10,000 poses) run off the event loop."""
    from vidloom.media.request_inputs import resolve_request

    planned = plan_video(body, card, max_frames)
    return PlannedVideo(resolve_request(planned.request, card), planned.size, planned.seconds)


def _plan_action(body: VideoCreateBody, card: ModelCard, media: dict[str, object],
                 options: dict[str, object]) -> PlannedVideo:
    """An action run: its frames and size follow from the block and the conditioning frame (resolved here, so
    the job reports them); size, seconds and num_frames are the block's to decide."""
    from vidloom.core.action import ActionInput
    from vidloom.media.request_inputs import resolve_request

    for name in ("size", "seconds", "num_frames"):
        if getattr(body, name) is not None:
            raise InvalidRequest(name, "is set by the action block (chunk_size + 1 frames, the input's size)")
    block = body.action  # type: ignore[attr-defined]  # the action block's field (serving.option_fields)
    action = ActionInput(mode=block.mode, domain_name=block.domain_name, raw_actions=block.raw_actions,
                         chunk_size=block.chunk_size, view_point=block.view_point,
                         resolution_tier=block.resolution_tier)
    fps = body.fps if body.fps is not None else card.sampling_defaults.fps
    request = GenerationRequest(prompt=body.prompt, task=Task.T2V, fps=fps, request_id=new_video_id(),
                                **sampling_fields(body), **media, options={**options, "action": action})
    resolved = resolve_request(request, card)
    return PlannedVideo(resolved, f"{resolved.width}x{resolved.height}", format_seconds(resolved.num_frames, fps))


def _media(body: VideoCreateBody, max_frames: int | None) -> dict[str, object]:
    """Uploaded files checked from their headers (a 400 naming the field when unreadable or over a limit) and
    kept compressed: the job decodes them when it runs. Which ones a model accepts is checked with the rest
    of the request (resolve_request), under the API names mapped in _API_FIELDS. The card's options are
    read by serving.option_fields."""
    from vidloom.media.image import open_image  # PIL and PyAV only when media arrive
    from vidloom.media.uploads import open_video

    out: dict[str, object] = {}
    for api_name, name in (("input_reference", "image"), ("last_image", "last_image")):
        value = getattr(body, api_name)
        if value is not None:
            if not isinstance(value, (bytes, bytearray)):
                raise InvalidRequest(api_name, "must be an uploaded image file (multipart/form-data)")
            out[name] = open_image(value, api_name)
    if body.video is not None:
        if not isinstance(body.video, (bytes, bytearray)):
            raise InvalidRequest("video", "must be an uploaded video file (multipart/form-data)")
        out["video"] = open_video(body.video, "video", max_frames=max_frames)  # counts frames without decoding
    return out


MAX_IMAGES_PER_CALL = 10  # OpenAI Images API bound on `n`
RESPONSE_FORMATS = ("b64_json", "url")


@dataclass(frozen=True)
class PlannedImages:
    """`n` requests for one images call plus how to answer it."""

    requests: tuple[GenerationRequest, ...]
    response_format: str  # b64_json | url
    output_format: str  # png | jpeg | webp
    size: str  # "WxH", or "auto" when an edit takes its size from the first image


def plan_images(body: ImageGenerationBody, card: ModelCard, images: tuple[Any, ...] | None = None) -> PlannedImages:
    """An images call -> `n` requests (seed, seed + 1, ... when a seed is given); InvalidRequest names the field.

    On a video model an image is a one-frame video (1 = 4*0 + 1 frames). `images` are an edit's
    reference images (RGB PIL); without `size` the first one sets it.
    """
    check_model(body.model, card)
    if isinstance(body.n, bool) or not 1 <= body.n <= MAX_IMAGES_PER_CALL:
        raise InvalidRequest("n", f"must be between 1 and {MAX_IMAGES_PER_CALL}, got {body.n}")
    response_format = body.response_format or "b64_json"
    if response_format not in RESPONSE_FORMATS:
        raise InvalidRequest("response_format", f"must be one of {', '.join(RESPONSE_FORMATS)}, got {body.response_format!r}")
    output_format = body.output_format or "png"
    if output_format not in IMAGE_FORMATS:
        raise InvalidRequest("output_format", f"must be one of {', '.join(IMAGE_FORMATS)}, got {body.output_format!r}")
    if Task.T2I in card.tasks:
        task = Task.T2I
    elif Task.T2V in card.tasks:
        task = Task.T2V  # one frame is a valid video for every temporal_factor (k = 0)
    else:
        raise InvalidRequest("model", f"{card.model_id} serves neither text-to-image nor text-to-video")
    auto = images and body.size in (None, "auto")
    width, height = (None, None) if auto else parse_size(None if body.size == "auto" else body.size, card)
    sampling = sampling_fields(body)
    requests = tuple(
        GenerationRequest(
            prompt=body.prompt, task=task, height=height, width=width, num_frames=1, image=images or None,
            **{**sampling, "seed": None if body.seed is None else body.seed + i},
        )
        for i in range(body.n)
    )
    return PlannedImages(requests, response_format, output_format, "auto" if auto else f"{width}x{height}")


def check_model(model: str | None, card: ModelCard) -> None:
    """None means "the served model"; any other name must be it (UnknownModel -> 404)."""
    if model is not None and model != card.model_id:
        raise UnknownModel(f"model {model!r} is not served here; this server serves {card.model_id!r}")


def parse_size(size: str | None, card: ModelCard) -> tuple[int, int]:
    """"WxH" -> (width, height); None -> the card's default size. Divisibility is checked here too."""
    if size is None:
        return card.sampling_defaults.width, card.sampling_defaults.height
    match = _SIZE.fullmatch(size) if isinstance(size, str) else None
    if match is None:
        shown = repr(size[:32] + "..." if len(size) > 32 else size) if isinstance(size, str) else type(size).__name__
        raise InvalidRequest("size", f"must be 'WIDTHxHEIGHT' in ASCII digits like '832x480', got {shown}")
    width, height = int(match[1]), int(match[2])
    multiple = card.geometry.spatial_multiple
    if width < multiple or height < multiple or width % multiple or height % multiple:
        raise InvalidRequest("size", f"width and height must be positive multiples of {multiple}, got {size!r}")
    return width, height


def choose_frames(body: VideoCreateBody, card: ModelCard, fps: int) -> int:
    """The frame rule in the module docstring."""
    if not isinstance(fps, int) or isinstance(fps, bool) or fps < 1:
        raise InvalidRequest("fps", f"must be an integer >= 1, got {fps!r}")
    # Bounded before seconds * fps: an fps of 10**400 has no float, and the product raised OverflowError (a 500).
    check_int("fps", fps, 1, MAX_FPS)
    factor = card.geometry.temporal_factor
    seconds = parse_seconds(body.seconds) if body.seconds is not None else None  # checked even when unused
    if body.num_frames is not None:
        return body.num_frames  # validated (4k+1) by resolve_request, which names num_frames
    if seconds is None:
        return card.sampling_defaults.num_frames
    wanted = seconds * fps
    if not math.isfinite(wanted):
        raise InvalidRequest("seconds", f"{body.seconds!r} is too long")
    raw = round(wanted)
    k = max(0, math.floor((raw - 1) / factor + 0.5))
    return factor * k + 1


def parse_seconds(value: str | float) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise InvalidRequest("seconds", f"must be a number of seconds, got {value!r}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidRequest("seconds", f"must be a positive number, got {value!r}")
    return seconds


def format_seconds(frames: int, fps: int) -> str:
    """A duration string like OpenAI's ("4"), with up to 3 decimals ("4.125")."""
    return f"{frames / fps:.3f}".rstrip("0").rstrip(".")


def sampling_fields(body: SamplingExtensions) -> dict[str, object]:
    return {
        "negative_prompt": body.negative_prompt, "num_inference_steps": body.num_inference_steps,
        "guidance_scale": body.guidance_scale, "flow_shift": body.flow_shift, "sampler": body.sampler,
        "seed": body.seed, "step_cache_threshold": body.step_cache_threshold,
        "loras": tuple((ref.name, ref.scale) for ref in body.loras or ()),
    }
