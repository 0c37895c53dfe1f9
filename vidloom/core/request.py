"""GenerationRequest, the Task enum, and resolving a request against a model card.

The value rules live in request_checks, the media fields in request_media (opened through a reader the caller
injects), the option blocks (core.options) and the accepted common fields in request_blocks.
"""

from __future__ import annotations

import dataclasses
import secrets
import uuid
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping

from vidloom.core.errors import InvalidRequest
from vidloom.core.request_blocks import OPTIONAL_FIELDS, check_blocks, refuse_unread, resolve_blocks
from vidloom.core.request_checks import (MAX_FLOW_SHIFT, MAX_FPS, MAX_GUIDANCE, MAX_SEED, MAX_STEP_CACHE_THRESHOLD,
                                         MIN_FLOW_SHIFT, check_float, checked_loras, validate)
from vidloom.core.request_media import MEDIA_INPUTS, MediaReader, resolve_media, size_from_image
from vidloom.core.task import Task

if TYPE_CHECKING:
    from vidloom.core.card import ModelCard

__all__ = ["MAX_FLOW_SHIFT", "MAX_FPS", "MAX_GUIDANCE", "MAX_SEED", "MAX_STEP_CACHE_THRESHOLD", "MEDIA_INPUTS",
           "MIN_FLOW_SHIFT", "OPTIONAL_FIELDS", "GenerationRequest", "MediaReader", "Task", "resolve_request"]


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
    # images, Stable Audio's initial waveform), each accepted only by cards listing it in ModelCard.inputs.
    # Images: a PIL image, an HxW(x3) array, a path or file bytes (image: also a list of them); video: a list of
    # frames, an [F, H, W, 3] array or a file; init_audio: a float array [samples] or [channels, samples] at the
    # model's rate, or an audio file. resolve_request turns image into a tuple of RGB PIL images (I2V: one, the
    # first frame), last_image into one, video into a list of them and init_audio into float32 [channels, samples].
    image: Any = field(default=None, compare=False, repr=False)
    last_image: Any = field(default=None, compare=False, repr=False)
    video: Any = field(default=None, compare=False, repr=False)
    init_audio: Any = field(default=None, compare=False, repr=False)
    # LoRA adapters this request runs with, as ((name, scale), ...) in mixing order; each name must be loaded on
    # the engine (vidloom.lora.registry), which resolves them when the run starts.
    loras: tuple[tuple[str, float], ...] = ()
    # The options of the card's blocks (core.options: a camera, an action, an audio length...) by option name;
    # given as keyword arguments (GenerationRequest(prompt, seconds=4.0)) or as this mapping. The card's block
    # resolver replaces a block's options with their typed form; read them with option().
    options: Mapping[str, Any] = field(default_factory=dict, compare=False)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (to a parallel rank) without the resolved mark, options as a plain dict."""
        state = {name: value for name, value in vars(self).items() if name != _RESOLVED}
        state["options"] = dict(self.options)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, MappingProxyType(value) if name == "options" else value)

    def option(self, name: str, default: Any = None) -> Any:
        """The value of option `name`, or `default` when the request does not give it."""
        return self.options.get(name, default)

    def with_options(self, **values: Any) -> GenerationRequest:
        """This request with `values` set among its options (None or False: removed)."""
        return dataclasses.replace(self, options={**self.options, **values})

    @property
    def uses_cfg(self) -> bool:
        """Classic CFG runs only when guidance amplifies (diffusers: guidance_scale > 1)."""
        return self.guidance_scale is not None and self.guidance_scale > 1.0


_FIELDS = frozenset(f.name for f in dataclasses.fields(GenerationRequest))
_dataclass_init = GenerationRequest.__init__


def _init(self: GenerationRequest, *args: Any, options: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
    """The dataclass __init__, taking any keyword that is not a field as an option (so replace() works too);
    an option whose value means "not given" (None, False) is dropped."""
    given = {**(options or {}), **{name: kwargs.pop(name) for name in list(kwargs) if name not in _FIELDS}}
    kept = {name: value for name, value in given.items() if value is not None and value is not False}
    _dataclass_init(self, *args, options=MappingProxyType(kept), **kwargs)


GenerationRequest.__init__ = _init  # type: ignore[method-assign]


def resolve_request(request: GenerationRequest, card: ModelCard, media: MediaReader | None = None) -> GenerationRequest:
    """Fill defaults from `card` and validate; raises InvalidRequest naming the field.

    `media` opens the image / video / audio fields; callers above core use vidloom.media.request_inputs'
    resolve_request, which passes the reader (a request without media needs none). A request this returned is
    marked resolved against `card` and comes back as it is; any change (replace, with_options) makes a new,
    unmarked request, resolved again.
    """
    if getattr(request, _RESOLVED, None) is card:
        return request
    refuse_unread(request, card)
    # Blocks may set size and frames, so before the card's defaults; refuses options no block of the card declares.
    request = resolve_blocks(request, card)
    defaults = card.sampling_defaults
    filled = {
        f.name: getattr(defaults, f.name)
        for f in dataclasses.fields(defaults)
        if f.name in _FIELDS and getattr(request, f.name) is None
    }
    options = dict(request.options)
    for name in card.option_names:  # defaults of options (the second expert's guidance)
        if options.get(name) is None and getattr(defaults, name, None) is not None:
            options[name] = getattr(defaults, name)
    if request.seed is None:
        filled["seed"] = secrets.randbelow(2**31)
    opened = resolve_media(request, card, media)
    options.update(opened.pop("options", {}))
    filled.update(opened)
    options.update(_resolve_audio(request, card))
    filled["options"] = options
    filled["loras"] = checked_loras(request.loras)
    frames = filled.get("video") or filled.get("image")
    if frames and card.size_from_inputs:  # an EncodedVideo has its frames' size; a list or tuple, the first's
        filled.update(size_from_image(frames if hasattr(frames, "size") else frames[0], request, card))
    resolved = dataclasses.replace(request, **filled)
    validate(resolved, card)
    check_blocks(resolved, card)
    object.__setattr__(resolved, _RESOLVED, card)  # not a field: replace() does not copy it
    return resolved


_RESOLVED = "_resolved_for"


FRAME_FIELDS = ("height", "width", "num_frames", "fps")
"""Request fields audio-only cards refuse: they make no frames."""


def _resolve_audio(r: GenerationRequest, card: ModelCard) -> dict[str, Any]:
    """Audio-only cards: refuse frame fields, fill and check seconds (their audio_length block's options)."""
    spec = card.audio
    if spec is None:
        return {}
    for name in FRAME_FIELDS:  # the card's defaults stand for "no frames" (so a resolved request resolves again)
        if getattr(r, name) not in (None, getattr(card.sampling_defaults, name)):
            raise InvalidRequest(name, f"{card.model_id} makes audio only (no frames or size); give seconds instead")
    seconds, start = r.option("seconds"), r.option("seconds_start")
    if not spec.takes_start and start not in (None, spec.min_start):
        raise InvalidRequest("seconds_start", f"{card.model_id} takes no seconds_start: its clips start at "
                                              f"{spec.min_start:g} s")
    start = spec.min_start if start is None else start
    check_float("seconds_start", start, minimum=spec.min_start, maximum=spec.max_end, open_min=False)
    seconds = min(spec.default_seconds, spec.max_end - start) if seconds is None else seconds
    check_float("seconds", seconds, minimum=spec.min_seconds, maximum=spec.max_seconds,
                 open_min=spec.min_seconds == 0.0)
    if start + seconds > spec.max_end:
        raise InvalidRequest("seconds", f"seconds_start {start:g} + seconds {seconds:g} ends past "
                                        f"{spec.max_end:g} s, the latest end {card.model_id} is conditioned on")
    first, end = spec.clip_samples(start, seconds)
    if end <= first:
        raise InvalidRequest("seconds", f"{seconds:g} s from {start:g} s holds no sample at {spec.sample_rate} Hz")
    return {"seconds": float(seconds), "seconds_start": float(start)}
