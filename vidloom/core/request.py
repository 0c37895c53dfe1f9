"""GenerationRequest, the Task enum, and resolving a request against a model card.

The value rules live in request_checks, the media fields in request_media (opened through a reader the caller
injects), the per-family blocks and the accepted common fields in request_blocks.
"""

from __future__ import annotations

import dataclasses
import secrets
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vidloom.core.errors import InvalidRequest
from vidloom.core.request_blocks import OPTIONAL_FIELDS, REQUEST_BLOCKS, check_blocks, refuse_unread, resolve_blocks
from vidloom.core.request_checks import (MAX_FLOW_SHIFT, MAX_FPS, MAX_GUIDANCE, MAX_SEED, MAX_STEP_CACHE_THRESHOLD,
                                         MIN_FLOW_SHIFT, check_float, checked_loras, validate)
from vidloom.core.request_media import FLAG_INPUTS, MEDIA_INPUTS, MediaReader, resolve_media, size_from_image
from vidloom.core.task import Task

if TYPE_CHECKING:
    from vidloom.core.card import ModelCard

__all__ = ["FLAG_INPUTS", "MAX_FLOW_SHIFT", "MAX_FPS", "MAX_GUIDANCE", "MAX_SEED", "MAX_STEP_CACHE_THRESHOLD",
           "MEDIA_INPUTS", "MIN_FLOW_SHIFT", "OPTIONAL_FIELDS", "REQUEST_BLOCKS", "GenerationRequest", "MediaReader",
           "Task", "resolve_request"]


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
    # Conditioning media (Wan I2V / first-last-frame / V2V, AnyFlow-FAR I2V / continuation, Flux2 reference
    # images) and the two-expert guidance, each accepted only by cards listing it in ModelCard.inputs. Images:
    # a PIL image, an HxW(x3) array, a path or file bytes (image: also a list of them); video: a list of frames,
    # an [F, H, W, 3] array or a file. resolve_request turns image into a tuple of RGB PIL images (I2V: one,
    # the first frame), last_image into one and video into a list of them.
    image: Any = field(default=None, compare=False, repr=False)
    last_image: Any = field(default=None, compare=False, repr=False)
    video: Any = field(default=None, compare=False, repr=False)
    strength: float | None = None  # V2V: fraction of the schedule re-run over the input video, in (0, 1]
    guidance_scale_2: float | None = None  # two-expert models: guidance of the low-noise expert
    # Causal video models: continue a finished video (its VideoOutput or VideoSession; the server's video id is
    # turned into the session before resolving). A typed block (request_blocks): the card's resolver checks it.
    extend_from: Any = field(default=None, compare=False, repr=False)
    # Unified models (Cosmos3), each accepted only by cards listing it in ModelCard.inputs: `reason` has the
    # model write a detailed prompt with its AR loop before generating from it; `sound` adds a soundtrack.
    reason: bool = False
    sound: bool = False
    # Per-family typed blocks (core.request_blocks.REQUEST_BLOCKS; core.action.ActionInput for world models), each
    # accepted only by cards that declare it in ModelCard.request_blocks, whose resolver checks it (and replaces
    # it with its resolved form).
    action: Any = field(default=None, compare=False, repr=False)
    # Audio-only cards (ModelCard.audio): the clip's length and where it starts in the model's timeline, in
    # seconds (Stable Audio's audio_end_in_s is seconds_start + seconds); other cards refuse them by name.
    seconds: float | None = None
    seconds_start: float | None = None
    # Audio-only cards listing it in ModelCard.inputs: a waveform the clip starts from (Stable Audio's
    # initial_audio_waveforms): a float array [samples] or [channels, samples] at the model's rate, or an audio
    # file path; resolve_request turns it into float32 [channels, samples].
    init_audio: Any = field(default=None, compare=False, repr=False)
    # LoRA adapters this request runs with, as ((name, scale), ...) in mixing order; each name must be loaded on
    # the engine (vidloom.lora.registry), which resolves them when the run starts.
    loras: tuple[tuple[str, float], ...] = ()
    # The camera block of camera-controlled world models (SANA-WM), given as three fields: a WASD/IJKL action
    # string ("w-80,jw-40") or [F, 4, 4] camera-to-world poses, and pinhole intrinsics. The card's camera block
    # resolver validates them (InvalidRequest naming the field) into its typed form, held in `camera`.
    camera: Any = field(default=None, compare=False, repr=False)
    c2w: Any = field(default=None, compare=False, repr=False)
    intrinsics: Any = field(default=None, compare=False, repr=False)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def uses_cfg(self) -> bool:
        """Classic CFG runs only when guidance amplifies (diffusers: guidance_scale > 1)."""
        return self.guidance_scale is not None and self.guidance_scale > 1.0


def resolve_request(request: GenerationRequest, card: ModelCard, media: MediaReader | None = None) -> GenerationRequest:
    """Fill defaults from `card` and validate; raises InvalidRequest naming the field.

    `media` opens the image / video / audio fields; callers above core use vidloom.media.request_inputs'
    resolve_request, which passes the reader (a request without media needs none).
    """
    refuse_unread(request, card)
    request = resolve_blocks(request, card)  # blocks may set size and frames, so before the card's defaults
    defaults = card.sampling_defaults
    filled = {
        f.name: getattr(defaults, f.name)
        for f in dataclasses.fields(defaults)
        if getattr(request, f.name) is None
    }
    if request.seed is None:
        filled["seed"] = secrets.randbelow(2**31)
    filled.update(resolve_media(request, card, media))
    filled.update(_resolve_audio(request, card))
    filled["loras"] = checked_loras(request.loras)
    frames = filled.get("video") or filled.get("image")
    if frames and card.size_from_inputs:  # an EncodedVideo has its frames' size; a list or tuple, the first's
        filled.update(size_from_image(frames if hasattr(frames, "size") else frames[0], request, card))
    resolved = dataclasses.replace(request, **filled)
    validate(resolved, card)
    check_blocks(resolved, card)
    return resolved


AUDIO_FIELDS = ("seconds", "seconds_start")
"""Request fields only audio-only cards (ModelCard.audio) accept."""
FRAME_FIELDS = ("height", "width", "num_frames", "fps")
"""Request fields audio-only cards refuse: they make no frames."""


def _resolve_audio(r: GenerationRequest, card: ModelCard) -> dict[str, Any]:
    """Audio-only cards: refuse frame fields, fill and check seconds; other cards refuse the seconds fields."""
    spec = card.audio
    if spec is None:
        for name in AUDIO_FIELDS:
            if getattr(r, name) is not None:
                if Task.T2A in card.tasks:  # a sound model whose clips have one fixed length
                    raise InvalidRequest(name, f"{card.model_id} makes clips of a fixed length; it takes no {name}")
                raise InvalidRequest(name, f"{card.model_id} makes no audio-only clips; {name} applies to "
                                           "text-to-audio models")
        return {}
    for name in FRAME_FIELDS:  # the card's defaults stand for "no frames" (so a resolved request resolves again)
        if getattr(r, name) not in (None, getattr(card.sampling_defaults, name)):
            raise InvalidRequest(name, f"{card.model_id} makes audio only (no frames or size); give seconds instead")
    if not spec.takes_start and r.seconds_start not in (None, spec.min_start):
        raise InvalidRequest("seconds_start", f"{card.model_id} takes no seconds_start: its clips start at "
                                              f"{spec.min_start:g} s")
    start = spec.min_start if r.seconds_start is None else r.seconds_start
    check_float("seconds_start", start, minimum=spec.min_start, maximum=spec.max_end, open_min=False)
    seconds = min(spec.default_seconds, spec.max_end - start) if r.seconds is None else r.seconds
    check_float("seconds", seconds, minimum=spec.min_seconds, maximum=spec.max_seconds,
                 open_min=spec.min_seconds == 0.0)
    if start + seconds > spec.max_end:
        raise InvalidRequest("seconds", f"seconds_start {start:g} + seconds {seconds:g} ends past "
                                        f"{spec.max_end:g} s, the latest end {card.model_id} is conditioned on")
    first, end = spec.clip_samples(start, seconds)
    if end <= first:
        raise InvalidRequest("seconds", f"{seconds:g} s from {start:g} s holds no sample at {spec.sample_rate} Hz")
    return {"seconds": float(seconds), "seconds_start": float(start)}
