"""Load the generation side of a Cosmos3 Omni folder: the vision/sound pathways, the Wan2.2 VAE, UniPC settings.

The text backbone is the one the chat side already loaded (`load.load_text_model`): the generator
reads only the generation pathways' tensors, so one copy of the shared weights serves both.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from vidloom.core.errors import CheckpointError
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.loading.name_map import NameMap
from vidloom.loading.precision import materialize, vae_dtype
from vidloom.loading.safetensors_io import load_weights, skip_prefixes
from vidloom.families.cosmos3.audio import SoundDecoder, SoundDecoderConfig
from vidloom.families.cosmos3.gen_config import Cosmos3GenConfig
from vidloom.families.cosmos3.generation import (
    GEN_NAME_MAP,
    Cosmos3Generator,
    is_loaded_key,
)
from vidloom.models.wan.vae import WAN_VAE_NAME_MAP, WAN_VAE_POLICY, WanVAE, WanVAEConfig
from vidloom.families.cosmos3.pipeline_config import Cosmos3PipelineConfig
from vidloom.diffusion.sampler import load_sampler_config

# Every AutoencoderKLWan key the Wan VAE reader classifies; any other in vae/config.json is refused.
VAE_KEYS = WAN_VAE_POLICY.known
# diffusers keeps the timestep MLP in float32 (`_keep_in_fp32_modules`); so do we, so bf16 runs match it.
KEEP_FP32 = frozenset({"time_in", "time_out"})


def load_generator(folder: Path, device: torch.device, dtype: torch.dtype) -> Cosmos3Generator:
    """The vision (sound, action) pathways of a diffusers `transformer/` folder."""
    raw = DiffusersDir.open(folder.parent).component_config(folder.name)
    config = Cosmos3GenConfig.from_transformer_config(raw)
    model = materialize(lambda: Cosmos3Generator(config), device, dtype, KEEP_FP32)
    wanted = is_loaded_key(config)
    load_weights(model, folder, GEN_NAME_MAP, skip=lambda key: not wanted(key))
    return model.eval()


def load_generation(ckpt: DiffusersDir, device: torch.device, compute: torch.dtype,
                    pipeline: Cosmos3PipelineConfig) -> dict[str, Any]:
    """The components generation adds to the chat ones: generator, VAE (float32; bfloat16 on the CPU fast path),
    sampler config."""
    generator = load_generator(ckpt.component_dir("transformer"), device, compute)
    vae_config = read_vae_config(ckpt.component_config("vae"), f"{ckpt.root}/vae/config.json")
    vae = materialize(lambda: WanVAE(vae_config), torch.device("cpu"), torch.float32)  # the checkpoint fills it all
    load_weights(vae, ckpt.component_dir("vae"), WAN_VAE_NAME_MAP)
    # The pipeline, not the scheduler, decides where the flow sigmas start (use_native_flow_schedule).
    sampler = dataclasses.replace(load_sampler_config(ckpt), native_flow_schedule=pipeline.native_flow_schedule)
    components = {"generator": generator, "vae": vae.to(device, vae_dtype("float32", device, compute)).eval(), "sampler_config": sampler}
    if has_sound(ckpt):
        components["sound_decoder"] = load_sound_decoder(ckpt, generator.config.sound_dim)
    return components


def read_vae_config(raw: dict[str, Any], where: str) -> WanVAEConfig:
    """The Wan2.2 VAE's config; a key the Wan VAE policy does not know is a CheckpointError naming it."""
    try:
        return WanVAEConfig.from_diffusers(raw)
    except (CheckpointError, ValueError) as exc:
        raise CheckpointError(f"{where}: {exc}") from None


def has_sound(ckpt: DiffusersDir) -> bool:
    """A sound pathway in the transformer and an audio tokenizer folder to decode its latents."""
    config = ckpt.component_config("transformer")
    return bool(config.get("sound_gen")) and (ckpt.root / "sound_tokenizer").is_dir()


def load_sound_decoder(ckpt: DiffusersDir, sound_dim: int | None) -> SoundDecoder:
    """The AVAE's decoder in float32 on the CPU (its encoder weights, if shipped, are left unread)."""
    config = SoundDecoderConfig.from_diffusers(ckpt.component_config("sound_tokenizer"))
    if config.latent_dim != sound_dim:
        raise CheckpointError(f"{ckpt.root}: sound_tokenizer vocoder_input_dim {config.latent_dim} differs from "
                              f"the transformer's sound_dim {sound_dim}")
    holder = torch.nn.Module()
    holder.decoder = SoundDecoder(config)
    load_weights(holder, ckpt.component_dir("sound_tokenizer"), NameMap(()), skip=skip_prefixes(("encoder",)))
    return holder.decoder.eval()
