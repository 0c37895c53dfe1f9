"""sana-wm-demo: the SANA-WM architecture at a tiny size with seeded random weights.

The camera-controlled bidirectional DiT (GDN and softmax blocks, UCPE camera branch, Plucker rays), the
LTX-2 video VAE (32x space, 8x time), a tiny Gemma-2 text encoder built by transformers and a BPE
tokenizer trained offline, plus the stage-2 LTX-2 refiner in refiner/
(demo_refiner.py). Written once into the user's cache as a SanaWMPipeline folder from our own
modules and loaded through the same loader as real checkpoints. Its weights are random: the video is
noise by design, but it follows the camera, the seed and the prompt like the real model's code path.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from vidloom.core.card import ModelCard
from vidloom.models.ltx2.demo_parts import DEMO_VIDEO_VAE as DEMO_VAE
from vidloom.models.ltx2.video_vae import LTX2_VIDEO_VAE_NAME_MAP, LTX2VideoVAE, LTX2VideoVAEConfig
from vidloom.families.sana_wm.config import SanaWMConfig
from vidloom.families.sana_wm.transformer import SANA_WM_NAME_MAP, SanaWMTransformer
from vidloom.demo.cache import DemoCheckpoint, noise_note
from vidloom.demo.tokenizer import train_gemma_tokenizer
from vidloom.demo.writer import Part, model_index, write_parts, write_pipeline_files
from vidloom.families.sana_wm.cards import DEFAULTS, sana_wm_card
from vidloom.families.sana_wm.demo_refiner import write_demo_refiner
from vidloom.families.sana_wm.text import CHI_PROMPT

DEMO_ID = "sana-wm-demo"
DEMO_VERSION = 4  # bump when the demo's architecture or files change
DEMO_SEED = 20261201
DEMO_NOTE = noise_note(DEMO_ID, "SANA-WM", "Efficient-Large-Model/SANA-WM_bidirectional-diffusers")
TEXT_HIDDEN = 16
CORPUS = (
    "a car driving across a vast desert plain at golden hour", "a quiet forest path with morning fog",
    "a city street at night with neon signs and rain", CHI_PROMPT,
)
DEMO_TRANSFORMER = {
    "_class_name": "SanaWMTransformer3DModel",
    "in_channels": 8, "num_layers": 2, "hidden_size": 64, "num_attention_heads": 2, "linear_head_dim": 32,
    "softmax_every_n": 2, "mlp_ratio": 2.0, "chunk_plucker_channels": 48, "chunk_plucker_post_attn_blocks": 20,
    "conv_kernel_size": 4, "k_conv_only": True, "t_kernel_size": 3, "caption_channels": TEXT_HIDDEN,
    "patch_size": [1, 1, 1],
}
# The cross-attention to the prompt, louder: logits x6 (the user's prompt is a few tokens after the long
# complex-human-instruction preamble, which at default init outweighs it) and output x4. At default init a new
# prompt moved the video by 0.9 levels on average.
CROSS_ATTENTION_SCALE = (("blocks.*.cross_attn.k_norm.weight", 3.0), ("blocks.*.cross_attn.q_norm.weight", 2.0),
                         ("blocks.*.cross_attn.proj.weight", 4.0))
DEMO_SCHEDULER = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 3.0}
MODEL_INDEX = model_index(
    "SanaWMPipeline",
    tokenizer="transformers:GemmaTokenizerFast", text_encoder="transformers:Gemma2Model",
    vae="diffusers:AutoencoderKLLTX2Video", transformer="diffusers:SanaWMTransformer3DModel",
    scheduler="diffusers:FlowMatchEulerDiscreteScheduler",
)
# Two latent cells by three, 17 frames (3 latent frames), a few steps: seconds on a CPU.
DEMO_DEFAULTS = dataclasses.replace(DEFAULTS, height=64, width=96, num_frames=17, num_inference_steps=4,
                                    flow_shift=DEMO_SCHEDULER["shift"])


def demo_card() -> ModelCard:
    return sana_wm_card(DEMO_ID, f"demo:{DEMO_ID}", multiple=32, temporal=8, defaults=DEMO_DEFAULTS,
                        description="SANA-WM camera-controlled image-to-video at a tiny size, random weights",
                        notes=(DEMO_NOTE,), precision="float32")


def write_demo_checkpoint(folder: Path) -> None:
    """A SanaWMPipeline folder from our own modules."""
    torch.manual_seed(DEMO_SEED)
    write_parts(folder, (
        # fill 0.2: zero-initialised short convs and tables would leave the camera path inert
        Part("transformer", lambda: SanaWMTransformer(SanaWMConfig.from_diffusers(DEMO_TRANSFORMER)), SANA_WM_NAME_MAP,
             DEMO_TRANSFORMER, fill_std=0.2, scale=CROSS_ATTENTION_SCALE),
        Part("vae", lambda: LTX2VideoVAE(LTX2VideoVAEConfig.from_diffusers(DEMO_VAE)), LTX2_VIDEO_VAE_NAME_MAP,
             DEMO_VAE, latent_seed=DEMO_SEED + 1),
    ))
    _add_unused_camera_embedder(folder / "transformer", DEMO_TRANSFORMER["hidden_size"])
    tokenizer = _train_tokenizer()
    _write_text_encoder(folder / "text_encoder", len(tokenizer) + 3)
    write_pipeline_files(folder, DEMO_SCHEDULER, MODEL_INDEX, tokenizer)
    write_demo_refiner(folder / "refiner")  # stage 2, run with --two-stage


def _add_unused_camera_embedder(folder: Path, hidden: int) -> None:
    """The released layout also holds the absolute-map camera embedder, which our loader skips (its path is off
    in this configuration); written so diffusers reads the folder with no missing weight."""
    from safetensors.torch import load_file, save_file

    path = folder / "diffusion_pytorch_model.safetensors"
    state = load_file(str(path))
    g = torch.Generator().manual_seed(DEMO_SEED + 3)
    state["raymap_embedder.proj.weight"] = 0.02 * torch.randn(hidden, 3, 1, 1, 1, generator=g)
    state["raymap_embedder.proj.bias"] = torch.zeros(hidden)
    save_file(state, str(path))


def _train_tokenizer() -> Any:
    return train_gemma_tokenizer(CORPUS, vocab_size=600, model_max_length=4096)


def _write_text_encoder(folder: Path, vocab: int) -> None:
    from transformers import Gemma2Config, Gemma2Model

    config = Gemma2Config(vocab_size=vocab, hidden_size=TEXT_HIDDEN, intermediate_size=2 * TEXT_HIDDEN,
                          num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                          max_position_embeddings=4096, sliding_window=64)
    torch.manual_seed(DEMO_SEED + 2)
    model = Gemma2Model(config)
    with torch.no_grad():  # loud embeddings: the prompt moves the video instead of vanishing in the norms
        model.get_input_embeddings().weight.mul_(5.0)
    model.save_pretrained(str(folder))


ensure_demo_checkpoint = DemoCheckpoint(DEMO_ID, DEMO_VERSION, write_demo_checkpoint).ensure
