"""GenerationRequest, the Task enum, and validation against a model card."""

from __future__ import annotations

import dataclasses
import importlib
import math
import secrets
import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

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
# The mirror image of MAX_FLOW_SHIFT (a shift a and 1/a bend the schedule equally, to sigma ~0 here). Below
# it the shift formula a*s / (1 + (a - 1)*s) degenerates: at a = 5e-324, 1 + (a - 1) == 0 and sigma_max is inf.
MIN_FLOW_SHIFT = 1.0 / MAX_FLOW_SHIFT
# A threshold above the accumulated change of any run already skips every step a cache may skip (the tests
# use 1e6); the bound keeps the stored parameters finite JSON (inf is no JSON number, nor a PostgreSQL jsonb one).
MAX_STEP_CACHE_THRESHOLD = 1e9


class Task(str, Enum):
    """What a request asks the model to produce (and from what)."""

    T2V = "t2v"  # text -> video
    I2V = "i2v"  # image (+ text) -> video
    T2I = "t2i"  # text -> image
    V2V = "v2v"  # video (+ text) -> video
    T2A = "t2a"  # text -> audio, no frames (audio-only cards: ModelCard.audio)


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
    # Causal video models: continue a finished video (its VideoOutput or VideoSession; the server's
    # video id is turned into the session before resolving). See vidloom.core.session.
    extend_from: Any = field(default=None, compare=False, repr=False)
    # Unified models (Cosmos3), each accepted only by cards listing it in ModelCard.inputs: `reason` has the
    # model write a detailed prompt with its AR loop before generating from it; `sound` adds a soundtrack.
    reason: bool = False
    sound: bool = False
    # Per-family typed blocks (core.action.ActionInput for world models), each accepted only by cards that
    # declare it in ModelCard.request_blocks, whose resolver checks it (and replaces it with its resolved form).
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
    # Camera-controlled world models (SANA-WM), accepted only by cards listing them in ModelCard.inputs: a
    # WASD/IJKL action string ("w-80,jw-40") or [F, 4, 4] camera-to-world poses, and pinhole intrinsics. The
    # card's request_options hook validates them (InvalidRequest naming the field) into its typed block.
    camera: Any = field(default=None, compare=False, repr=False)
    c2w: Any = field(default=None, compare=False, repr=False)
    intrinsics: Any = field(default=None, compare=False, repr=False)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def uses_cfg(self) -> bool:
        """Classic CFG runs only when guidance amplifies (diffusers: guidance_scale > 1)."""
        return self.guidance_scale is not None and self.guidance_scale > 1.0


def resolve_request(request: GenerationRequest, card: ModelCard) -> GenerationRequest:
    """Fill defaults from `card` and validate; raises InvalidRequest naming the field."""
    from vidloom.core.session import check_extension_guidance, extension_fields

    _refuse_unread(request, card)
    request = dataclasses.replace(request, **extension_fields(request, card))  # before the card's defaults
    request = dataclasses.replace(request, **_resolve_blocks(request, card))  # blocks may set size and frames
    defaults = card.sampling_defaults
    filled = {
        f.name: getattr(defaults, f.name)
        for f in dataclasses.fields(defaults)
        if getattr(request, f.name) is None
    }
    if request.seed is None:
        filled["seed"] = secrets.randbelow(2**31)
    filled.update(_resolve_media(request, card))
    filled.update(_resolve_audio(request, card))
    filled["loras"] = _checked_loras(request.loras)
    frames = filled.get("video") or filled.get("image")
    if frames and card.size_from_inputs:  # an EncodedVideo has its frames' size; a list or tuple, the first's
        filled.update(_size_from_image(frames if hasattr(frames, "size") else frames[0], request, card))
    resolved = dataclasses.replace(request, **filled)
    if card.request_options is not None:  # the family's typed request blocks, checked at the boundary
        module, _, name = card.request_options.partition(":")
        resolved = dataclasses.replace(resolved, **getattr(importlib.import_module(module), name)(resolved))
    _validate(resolved, card)
    check_extension_guidance(resolved)
    return resolved


OPTIONAL_FIELDS = ("negative_prompt", "height", "width", "num_frames", "fps", "num_inference_steps", "guidance_scale",
                   "flow_shift", "sampler", "step_cache_threshold", "extend_from")
"""Request fields a card with `request_fields` must list to accept (None means: left to the card's default)."""


def _refuse_unread(r: GenerationRequest, card: ModelCard) -> None:
    """InvalidRequest naming the first field the caller set that the card's program would not read."""
    if card.request_fields is None:
        return
    for name in OPTIONAL_FIELDS:
        value = getattr(r, name)
        # The card's own default changes nothing (the server fills the size and frame count of every call).
        if value is not None and value != getattr(card.sampling_defaults, name, None) and name not in card.request_fields:
            taken = ", ".join(f for f in OPTIONAL_FIELDS if f in card.request_fields) or "none"
            raise InvalidRequest(name, f"{card.model_id} does not take {name} (fields it takes: {taken})")


REQUEST_BLOCKS = ("action",)
"""Typed per-family request blocks; a card reads one only if it declares a resolver for it."""


def _resolve_blocks(r: GenerationRequest, card: ModelCard) -> dict[str, Any]:
    """The fields each given block's resolver sets (the block itself replaced by its checked form)."""
    import importlib

    out: dict[str, Any] = {}
    for name in REQUEST_BLOCKS:
        if getattr(r, name) is None:
            continue
        spec = card.request_blocks.get(name)
        if spec is None:
            raise InvalidRequest(name, f"{card.model_id} does not accept an {name} block (no {name} pathway)")
        module, function = spec.resolver.split(":")
        out.update(getattr(importlib.import_module(module), function)(r, spec.limits,
                                                                      card.geometry.spatial_multiple))
    return out


MEDIA_INPUTS = ("image", "last_image", "video", "strength", "guidance_scale_2", "camera", "c2w", "intrinsics",
                "init_audio")
"""Request fields a card must list in ModelCard.inputs to accept."""
FLAG_INPUTS = ("reason", "sound")
"""Boolean request fields a card must list in ModelCard.inputs to accept when they are on."""
V2V_DEFAULT_STRENGTH = 0.8  # diffusers' WanVideoToVideoPipeline default
MIN_VIDEO_FRAMES = 5  # V2V: the Wan VAE's smallest multi-frame input (1 + 4)


def _resolve_media(r: GenerationRequest, card: ModelCard) -> dict[str, Any]:
    """Check the media fields against the card, load them, infer the task from them.

    Files (paths, upload bytes) are only checked from their headers here (EncodedImage / EncodedVideo, see
    media.uploads): the thread that runs the request decodes them, so a queued request holds no pixels.
    """
    from vidloom.media.image import open_image, open_images  # PIL stays out of core's import path
    from vidloom.media.uploads import open_video

    for name in MEDIA_INPUTS:
        if getattr(r, name) is not None and name not in card.inputs:
            accepted = ", ".join(sorted(card.inputs)) or "none"
            raise InvalidRequest(name, f"{card.model_id} does not accept {name} (its extra inputs: {accepted})")
    for name in FLAG_INPUTS:
        value = getattr(r, name)
        if not isinstance(value, bool):
            raise InvalidRequest(name, f"must be true or false, got {value!r}")
        if value and name not in card.inputs:
            why = " (it has no ar_decode loop to write a prompt with)" if name == "reason" else ""
            raise InvalidRequest(name, f"{card.model_id} does not accept {name}{why}")
    out: dict[str, Any] = {}
    if r.last_image is not None and r.image is None:
        raise InvalidRequest("last_image", "needs image (the first frame) as well")
    if r.image is not None and r.video is not None:
        raise InvalidRequest("video", "give either image or video, not both")
    if r.strength is not None and r.video is None:
        raise InvalidRequest("strength", "applies only to video-to-video (give video)")
    if r.init_audio is not None:
        from vidloom.media.audio_files import open_audio

        out["init_audio"] = open_audio(r.init_audio, "init_audio", card.audio.sample_rate if card.audio else 0)
    if r.image is not None:
        out["image"] = open_images(r.image, "image")
    if r.last_image is not None:
        out["last_image"] = open_image(r.last_image, "last_image")
    if r.video is not None:
        out["video"] = open_video(r.video, "video", MIN_VIDEO_FRAMES if "strength" in card.inputs else 1)
        if "strength" in card.inputs:  # denoise over the input video (Wan V2V): the output is as long as it
            if r.num_frames is not None and r.num_frames != len(out["video"]):
                raise InvalidRequest("num_frames", f"is {r.num_frames} but the video has {len(out['video'])} frames")
            out["num_frames"] = len(out["video"])
            out["strength"] = V2V_DEFAULT_STRENGTH if r.strength is None else r.strength
            _check_float("strength", out["strength"], minimum=0.0, maximum=1.0, open_min=True)
        else:  # a context clip the output continues (AnyFlow-FAR): whole latent frames of it
            step = card.geometry.temporal_factor
            if (len(out["video"]) - 1) % step:
                raise InvalidRequest("video", f"has {len(out['video'])} frames; the VAE needs {step}k+1 "
                                              f"(e.g. 1, {step + 1})")
    if r.task == Task.T2V and (r.video is not None or r.image is not None):
        out["task"] = Task.V2V if r.video is not None else Task.I2V
    task = out.get("task", r.task)
    for name, needs in (("image", Task.I2V), ("video", Task.V2V)):
        if (task == needs and task in card.tasks and getattr(r, name) is None and r.extend_from is None
                and r.action is None):  # an action block carries its own frames
            raise InvalidRequest(name, f"task {needs.value} needs a conditioning {name}")
    if "image" in out:
        _check_images(out["image"], card, task)
    missing = [name for name in MEDIA_INPUTS if name in card.required_inputs and getattr(r, name) is None]
    if missing:
        raise InvalidRequest(missing[0], f"{card.model_id} needs {missing[0]} (it serves "
                                         f"{', '.join(sorted(t.value for t in card.tasks))})")
    if r.guidance_scale_2 is not None:
        _check_float("guidance_scale_2", r.guidance_scale_2, minimum=0.0, maximum=MAX_GUIDANCE, open_min=False)
    return out


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
    _check_float("seconds_start", start, minimum=spec.min_start, maximum=spec.max_end, open_min=False)
    seconds = min(spec.default_seconds, spec.max_end - start) if r.seconds is None else r.seconds
    _check_float("seconds", seconds, minimum=spec.min_seconds, maximum=spec.max_seconds,
                 open_min=spec.min_seconds == 0.0)
    if start + seconds > spec.max_end:
        raise InvalidRequest("seconds", f"seconds_start {start:g} + seconds {seconds:g} ends past "
                                        f"{spec.max_end:g} s, the latest end {card.model_id} is conditioned on")
    return {"seconds": float(seconds), "seconds_start": float(start)}


def _check_images(images: tuple[Any, ...], card: ModelCard, task: Task) -> None:
    """I2V takes one first frame; other tasks take up to the card's reference images, each large enough."""
    limit, name = (1, "one first frame") if task == Task.I2V else (card.max_reference_images, "max_reference_images")
    if len(images) > limit:
        raise LimitExceeded("image", f"{len(images)} images is more than the limit of {limit}", name)
    for i, image in enumerate(images):
        if min(image.size) < card.min_image_side:
            raise InvalidRequest("image", f"image {i} is {image.size[0]}x{image.size[1]}; both sides must be at "
                                          f"least {card.min_image_side} px")


def _size_from_image(image: Any, request: GenerationRequest, card: ModelCard) -> dict[str, int]:
    """height/width the caller left out: the input image's (or first video frame's), floored to the size multiple."""
    multiple = card.geometry.spatial_multiple
    return {name: max(multiple, value // multiple * multiple)
            for name, value in (("width", image.size[0]), ("height", image.size[1])) if getattr(request, name) is None}


def _checked_loras(loras: Any) -> tuple[tuple[str, float], ...]:
    """Names and finite scales, as a tuple of pairs (a job store gives back JSON lists); whether each name is
    loaded is the engine's check (it owns the adapters)."""
    if not isinstance(loras, (tuple, list)):
        raise InvalidRequest("loras", f"must be a sequence of (name, scale) pairs, got {type(loras).__name__}")
    seen: set[str] = set()
    checked = []
    for i, entry in enumerate(loras):
        name, scale = entry if isinstance(entry, (tuple, list)) and len(entry) == 2 else (None, None)
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"loras[{i}].name", f"must be a non-empty string, got {name!r}")
        if name in seen:
            raise InvalidRequest(f"loras[{i}].name", f"adapter {name!r} is listed twice")
        seen.add(name)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise InvalidRequest(f"loras[{i}].scale", f"must be a finite number, got {scale!r}")
        checked.append((name, float(scale)))
    return tuple(checked)


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
        served = ", ".join(sorted(t.value for t in card.tasks)) or "no generation task, only chat (ar_decode)"
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
    _check_float("guidance_scale", r.guidance_scale, minimum=0.0, maximum=MAX_GUIDANCE, open_min=False)
    _check_float("flow_shift", r.flow_shift, minimum=MIN_FLOW_SHIFT, maximum=MAX_FLOW_SHIFT, open_min=False)
    if r.step_cache_threshold is not None:
        _check_float("step_cache_threshold", r.step_cache_threshold, minimum=0.0, maximum=MAX_STEP_CACHE_THRESHOLD,
                     open_min=False)
    if r.video is not None and r.strength is not None and int(r.num_inference_steps * r.strength) < 1:
        raise InvalidRequest("strength", f"{r.strength} of {r.num_inference_steps} steps is no denoising step; "
                                         "raise strength or num_inference_steps")
    recipe = card.recipe  # a post-trained checkpoint runs only as it was trained
    if recipe.sampler is not None and r.sampler != recipe.sampler:
        raise InvalidRequest("sampler", f"{card.model_id} was {recipe.method} for the {recipe.sampler!r} sampler; "
                                        f"got {r.sampler!r}")
    if recipe.timesteps and r.num_inference_steps != len(recipe.timesteps):
        raise InvalidRequest("num_inference_steps", f"{card.model_id} was {recipe.method} for exactly "
                                                    f"{len(recipe.timesteps)} steps {list(recipe.timesteps)}; "
                                                    f"got {r.num_inference_steps}")
    samplers = card.samplers
    if r.sampler not in samplers:
        raise InvalidRequest("sampler", f"unknown sampler {r.sampler!r}; known: {', '.join(samplers)}")


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
        raise InvalidRequest(name, f"must be a number, got {_shown(value)}")
    bound = f"> {minimum:g}" if open_min else f">= {minimum:g}"
    # Ints are finite and compare exactly with floats; math.isfinite(10**400) would raise OverflowError.
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidRequest(name, f"must be a finite number {bound}, got {_shown(value)}")
    if value < minimum or (open_min and value == minimum):
        raise InvalidRequest(name, f"must be a number {bound}, got {_shown(value)}")
    if value > maximum:
        raise InvalidRequest(name, f"must be at most {maximum:g}, got {_shown(value)}")


def _check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidRequest(name, f"must be an integer, got {_shown(value)}")
    if value < minimum:
        raise InvalidRequest(name, f"must be >= {minimum}, got {_shown(value)}")
    if maximum is not None and value > maximum:
        raise InvalidRequest(name, f"must be at most {maximum}, got {_shown(value)}")


def _shown(value: object, limit: int = 64) -> str:
    """A caller's value for an error message, cut to `limit` characters (a 10**5000 int has no repr at all)."""
    try:
        text = repr(value)
    except ValueError:  # an int with more digits than sys.get_int_max_str_digits() allows
        return f"an integer of {value.bit_length()} bits"  # type: ignore[union-attr]
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
