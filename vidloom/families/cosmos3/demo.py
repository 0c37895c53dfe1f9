"""cosmos3-demo: the Cosmos3 Omni architecture at a tiny size with seeded random weights.

One folder, one instance: chat through the understanding pathway (a ChatML template and the special
tokens the recipe reads), reasoning before generation, text to image/video through the generation
pathways over the same backbone, a Wan2.2-style VAE, and a soundtrack from the sound pathway and its
AVAE decoder. Written once into the user's cache as a Cosmos3OmniPipeline folder with our own modules
and loaded through the same loader as real checkpoints. Its weights are random: output is noise by design.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from vidloom.core.card import ModelCard, RecipeSpec, SamplingDefaults
from vidloom.loading.name_map import NameMap
from vidloom.families.cosmos3.audio import SoundDecoder, SoundDecoderConfig
from vidloom.families.cosmos3.config import Cosmos3TextConfig
from vidloom.families.cosmos3.gen_config import Cosmos3GenConfig
from vidloom.families.cosmos3.generation import GEN_NAME_MAP, Cosmos3Generator
from vidloom.families.cosmos3.transformer import TEXT_NAME_MAP, Cosmos3Transformer
from vidloom.models.wan.vae import WAN_VAE_NAME_MAP, WanVAE, WanVAEConfig
from vidloom.families.cosmos3.cards import AR_LOOP, cosmos3_card
from vidloom.families.cosmos3.prompts import VISION_START
from vidloom.demo.cache import DemoCheckpoint, fill_zeros, noise_note, save_merged, write_json
from vidloom.demo.tokenizer import CHATML_TEMPLATE, train_chat_tokenizer
from vidloom.demo.writer import Part, latent_stats_config, model_index, write_part, write_pipeline_files

DEMO_ID = "cosmos3-demo"
DEMO_VERSION = 1  # bump when the demo's architecture or files change
DEMO_SEED = 20260301
DEMO_NOTE = noise_note(DEMO_ID, "Cosmos3 Omni", "nvidia/Cosmos3-Nano")

CHAT_TEMPLATE = CHATML_TEMPLATE  # as Qwen3-VL-based Cosmos3 checkpoints ship it
# The pad first (train_chat_tokenizer's rule); VISION_START opens the generated modalities.
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", VISION_START, "<|vision_end|>",
            "<|image_pad|>", "<|video_pad|>")
CORPUS = (
    "a red fox jumps over the lazy dog in the snow", "what is in this picture? tell me a story about robots",
    "the quick brown fox. hello world! 1 2 3 4 5 6 7 8 9 0", "system user assistant you are a helpful assistant",
    "cosmos predicts the future of the physical world", "a robot arm picks up a cup and places it on a shelf",
)
VOCAB_PAD = 16  # transformer rows past the tokenizer's vocabulary, as in the released checkpoints
SOUND_DIM = 8
DEMO_TRANSFORMER = {
    "hidden_size": 32, "head_dim": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
    "num_hidden_layers": 2, "rope_theta": 10000.0, "rope_axes_dim": [2, 1, 1], "latent_channel": 4,
    "patch_latent_dim": 16, "rms_norm_eps": 1e-6, "sound_gen": True, "sound_dim": SOUND_DIM,
}
# A Wan2.2-style VAE (residual, 2x2 patchified pixels, 16x space, 4x time), narrow.
DEMO_VAE = {
    "_class_name": "AutoencoderKLWan",
    "base_dim": 8, "z_dim": 4, "dim_mult": [1, 2, 2, 2], "num_res_blocks": 1, "attn_scales": [],
    "temperal_downsample": [False, True, True], "dropout": 0.0, "is_residual": True, "patch_size": 2,
    "in_channels": 12, "out_channels": 12, "scale_factor_spatial": 16, "scale_factor_temporal": 4,
}
# 8 kHz (the lowest rate AAC takes); strides (4, 5): 20 samples per latent step.
DEMO_SOUND_TOKENIZER = {
    "_class_name": "Cosmos3AVAEAudioTokenizer", "sampling_rate": 8000, "vocoder_input_dim": SOUND_DIM,
    "dec_dim": 4, "dec_c_mults": [1, 2], "dec_strides": [4, 5], "dec_out_channels": 2, "encoder_enabled": False,
}
# The released checkpoints' scheduler: Karras sigmas over flow sigmas (Cosmos3-Nano scheduler_config.json).
DEMO_SCHEDULER = {
    "_class_name": "UniPCMultistepScheduler", "num_train_timesteps": 1000, "prediction_type": "flow_prediction",
    "use_flow_sigmas": True, "use_karras_sigmas": True, "sigma_min": 0.147, "sigma_max": 200.0,
    "flow_shift": 1.0, "final_sigmas_type": "zero", "solver_order": 2, "solver_type": "bh2",
}
MODEL_INDEX = model_index(
    "Cosmos3OmniPipeline",
    transformer="diffusers:Cosmos3OmniTransformer", text_tokenizer="transformers:Qwen2TokenizerFast",
    vae="diffusers:AutoencoderKLWan", scheduler="diffusers:UniPCMultistepScheduler",
    sound_tokenizer="diffusers:Cosmos3AVAEAudioTokenizer", safety_checker=[None, None],
    enable_safety_checker=False,  # the guardrail is not part of a random-weight demo
)
DEMO_DEFAULTS = SamplingDefaults(
    height=64, width=64, num_frames=9, fps=8, num_inference_steps=6,
    guidance_scale=6.0, flow_shift=1.0, sampler="unipc", negative_prompt="",
)


def demo_card() -> ModelCard:
    card = cosmos3_card(
        DEMO_ID, f"demo:{DEMO_ID}", generates=True, sound=True, defaults=DEMO_DEFAULTS, precision="float32",
        description="Cosmos3 Omni (chat, reason, text to image/video with sound) at a tiny size, random weights",
        notes=(DEMO_NOTE,),
    )
    return dataclasses.replace(card, recipe=RecipeSpec(method="random-init", loop=AR_LOOP))


def write_demo_checkpoint(folder: Path) -> None:
    """A Cosmos3OmniPipeline folder from our own modules (diffusers can load it too)."""
    write_backbone(folder, DEMO_TRANSFORMER, DEMO_SEED)
    torch.manual_seed(DEMO_SEED + 3)
    write_part(folder, Part("sound_tokenizer", _sound_holder, NameMap(()), DEMO_SOUND_TOKENIZER, fill_std=0.3))
    write_pipeline_files(folder, DEMO_SCHEDULER, MODEL_INDEX)


def write_backbone(folder: Path, transformer: dict, seed: int) -> None:
    """The tokenizer, both transformer pathways and the VAE: what every Cosmos3 demo holds."""
    tokenizer = train_chat_tokenizer(CORPUS, SPECIALS, CHAT_TEMPLATE)
    tokenizer.save_pretrained(str(folder / "text_tokenizer"))
    write_transformer(folder / "transformer", {**transformer, "vocab_size": len(tokenizer) + VOCAB_PAD}, seed)
    vae = {**DEMO_VAE, **latent_stats_config(seed + 1, DEMO_VAE["z_dim"])}
    torch.manual_seed(seed + 2)
    write_part(folder, Part("vae", lambda: WanVAE(WanVAEConfig.from_diffusers(vae)), WAN_VAE_NAME_MAP, fill_std=None))


def write_transformer(folder: Path, config: dict, seed: int = DEMO_SEED) -> None:
    """Both pathways of Cosmos3OmniTransformer in one file, as the released checkpoints hold them."""
    torch.manual_seed(seed)
    text = Cosmos3Transformer(Cosmos3TextConfig.from_transformer_config(config))
    generator = Cosmos3Generator(Cosmos3GenConfig.from_transformer_config(config))
    with torch.no_grad():
        # Unit-scale embeddings: random chat answers vary token by token instead of repeating one id.
        text.embed.weight.normal_(0.0, 1.0)
        if generator.config.actions:  # per-domain weights as unit-gain linears, not N(0, 1) embedding rows
            for head in (generator.action_proj_in, generator.action_proj_out):
                head.fc.weight.div_(head.in_features ** 0.5)
    for module in (text, generator):
        fill_zeros(module)
    save_merged(folder, ((text, TEXT_NAME_MAP), (generator, GEN_NAME_MAP)))
    write_json(folder / "config.json", {"_class_name": "Cosmos3OmniTransformer", **config})


def _sound_holder() -> torch.nn.Module:
    """The AVAE decoder under `decoder.*` (the checkpoint's keys); its convolutions start as zero weight-norm
    directions (they exist to be loaded), which the part's fill of 0.3 turns into noise."""
    holder = torch.nn.Module()
    holder.decoder = SoundDecoder(SoundDecoderConfig.from_diffusers(DEMO_SOUND_TOKENIZER))
    return holder


ensure_demo_checkpoint = DemoCheckpoint(DEMO_ID, DEMO_VERSION, write_demo_checkpoint).ensure
