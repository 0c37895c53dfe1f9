"""RequestLimits: how much work one request may ask for, checked in one place for every family and task.

The server and the Python API both check a resolved request here (defaults filled in);
each limit names the request field it bounds, so the error says what to change. Defaults
come from the model card: a multiple of the card's own defaults, which is what the model
was made for, plus a memory estimate the family's recipe provides (`ModelCard.memory_estimator`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from vidloom.core.errors import LimitExceeded

if TYPE_CHECKING:
    from vidloom.core.card import ModelCard
    from vidloom.core.request import GenerationRequest

MemoryEstimate = Callable[["GenerationRequest"], int]
"""Bytes a resolved request needs on its device beyond the resident weights (peak activations)."""

# Card-derived defaults: multiples of what the card samples by default.
PIXELS_PER_DEFAULT = 4  # e.g. Wan2.1 1.3B (832x480 default) allows up to ~1.6 Mpx, i.e. 1280x1248
FRAMES_PER_DEFAULT = 4  # latent frames: Wan2.1's 81 frames -> 321
STEPS_PER_DEFAULT = 20  # Wan2.1's 50 steps -> 1000
# A text encoder reads `max_prompt_tokens` tokens; a token is rarely longer than this many characters,
# so a longer prompt is rejected before it is tokenized or stored (Wan's 512 tokens -> 8192 chars).
CHARS_PER_TOKEN = 16
DEFAULT_PROMPT_CHARS = 8192  # for a card that declares no text length


@dataclass(frozen=True)
class RequestLimits:
    """Upper bounds on one request; each field's error names the request field it bounds. None: not checked."""

    max_pixels: int | None = None  # width * height of one frame (field: size / height, width)
    max_frames: int | None = None  # num_frames
    max_steps: int | None = None  # num_inference_steps
    max_prompt_chars: int | None = None  # prompt and negative_prompt, in characters
    max_memory_bytes: int | None = None  # estimated peak memory of one request beyond the weights

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{f.name}: must be an integer >= 1, got {value!r}")

    @staticmethod
    def prompt_chars(card: ModelCard) -> int:
        """The prompt length a card's text encoder can use, in characters."""
        tokens = card.max_prompt_tokens
        return CHARS_PER_TOKEN * tokens if tokens else DEFAULT_PROMPT_CHARS

    @classmethod
    def from_card(cls, card: ModelCard, max_memory_bytes: int | None = None) -> RequestLimits:
        """Server defaults derived from the card's sampling defaults and text length."""
        d = card.sampling_defaults
        factor = card.geometry.temporal_factor
        latent_frames = (d.num_frames - 1) // factor + 1
        return cls(
            max_pixels=PIXELS_PER_DEFAULT * d.height * d.width,
            max_frames=factor * (FRAMES_PER_DEFAULT * latent_frames - 1) + 1,
            max_steps=STEPS_PER_DEFAULT * d.num_inference_steps,
            max_prompt_chars=cls.prompt_chars(card),
            max_memory_bytes=max_memory_bytes,
        )

    def with_overrides(self, **values: int | None) -> RequestLimits:
        """These limits with every non-None value in `values` replacing its field."""
        return dataclasses.replace(self, **{k: v for k, v in values.items() if v is not None})

    def check_prompt(self, name: str, text: str | None) -> None:
        """LimitExceeded naming `name` when `text` is longer than max_prompt_chars."""
        if self.max_prompt_chars is not None and text is not None and len(text) > self.max_prompt_chars:
            raise LimitExceeded(name, f"{len(text)} characters is more than the limit of "
                                      f"{self.max_prompt_chars} (max_prompt_chars)", "max_prompt_chars")

    def check(self, request: GenerationRequest, estimate: MemoryEstimate | None = None) -> None:
        """Raise InvalidRequest naming the first field over its limit; `request` must be resolved."""
        for name in ("prompt", "negative_prompt"):
            self.check_prompt(name, getattr(request, name))
        assert request.height is not None and request.width is not None, "resolve the request first"
        pixels = request.height * request.width
        if self.max_pixels is not None and pixels > self.max_pixels:
            raise LimitExceeded("width", f"{request.width}x{request.height} is {pixels} pixels per frame, "
                                         f"more than the limit of {self.max_pixels} (max_pixels)", "max_pixels")
        if self.max_frames is not None and request.num_frames is not None and request.num_frames > self.max_frames:
            raise LimitExceeded("num_frames", f"{request.num_frames} is more than the limit of "
                                              f"{self.max_frames} frames (max_frames)", "max_frames")
        steps = request.num_inference_steps
        if self.max_steps is not None and steps is not None and steps > self.max_steps:
            raise LimitExceeded("num_inference_steps", f"{steps} is more than the limit of {self.max_steps} (max_steps)",
                                "max_steps")
        if self.max_memory_bytes is not None and estimate is not None:
            self._check_memory(request, estimate, self.max_memory_bytes)

    @staticmethod
    def _check_memory(request: GenerationRequest, estimate: MemoryEstimate, limit: int) -> None:
        needed = estimate(request)
        if needed <= limit:
            return
        # Blame the size when even one frame does not fit, else the frame count.
        one_frame = dataclasses.replace(request, num_frames=1)
        field = "width" if request.num_frames == 1 or estimate(one_frame) > limit else "num_frames"
        raise LimitExceeded(
            field,
            f"{request.width}x{request.height} with {request.num_frames} frames needs an estimated "
            f"{format_bytes(needed)}, more than the per-request memory limit of "
            f"{format_bytes(limit)} (max_request_memory); ask for fewer frames or pixels",
            "max_request_memory",
        )


def format_bytes(n: int | None) -> str:
    if n is None:
        return "unlimited"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
