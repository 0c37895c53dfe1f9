"""Cards for diffusers pipeline folders that no native recipe claims: the pipeline runs as one opaque loop.

The card comes from `model_index.json` (the class) and the class's `__call__` signature (the fields it takes and
their defaults); sizes follow the VAE and denoiser configs. None of the runtime's accelerations reach inside a
pipeline we do not own, so every deploy feature is refused by name; only diffusers' own attention backend switch
and text-encoder offload are offered (see load.py).

Sizes must be multiples of the VAE's factor times the patch (a pipeline resizes or refuses others); frame counts
are the pipeline's to decide (Wan rounds them to 4k+1, Helios trims 66 to 65): its own input check runs at submit
(preflight.py), and no rule of a VAE the adapter does not own is applied.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from vidloom.core.capabilities import FEATURES, Capabilities
from vidloom.core.blocks import AUDIO_LENGTH
from vidloom.core.card import BlockSpec, ComponentSpec, Geometry, LoopSpec, ModelCard, RecipeSpec, SamplingDefaults
from vidloom.core.errors import CheckpointError
from vidloom.core.request import OPTIONAL_FIELDS, Task
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.families.diffusers_adapter.audio import audio_spec
from vidloom.families.diffusers_adapter.signature import PipelineShape, pipeline_class, read_shape

FAMILY = "diffusers-adapter"
PROGRAM = "vidloom.families.diffusers_adapter.program:build_program"
LOOP = "pipeline"
SAMPLER = "pipeline"  # the pipeline's own scheduler, as saved in its folder
REASON = "adapted diffusers pipeline: the runtime does not reach inside its step"
# Applied by load.py through diffusers' own machinery: its attention dispatcher (ModelMixin.set_attention_backend)
# on the denoiser; accelerate's offload hooks on the text encoders, sent back to the host after encoding (loop.py).
SUPPORTED = frozenset({"attention_backend", "offload_text_encoder"})
CAPABILITIES = Capabilities(SUPPORTED, {name: REASON for name in FEATURES if name not in SUPPORTED})
CAPABILITY_ROWS = {"adapted diffusers pipeline": CAPABILITIES}  # `vidloom models --capabilities`

# What the folder does not say, per output kind: the size the class's own examples use for a model that keeps
# it outside its configs (Mochi: 480x848, Qwen-Image: 1024x1024), and the rate frames are written at.
FALLBACK_SIZE = {"video": (480, 848), "image": (1024, 1024), "audio": (1, 1)}
FALLBACK_FPS = {"video": 16, "image": 1, "audio": 1}
FALLBACK_STEPS = 50
DENOISERS = ("transformer", "unet")


def card_from_checkpoint(path: str | Path) -> ModelCard:
    """A card for any diffusers pipeline folder whose class diffusers ships and which has a per-step hook."""
    ckpt = DiffusersDir.open(path)
    cls = pipeline_class(ckpt.pipeline_class)
    shape = read_shape(cls)
    denoiser = next((ckpt.component_config(n) for n in DENOISERS if (ckpt.root / n / "config.json").is_file()), {})
    vae = ckpt.component_config("vae") if (ckpt.root / "vae" / "config.json").is_file() else {}
    vocoder = ckpt.component_config("vocoder") if (ckpt.root / "vocoder" / "config.json").is_file() else {}
    return adapted_card(ckpt.root.name, str(ckpt.root), shape, denoiser, vae,
                        components=pipeline_components(ckpt.index),
                        vocoder=vocoder)


def pipeline_components(index: dict[str, Any]) -> list[str]:
    """model_index.json's component names: the entries that name a (library, class); a pipeline's own config
    values (Helios' `is_distilled: true`) and empty slots are not components."""
    return [k for k, v in index.items() if not k.startswith("_") and isinstance(v, list) and len(v) == 2 and v[0]]


def adapted_card(model_id: str, source: str, shape: PipelineShape, denoiser: dict[str, Any], vae: dict[str, Any],
                 components: list[str], precision: str = "bfloat16", notes: tuple[str, ...] = (),
                 vocoder: dict[str, Any] | None = None) -> ModelCard:
    """The card of a pipeline of `shape` whose denoiser, VAE (and vocoder, for audio) have these configs."""
    kind = shape.output
    visual = kind != "audio"
    multiple = _vae_scale(vae) * _patch(denoiser) if visual else 1
    temporal = _temporal_factor(vae) if kind == "video" else 1
    height, width = _default_size(shape, denoiser, vae, multiple)
    defaults = SamplingDefaults(
        height=height, width=width, num_frames=_default_frames(shape, denoiser, temporal),
        fps=_int_or(shape.defaults.get("fps"), FALLBACK_FPS[kind]),
        num_inference_steps=_int_or(shape.defaults.get("num_inference_steps"), FALLBACK_STEPS),
        guidance_scale=float(shape.defaults.get("guidance_scale") or 1.0),
        flow_shift=1.0, sampler=SAMPLER,
    )
    taken = {f for f in shape.args if f in OPTIONAL_FIELDS}
    if kind == "video":
        taken.add("fps")  # the written video's frame rate, passed on when the pipeline takes one
    inputs = frozenset(f for f in ("image", "video") if f in shape.args)
    audio = audio_spec(shape, denoiser, vae, vocoder or {})
    return ModelCard(
        model_id=model_id,
        family=FAMILY,
        components={name: ComponentSpec() for name in components},
        loops={LOOP: LoopSpec(samplers=(SAMPLER,))},
        tasks=_tasks(shape),
        precision=precision,
        sampling_defaults=defaults,
        geometry=Geometry(spatial_multiple=multiple, temporal_factor=1),
        recipe=RecipeSpec(method="pretrained", loop=LOOP),
        program=PROGRAM,
        source=source,
        description=f"{shape.class_name} ({kind}) from {source}, run by diffusers through the adapter",
        notes=(f"adapted diffusers pipeline {shape.class_name}: runtime accelerations do not apply", *notes),
        max_prompt_tokens=shape.text_tokens,  # bounds prompt length (core.limits); None: the default bound
        inputs=inputs,
        required_inputs=frozenset(f for f in inputs if f in shape.required),
        max_reference_images=1 if "image" in inputs and kind == "image" else 0,
        produces_audio=kind == "audio",
        audio=audio,  # seconds -> the pipeline's length argument
        request_blocks=(BlockSpec(AUDIO_LENGTH),) if audio is not None else (),
        capabilities=CAPABILITIES,
        optional_fields=frozenset(taken),
    )


def _tasks(shape: PipelineShape) -> frozenset[Task]:
    if shape.output == "audio":
        return frozenset({Task.T2A})
    if shape.output == "image":
        return frozenset({Task.T2I})
    tasks = set()
    if not shape.required & {"image", "video"}:
        tasks.add(Task.T2V)
    if "image" in shape.args:
        tasks.add(Task.I2V)
    if "video" in shape.args:
        tasks.add(Task.V2V)
    return frozenset(tasks)


def _vae_scale(vae: dict[str, Any]) -> int:
    """Pixels per latent cell, as the pipelines derive it from their VAE's config."""
    if "spatial_expansions" in vae:  # Mochi
        return math.prod(vae["spatial_expansions"])
    if "temperal_downsample" in vae:  # Wan-style VAEs (Qwen-Image, Wan): one 2x per level
        return 2 ** len(vae["temperal_downsample"])
    if "spatial_compression_ratio" in vae:  # LTX-Video and others that state it
        return int(vae["spatial_compression_ratio"])
    if "block_out_channels" in vae:  # AutoencoderKL and CogVideoX: one 2x per level but the last
        return 2 ** (len(vae["block_out_channels"]) - 1)
    return 8


def _patch(denoiser: dict[str, Any]) -> int:
    patch = denoiser.get("patch_size", 1)
    if isinstance(patch, (list, tuple)):  # (t, h, w)
        patch = patch[-1]
    return int(patch) if isinstance(patch, int) and patch > 0 else 1


def _temporal_factor(vae: dict[str, Any]) -> int:
    if "temporal_expansions" in vae:  # Mochi
        return math.prod(vae["temporal_expansions"])
    if "temperal_downsample" in vae:
        return 2 ** sum(bool(x) for x in vae["temperal_downsample"])
    ratio = vae.get("temporal_compression_ratio")
    return int(ratio) if isinstance(ratio, (int, float)) and ratio >= 1 else 1


def _default_size(shape: PipelineShape, denoiser: dict[str, Any], vae: dict[str, Any], multiple: int) -> tuple[int, int]:
    scale = _vae_scale(vae)
    fallback = FALLBACK_SIZE[shape.output]
    if isinstance(denoiser.get("sample_height"), int) and isinstance(denoiser.get("sample_width"), int):
        fallback = (denoiser["sample_height"] * scale, denoiser["sample_width"] * scale)  # CogVideoX
    elif isinstance(denoiser.get("sample_size"), int) and shape.output == "image":
        fallback = (denoiser["sample_size"] * scale,) * 2
    size = [_int_or(shape.defaults.get(name), value) for name, value in zip(("height", "width"), fallback)]
    if any(value < multiple for value in size):
        raise CheckpointError(f"{shape.class_name}: default size {size} is smaller than its size multiple {multiple}")
    return size[0] // multiple * multiple, size[1] // multiple * multiple


def _default_frames(shape: PipelineShape, denoiser: dict[str, Any], temporal: int) -> int:
    if shape.output != "video":
        return 1
    frames = _int_or(shape.defaults.get("num_frames"), _int_or(denoiser.get("sample_frames"), 8 * temporal + 1))
    return (frames - 1) // temporal * temporal + 1


def _int_or(value: Any, fallback: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else fallback
