"""Load an adapted pipeline folder with diffusers itself: one resident pipeline, its modules shared by requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vidloom.core.card import ModelCard
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError, DeployError
from vidloom.core.instance import ModelInstance
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.loading.quiet import quiet_loading
from vidloom.families.diffusers_adapter.signature import pipeline_class, read_shape

# Our --attention-backend names -> diffusers' attention dispatcher backends (diffusers.models.attention_dispatch).
DIFFUSERS_ATTENTION = {"sdpa": "native", "math": "_native_math", "flash": "flash", "sage": "sage"}
DENOISERS = ("transformer", "unet")
TEXT_ENCODERS = ("text_encoder", "text_encoder_2", "text_encoder_3")


def load_instance(
    card: ModelCard, checkpoint: Path, device: torch.device, dtype: torch.dtype | None, deploy: DeployConfig
) -> ModelInstance:
    """`DiffusionPipeline.from_pretrained` of the folder's class; CPU computes in float32, CUDA in bfloat16."""
    ckpt = DiffusersDir.open(checkpoint)
    cls = pipeline_class(ckpt.pipeline_class)
    shape = read_shape(cls)
    compute = dtype or (getattr(torch, card.precision) if device.type == "cuda" else torch.float32)
    try:
        with quiet_loading():  # diffusers was not imported when the caller's quiet block began
            pipe = cls.from_pretrained(str(ckpt.root), dtype=compute)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise CheckpointError(f"{ckpt.root}: diffusers could not load it as {cls.__name__} ({exc})") from None
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)  # progress goes through the runtime's events
    if deploy.attention_backend != DeployConfig().attention_backend:
        set_attention_backend(pipe, deploy.attention_backend)
    components: dict[str, Any] = {"pipeline": pipe, "shape": shape,
                                  "text_encoder_hooks": offload_text_encoders(pipe, device) if deploy.offload_text_encoder
                                  else ()}
    if shape.output == "audio":
        components["sample_rate"] = audio_sample_rate(pipe, ckpt.root)
    return ModelInstance(card=card, components=components, device=device, dtype=compute,
                         checkpoint_dir=str(ckpt.root), deploy=deploy)


def set_attention_backend(pipe: Any, name: str) -> None:
    """diffusers' own attention dispatch on the denoiser (flash-attn / SageAttention kernels, when installed)."""
    if name not in DIFFUSERS_ATTENTION:
        raise DeployError(f"unknown attention backend {name!r}; known: {', '.join(DIFFUSERS_ATTENTION)}")
    denoiser = next((getattr(pipe, n) for n in DENOISERS if getattr(pipe, n, None) is not None), None)
    if denoiser is None or not hasattr(denoiser, "set_attention_backend"):
        raise DeployError(f"attention_backend (--attention-backend): {type(pipe).__name__} has no denoiser that "
                          "takes diffusers' attention backends")
    try:
        denoiser.set_attention_backend(DIFFUSERS_ATTENTION[name])
    except (ValueError, RuntimeError, ImportError) as exc:  # the kernel's package is missing, or no CUDA
        raise DeployError(f"attention_backend (--attention-backend) {name!r}: diffusers refused it ({exc})") from None


def offload_text_encoders(pipe: Any, device: torch.device) -> tuple[Any, ...]:
    """Keep the pipeline's text encoders in host memory: accelerate's offload hook moves each to `device` when the
    pipeline calls it, and the loop sends it back once encoding is done (its first step; see loop.py)."""
    try:
        from accelerate import cpu_offload_with_hook
    except ImportError:
        raise DeployError("offload_text_encoder (--offload-text-encoder) on an adapted pipeline needs accelerate: "
                          "pip install 'vidloom[diffusers]'") from None
    hooks = []
    for name in TEXT_ENCODERS:
        module = getattr(pipe, name, None)
        if isinstance(module, torch.nn.Module):
            module.to("cpu")
            hooks.append(cpu_offload_with_hook(module, execution_device=device)[1])
    if not hooks:
        raise DeployError(f"offload_text_encoder (--offload-text-encoder): {type(pipe).__name__} has no text encoder")
    return tuple(hooks)


def audio_sample_rate(pipe: Any, root: Path) -> int:
    """The rate of the waveform the pipeline returns: its vocoder's (AudioLDM), else its VAE's (Stable Audio)."""
    for holder in (getattr(pipe, "vocoder", None), getattr(pipe, "vae", None)):
        rate = getattr(getattr(holder, "config", None), "sampling_rate", None)
        if isinstance(rate, int) and rate > 0:
            return rate
    raise CheckpointError(f"{root}: {type(pipe).__name__} makes audio but neither its vocoder nor its VAE config "
                          "states a sampling_rate")
