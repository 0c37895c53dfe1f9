"""Load a HunyuanVideo-1.5 card's checkpoint: our transformer, the VAE, transformers' Qwen2.5-VL text model and
ByT5 glyph encoder, the scheduler and guider settings."""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom.core.card import ModelCard
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError
from vidloom.core.instance import ModelInstance
from vidloom.layers.attention import AttentionFn, attention, resolve_attention
from vidloom.loading.component_file import build_component, component_files
from vidloom.loading.diffusers_dir import DiffusersDir, read_json
from vidloom.loading.precision import default_compute_dtype, vae_dtype
from vidloom.families.hunyuan15.cards import LatentGeometry, check_pipeline
from vidloom.families.hunyuan15.image import Hunyuan15ImageEncoder
from vidloom.families.hunyuan15.schedule import Hunyuan15Guider, Hunyuan15Schedule
from vidloom.families.hunyuan15.text import Hunyuan15TextEncoder
from vidloom.text_encoders.elsewhere import encoder_or_elsewhere
from vidloom.families.hunyuan15.transformer import (
    HUNYUAN15_TRANSFORMER_NAME_MAP, Hunyuan15Transformer, Hunyuan15TransformerConfig,
)


def load_transformer(folder: Path, device: torch.device, dtype: torch.dtype, file: Path | None = None,
                     attention_fn: AttentionFn = attention) -> Hunyuan15Transformer:
    """A diffusers `transformer/` folder (config.json + safetensors) as our transformer, in `dtype` on `device`."""
    config = Hunyuan15TransformerConfig.from_diffusers(read_json(Path(folder) / "config.json"))
    return build_component(lambda: Hunyuan15Transformer(config, attention_fn), Path(folder),
                           HUNYUAN15_TRANSFORMER_NAME_MAP, file, (), device, dtype,
                           Hunyuan15Transformer.KEEP_FP32).eval()


def load_vae(folder: Path, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The `vae/` folder as Hunyuan15VAE (imported here only: the denoiser runs without it)."""
    from vidloom.families.hunyuan15.vae import Hunyuan15VAE
    from vidloom.loading.component_file import load_component
    from vidloom.loading.name_map import NameMap

    vae = Hunyuan15VAE.from_config(read_json(folder / "config.json"))
    load_component(vae, folder, NameMap(()))  # its keys are diffusers' own
    return vae.to(device=device, dtype=dtype).eval()


def load_denoiser(ckpt: DiffusersDir, device: torch.device, compute: torch.dtype,
                  deploy: DeployConfig, text_encoder_here: bool = True) -> dict[str, object]:
    """Everything but the VAE: transformer, text (and image) encoders, schedule, guider and the latent layout.

    `text_encoder_here`: False on a rank that receives encoded prompts from the rank holding the text encoder
    (parallel.text_encoder_rank): that rank's `text_encoder` is an EncoderElsewhere and its weights are never read.
    """
    extra: dict[str, object] = {}
    files = component_files(deploy.components, (), str(ckpt.root))
    dit_config = ckpt.parse_component("transformer", Hunyuan15TransformerConfig.from_diffusers)
    latent = ckpt.parse_component("vae", LatentGeometry.from_diffusers)
    if latent.channels != dit_config.latent_channels or dit_config.out_channels != latent.channels:
        raise CheckpointError(f"{ckpt.root}: VAE latent_channels {latent.channels}, transformer in_channels "
                              f"{dit_config.in_channels} / out_channels {dit_config.out_channels} (expected "
                              f"2 x {latent.channels} + 1 and {latent.channels})")
    attention_fn = resolve_attention(deploy.attention_backend, device, compute)
    transformer = load_transformer(ckpt.component_dir("transformer"), device, compute, files.get("transformer"),
                                   attention_fn)
    text = encoder_or_elsewhere(lambda: Hunyuan15TextEncoder.load(
        ckpt.root, device, compute, offload=deploy.offload_text_encoder, cache_size=deploy.prompt_cache_size),
        deploy, text_encoder_here)
    if isinstance(text, Hunyuan15TextEncoder) and (text.width != dit_config.text_dim  # the rank holding it checks
                                                   or text.glyph_width != dit_config.glyph_dim):
        raise CheckpointError(f"{ckpt.root}: text encoder widths {text.width} / {text.glyph_width}, transformer reads "
                              f"text_embed_dim {dit_config.text_dim} / text_embed_2_dim {dit_config.glyph_dim}")
    if ckpt.has("image_encoder"):
        images = Hunyuan15ImageEncoder.load(ckpt.root, device, compute)
        if images.width != dit_config.image_dim:
            raise CheckpointError(f"{ckpt.root}: image encoder hidden size {images.width}, transformer reads "
                                  f"image_embed_dim {dit_config.image_dim}")
        extra["image_encoder"] = images
    return {
        **extra,
        "transformer": transformer,
        "text_encoder": text,
        "schedule": ckpt.parse_component("scheduler", Hunyuan15Schedule.from_diffusers, "scheduler_config.json"),
        "guider": ckpt.parse_component("guider", Hunyuan15Guider.from_diffusers, "guider_config.json"),
        "latent_geometry": latent,
    }


def load_instance(card: ModelCard, checkpoint: Path, device: torch.device, dtype: torch.dtype | None,
                  deploy: DeployConfig, text_encoder_here: bool = True) -> ModelInstance:
    """Read `checkpoint` (a diffusers HunyuanVideo15Pipeline folder); CPU computes in `cpu_default_dtype()`;
    `text_encoder_here` as for load_denoiser."""
    ckpt = DiffusersDir.open_checked(checkpoint, check_pipeline, card.components)
    compute = default_compute_dtype(card.precision, device, dtype)
    components = load_denoiser(ckpt, device, compute, deploy, text_encoder_here)
    components["vae"] = load_vae(ckpt.component_dir("vae"), device,
                                 vae_dtype(card.components["vae"].dtype, device, compute))
    return ModelInstance(card=card, components=components, device=device, dtype=compute,
                         checkpoint_dir=str(ckpt.root), deploy=deploy)
