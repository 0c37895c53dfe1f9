"""What a diffusers pipeline class takes and gives, read from its `__call__` signature and its output class.

The adapter maps our request fields onto the pipeline's own keyword arguments; this module decides, once per
class, which of them exist, their defaults, how the pipeline reports steps and what kind of output it makes.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types
import typing
from dataclasses import dataclass
from typing import Any, Mapping

from vidloom.core.errors import CheckpointError

# Our request field -> the pipeline keyword arguments that carry it, in preference order (the first one the
# signature has wins). guidance_scale: Qwen-Image's real CFG is `true_cfg_scale` (its `guidance_scale` feeds a
# guidance-distilled embedding that the base model does not have).
FIELD_ARGS: Mapping[str, tuple[str, ...]] = {
    "negative_prompt": ("negative_prompt",),
    "height": ("height",),
    "width": ("width",),
    "num_frames": ("num_frames",),
    "fps": ("fps", "frame_rate"),
    "num_inference_steps": ("num_inference_steps",),
    "guidance_scale": ("true_cfg_scale", "guidance_scale"),
    "image": ("image",),
    "video": ("video",),
    # Audio pipelines' clip length: AudioLDM/AudioLDM2/MusicLDM take its length, Stable Audio where it ends
    # (audio_end_in_s, after audio_start_in_s), Stable Audio 3 its duration.
    "seconds": ("audio_length_in_s", "audio_end_in_s", "duration"),
    "seconds_start": ("audio_start_in_s",),
}
OUTPUT_KINDS = ("video", "image", "audio")
# A pipeline whose call takes no step hook (HunyuanVideo-1.5) runs as one opaque step: progress at its start and
# end, cancellation only before it starts.
NO_HOOK = "none"
# The output dataclass field that holds each kind (diffusers' *PipelineOutput classes).
_OUTPUT_FIELDS = {"frames": "video", "videos": "video", "images": "image", "audios": "audio"}


@dataclass(frozen=True)
class PipelineShape:
    """One pipeline class as the adapter sees it."""

    class_name: str
    args: Mapping[str, str]  # our request field -> the pipeline's keyword for it
    defaults: Mapping[str, Any]  # our request field -> the signature's default (None: the pipeline decides)
    required: frozenset[str]  # our request fields the pipeline cannot run without (no default)
    hook: str  # "callback_on_step_end" (diffusers' current step hook), "callback" (the older one) or NO_HOOK
    output: str  # one of OUTPUT_KINDS
    takes_output_type: bool  # whether `output_type="np"` can be asked for
    text_tokens: int | None = None  # the signature's max_sequence_length default: prompt tokens the encoder reads


def pipeline_class(name: str) -> type:
    """The diffusers pipeline class `name` (model_index.json's `_class_name`); CheckpointError when diffusers has none."""
    try:
        import diffusers
    except ImportError:
        raise CheckpointError(f"pipeline class {name!r} has no native recipe and the adapter that runs it needs "
                              "diffusers: pip install 'vidloom[diffusers]'") from None
    cls = getattr(diffusers, name, None)
    if not isinstance(cls, type) or not issubclass(cls, diffusers.DiffusionPipeline):
        raise CheckpointError(f"pipeline class {name!r} is not a diffusers {diffusers.__version__} pipeline")
    return cls


def read_shape(cls: type) -> PipelineShape:
    """The shape of pipeline class `cls`; CheckpointError when it is not a text-conditioned sampler."""
    params = inspect.signature(cls.__call__).parameters
    if "callback_on_step_end" in params:
        hook = "callback_on_step_end"
    elif "callback" in params and "callback_steps" in params:
        hook = "callback"
    else:
        hook = NO_HOOK
    if "prompt" not in params or "generator" not in params:
        raise CheckpointError(f"{cls.__name__}.__call__ takes no prompt or no generator: not a text-conditioned sampler")
    args: dict[str, str] = {}
    defaults: dict[str, Any] = {}
    required: set[str] = set()
    for field, candidates in FIELD_ARGS.items():
        arg = next((a for a in candidates if a in params), None)
        if arg is None:
            continue
        args[field] = arg
        default = params[arg].default
        if default is inspect.Parameter.empty:
            required.add(field)
            default = None
        defaults[field] = default
    tokens = params["max_sequence_length"].default if "max_sequence_length" in params else None
    return PipelineShape(class_name=cls.__name__, args=args, defaults=defaults, required=frozenset(required),
                         hook=hook, output=output_kind(cls, params), takes_output_type="output_type" in params,
                         text_tokens=tokens if isinstance(tokens, int) and tokens > 0 else None)


def output_kind(cls: type, params: Mapping[str, inspect.Parameter]) -> str:
    """video / image / audio: from the output dataclass `__call__` returns (its annotation, else the one its
    module imports); from the signature for a class that names neither."""
    for output_cls in _annotated_outputs(cls) or _module_outputs(cls):
        kinds = {_OUTPUT_FIELDS[f.name] for f in dataclasses.fields(output_cls) if f.name in _OUTPUT_FIELDS}
        if len(kinds) == 1:
            return kinds.pop()
    if "audio_length_in_s" in params or "audio_end_in_s" in params:
        return "audio"
    return "video" if "num_frames" in params else "image"


def _annotated_outputs(cls: type) -> list[type]:
    annotation = getattr(cls.__call__, "__annotations__", {}).get("return")
    if isinstance(annotation, str):
        try:
            annotation = typing.get_type_hints(cls.__call__).get("return")
        except Exception:  # an annotation that names something its module does not import
            return []
    members = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    return [m for m in members if isinstance(m, type) and dataclasses.is_dataclass(m)]


def _module_outputs(cls: type) -> list[type]:
    from diffusers.utils import BaseOutput

    module = sys.modules.get(cls.__module__)
    found = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, BaseOutput)] if module else []
    return found if len(found) == 1 else []
