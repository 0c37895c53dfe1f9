"""The value rules of a resolved GenerationRequest: numbers, text, LoRA pairs, the card's geometry and recipe.

Shared with chat and speech requests (check_int / check_float), so every request kind refuses a bad number alike.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from vidloom.core.errors import InvalidRequest, LimitExceeded
from vidloom.core.limits import RequestLimits
from vidloom.core.task import Task

if TYPE_CHECKING:
    from vidloom.core.card import ModelCard
    from vidloom.core.request import GenerationRequest

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


def validate(r: GenerationRequest, card: ModelCard) -> None:
    """Every filled field of `r` against the hard bounds and `card`; InvalidRequest naming the first bad one."""
    max_chars = RequestLimits.prompt_chars(card)
    check_text("prompt", r.prompt, max_chars)
    if not r.prompt.strip():
        raise InvalidRequest("prompt", "must be a non-empty string")
    if r.negative_prompt is not None:
        check_text("negative_prompt", r.negative_prompt, max_chars)
    try:
        task = Task(r.task)
    except ValueError:
        known = ", ".join(t.value for t in Task)
        raise InvalidRequest("task", f"unknown task {r.task!r}; known: {known}") from None
    if task not in card.tasks:
        served = ", ".join(sorted(t.value for t in card.tasks)) or "no generation task, only chat (ar_decode)"
        raise InvalidRequest("task", f"{card.model_id} does not serve {task.value}; it serves: {served}")
    check_int("num_inference_steps", r.num_inference_steps, minimum=1)
    check_int("fps", r.fps, minimum=1, maximum=MAX_FPS)
    check_int("seed", r.seed, minimum=0, maximum=MAX_SEED)
    _validate_geometry(r, card)
    check_float("guidance_scale", r.guidance_scale, minimum=0.0, maximum=MAX_GUIDANCE, open_min=False)
    check_float("flow_shift", r.flow_shift, minimum=MIN_FLOW_SHIFT, maximum=MAX_FLOW_SHIFT, open_min=False)
    if r.step_cache_threshold is not None:
        check_float("step_cache_threshold", r.step_cache_threshold, minimum=0.0, maximum=MAX_STEP_CACHE_THRESHOLD,
                    open_min=False)
    strength = r.option("strength")
    if r.video is not None and strength is not None and int(r.num_inference_steps * strength) < 1:
        raise InvalidRequest("strength", f"{strength} of {r.num_inference_steps} steps is no denoising step; "
                                         "raise strength or num_inference_steps")
    _validate_recipe(r, card)


def _validate_geometry(r: GenerationRequest, card: ModelCard) -> None:
    multiple = card.geometry.spatial_multiple
    for name in ("height", "width"):
        value = getattr(r, name)
        check_int(name, value, minimum=multiple)
        if value % multiple:
            raise InvalidRequest(name, f"{value} is not divisible by {multiple}, the model's spatial factor")
    check_int("num_frames", r.num_frames, minimum=1)
    step = card.geometry.temporal_factor
    if (r.num_frames - 1) % step:
        raise InvalidRequest(
            "num_frames",
            f"{r.num_frames} frames cannot be encoded; the VAE needs {step}k+1 frames (e.g. 1, {step + 1}, {2 * step + 1}, ...)",
        )


def _validate_recipe(r: GenerationRequest, card: ModelCard) -> None:
    """A post-trained checkpoint runs only as it was trained; the sampler must be one its loops take."""
    recipe = card.recipe
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


def checked_loras(loras: Any) -> tuple[tuple[str, float], ...]:
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


def check_text(name: str, value: object, max_chars: int) -> None:
    if not isinstance(value, str):
        raise InvalidRequest(name, f"must be a string, got {type(value).__name__}")
    if len(value) > max_chars:
        raise LimitExceeded(name, f"{len(value)} characters is more than the limit of {max_chars} "
                                  "(max_prompt_chars: the text encoder reads only so many tokens)", "max_prompt_chars")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: no tokenizer, database or JSON encoder takes it
        raise InvalidRequest(name, f"is not valid Unicode (unpaired surrogate at character {exc.start})") from None


def check_float(name: str, value: object, *, minimum: float, maximum: float, open_min: bool) -> None:
    """A real number in [minimum, maximum] ((minimum, maximum] with open_min); NaN and inf are refused."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InvalidRequest(name, f"must be a number, got {shown(value)}")
    bound = f"> {minimum:g}" if open_min else f">= {minimum:g}"
    # Ints are finite and compare exactly with floats; math.isfinite(10**400) would raise OverflowError.
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidRequest(name, f"must be a finite number {bound}, got {shown(value)}")
    if value < minimum or (open_min and value == minimum):
        raise InvalidRequest(name, f"must be a number {bound}, got {shown(value)}")
    if value > maximum:
        raise InvalidRequest(name, f"must be at most {maximum:g}, got {shown(value)}")


def check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidRequest(name, f"must be an integer, got {shown(value)}")
    if value < minimum:
        raise InvalidRequest(name, f"must be >= {minimum}, got {shown(value)}")
    if maximum is not None and value > maximum:
        raise InvalidRequest(name, f"must be at most {maximum}, got {shown(value)}")


def shown(value: object, limit: int = 64) -> str:
    """A caller's value for an error message, cut to `limit` characters (a 10**5000 int has no repr at all)."""
    try:
        text = repr(value)
    except ValueError:  # an int with more digits than sys.get_int_max_str_digits() allows
        return f"an integer of {value.bit_length()} bits"  # type: ignore[union-attr]
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
