"""helios-demo: the Helios architecture (history latents, chunked rollout) at a tiny size with seeded random weights.

Written once into the user's cache as a HeliosPipeline folder and loaded through the same loader as real Helios
checkpoints, so the chunk rollout and its streaming run offline in seconds. Its weights are random: the video is
noise by design.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from vidloom.core.card import ModelCard, SamplingDefaults
from vidloom.demo.cache import DemoCheckpoint, noise_note
from vidloom.demo.writer import Part, model_index
from vidloom.families.helios.cards import DEFAULTS, helios_card
from vidloom.families.helios.config import HELIOS_TRANSFORMER_NAME_MAP, HeliosTransformerConfig
from vidloom.families.helios.transformer import HeliosTransformer
from vidloom.models.wan.demo_parts import CROSS_ATTENTION_SCALE, write_wan_demo_folder

DEMO_ID = "helios-demo"
DEMO_VERSION = 1  # bump when the demo's architecture or files change
DEMO_SEED = 20260306
DEMO_NOTE = noise_note(DEMO_ID, "Helios", "BestWishYsh/Helios-Base")

# The released transformer's switches (amplified history keys per head, zero-timestep history, text for the
# chunk's tokens only) at a tiny width.
DEMO_TRANSFORMER = {
    "_class_name": "HeliosTransformer3DModel",
    "patch_size": [1, 2, 2], "num_attention_heads": 2, "attention_head_dim": 16, "in_channels": 4,
    "out_channels": 4, "text_dim": 32, "freq_dim": 32, "ffn_dim": 64, "num_layers": 2, "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads", "eps": 1e-6, "added_kv_proj_dim": None, "rope_dim": [6, 6, 4],
    "rope_theta": 10000.0, "guidance_cross_attn": True, "zero_history_timestep": True,
    "has_multi_term_memory_patch": True, "is_amplify_history": True, "history_scale_mode": "per_head",
}
# A one-stage UniPC HeliosScheduler with the time shift by mu, as the base pipeline steps it.
DEMO_SCHEDULER = {"_class_name": "HeliosScheduler", "num_train_timesteps": 1000, "stages": 1,
                  "scheduler_type": "unipc", "solver_order": 2, "use_dynamic_shifting": True,
                  "time_shift_type": "exponential"}
MODEL_INDEX = model_index(
    "HeliosPipeline",
    scheduler="diffusers:HeliosScheduler", text_encoder="transformers:UMT5EncoderModel",
    tokenizer="transformers:T5TokenizerFast", transformer="diffusers:HeliosTransformer3DModel",
    vae="diffusers:AutoencoderKLWan",
)
# Two chunks (65 frames), few steps: the rollout and its streaming in seconds.
DEMO_DEFAULTS = dataclasses.replace(DEFAULTS, height=64, width=96, num_frames=65, fps=8, num_inference_steps=4)


def helios_demo_card(demo_id: str, defaults: SamplingDefaults, description: str, note: str,
                     **card: Any) -> ModelCard:
    """A demo's card (float32, its noise note last); `card`: helios_card's other fields (a pyramid's geometry)."""
    built = helios_card(demo_id, f"demo:{demo_id}", defaults, description, precision="float32", **card)
    return dataclasses.replace(built, notes=(*built.notes, note))


def write_helios_demo(folder: Path, seed: int, scheduler: dict[str, Any], index: dict[str, Any]) -> None:
    """A Helios pipeline folder (`index` names which) of the demo transformer from our own modules beside Wan's tiny
    VAE and UMT5 (diffusers can load it too)."""
    transformer = Part("transformer",
                       lambda: HeliosTransformer(HeliosTransformerConfig.from_diffusers(DEMO_TRANSFORMER)),
                       HELIOS_TRANSFORMER_NAME_MAP, DEMO_TRANSFORMER, scale=CROSS_ATTENTION_SCALE)
    write_wan_demo_folder(folder, transformer, seed, scheduler, index)


def demo_card() -> ModelCard:
    return helios_demo_card(DEMO_ID, DEMO_DEFAULTS, "Helios chunked long video (history latents, per-chunk "
                            "streaming) at a tiny size, random weights", DEMO_NOTE)


def write_demo_checkpoint(folder: Path) -> None:
    """A HeliosPipeline folder."""
    write_helios_demo(folder, DEMO_SEED, DEMO_SCHEDULER, MODEL_INDEX)


ensure_demo_checkpoint = DemoCheckpoint(DEMO_ID, DEMO_VERSION, write_demo_checkpoint).ensure
