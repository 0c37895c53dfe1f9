"""The built-in demo model: the real Wan2.1 architecture at a tiny size, random weights.

It is written once, as a diffusers-format checkpoint, into the user's cache dir and
then loaded through the same loader as real checkpoints, so the first command a new
user runs exercises the real path. Its weights are random: the video is noise-like.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom.core.card import ModelCard, SamplingDefaults
from vidloom.loading.safetensors_io import save_weights
from vidloom.models.wan.transformer import WanTransformer
from vidloom.models.wan.transformer_config import WAN_TRANSFORMER_NAME_MAP, WanTransformerConfig
from vidloom.models.wan.vae import WAN21_LATENTS_MEAN, WAN21_LATENTS_STD, WAN_VAE_NAME_MAP, WanVAE, WanVAEConfig
from vidloom.demo.cache import ensure_written, fill_zeros, unigram_vocab, write_json
from vidloom.families.wan.cards import wan_t2v_card

DEMO_ID = "wan2.1-demo"
DEMO_VERSION = 2  # bump when the demo's architecture or files change
DEMO_SEED = 20250225

DEMO_NOTE = (
    "wan2.1-demo has RANDOM weights (the real Wan2.1 architecture at a tiny size): its video is "
    "noise-like. For real videos pass a Wan2.1 Diffusers checkpoint directory with --model, "
    "e.g. one downloaded from Wan-AI/Wan2.1-T2V-1.3B-Diffusers."
)

DEMO_TRANSFORMER = {
    "_class_name": "WanTransformer3DModel",
    "patch_size": [1, 2, 2], "num_attention_heads": 4, "attention_head_dim": 16,
    "in_channels": 16, "out_channels": 16, "text_dim": 64, "freq_dim": 64, "ffn_dim": 128,
    "num_layers": 2, "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "eps": 1e-6,
    "image_dim": None, "added_kv_proj_dim": None, "rope_max_seq_len": 1024,
}
DEMO_VAE = {
    "_class_name": "AutoencoderKLWan",
    "base_dim": 16, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 1,
    "attn_scales": [], "temperal_downsample": [False, True, True], "dropout": 0.0,
    # Wan2.1's real latent statistics, so the demo's normalisation has the real scale.
    "latents_mean": list(WAN21_LATENTS_MEAN), "latents_std": list(WAN21_LATENTS_STD),
}
DEMO_TEXT_ENCODER = {
    "d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2, "num_heads": 4,
    "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
    "feed_forward_proj": "gated-gelu", "dropout_rate": 0.0,
}
# Wan2.1's scheduler config (Wan-AI/Wan2.1-T2V-1.3B-Diffusers, scheduler/scheduler_config.json).
WAN21_SCHEDULER = {
    "_class_name": "UniPCMultistepScheduler", "num_train_timesteps": 1000,
    "prediction_type": "flow_prediction", "use_flow_sigmas": True, "flow_shift": 3.0,
    "solver_order": 2, "solver_type": "bh2", "predict_x0": True, "lower_order_final": True,
    "disable_corrector": [], "final_sigmas_type": "zero", "timestep_spacing": "linspace",
    "steps_offset": 0, "thresholding": False, "beta_schedule": "linear", "beta_start": 0.0001,
    "beta_end": 0.02, "use_karras_sigmas": False, "use_exponential_sigmas": False,
    "use_beta_sigmas": False, "rescale_betas_zero_snr": False, "solver_p": None,
    "sample_max_value": 1.0, "dynamic_thresholding_ratio": 0.995,
}
MODEL_INDEX = {
    "_class_name": "WanPipeline",
    "scheduler": ["diffusers", "UniPCMultistepScheduler"],
    "text_encoder": ["transformers", "UMT5EncoderModel"],
    "tokenizer": ["transformers", "T5TokenizerFast"],
    "transformer": ["diffusers", "WanTransformer3DModel"],
    "vae": ["diffusers", "AutoencoderKLWan"],
}
DEMO_DEFAULTS = SamplingDefaults(
    height=128, width=192, num_frames=17, fps=8, num_inference_steps=8,
    guidance_scale=5.0, flow_shift=3.0, sampler="unipc", negative_prompt="",
)
# Sentences the demo tokenizer's vocabulary is counted from (offline; see train_tokenizer).
TOKENIZER_CORPUS = (
    "a cat walks along the beach at sunset", "a red fox jumps over a frozen river",
    "the camera pans slowly across snowy mountains", "two dogs play in a green park",
    "a city street at night with neon lights and rain", "waves crash against the rocks",
    "a astronaut floats inside a space station", "a timelapse of clouds over a desert",
    "close up of a flower opening in the morning light", "a train crosses a bridge in autumn",
    "children fly kites on a windy hill", "a drone shot of a forest and a lake",
)
TOKENIZER_VOCAB = 256  # at most this many tokens, specials included


def demo_card() -> ModelCard:
    return wan_t2v_card(
        DEMO_ID, f"demo:{DEMO_ID}", DEMO_DEFAULTS,
        precision="float32", method="random-init",
        description="Wan2.1 T2V architecture at a tiny size with seeded random weights (runs on CPU in seconds)",
        notes=(DEMO_NOTE,),
    )


def ensure_demo_checkpoint(cache_dir: Path) -> Path:
    """Return the demo checkpoint folder, writing it first if this cache has none."""
    return ensure_written(cache_dir, f"{DEMO_ID}-v{DEMO_VERSION}", write_demo_checkpoint)


def write_demo_checkpoint(folder: Path) -> None:
    """Write the demo as a diffusers WanPipeline folder (loadable by diffusers too)."""
    torch.manual_seed(DEMO_SEED)
    transformer = WanTransformer(WanTransformerConfig.from_diffusers(DEMO_TRANSFORMER))
    fill_zeros(transformer)
    save_weights(transformer, folder / "transformer", WAN_TRANSFORMER_NAME_MAP)
    write_json(folder / "transformer" / "config.json", transformer.config.to_diffusers())

    vae = WanVAE(WanVAEConfig.from_diffusers(DEMO_VAE))
    save_weights(vae, folder / "vae", WAN_VAE_NAME_MAP)
    write_json(folder / "vae" / "config.json", vae.config.to_diffusers())

    tokenizer = train_tokenizer()
    tokenizer.save_pretrained(str(folder / "tokenizer"))
    write_text_encoder(folder / "text_encoder", vocab_size=len(tokenizer))
    write_json(folder / "scheduler" / "scheduler_config.json", WAN21_SCHEDULER)
    write_json(folder / "model_index.json", MODEL_INDEX)


def train_tokenizer():
    """A small Unigram tokenizer counted offline from TOKENIZER_CORPUS (see unigram_vocab), saved in T5 form.

    The same on every call, so every fresh write of a checkpoint that holds it gives the same files."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import T5TokenizerFast

    specials = ["<pad>", "</s>", "<unk>"]
    normalizer, pre_tokenizer = normalizers.NFKC(), pre_tokenizers.Metaspace()
    words = [word for line in TOKENIZER_CORPUS
             for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(line))]
    vocab = [(token, 0.0) for token in specials] + unigram_vocab(words, TOKENIZER_VOCAB - len(specials))
    tok = Tokenizer(models.Unigram(vocab, unk_id=specials.index("<unk>"), byte_fallback=False))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.Metaspace()
    tok.add_special_tokens(specials)
    eos = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", eos)]
    )
    return T5TokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", extra_ids=0)


def write_text_encoder(folder: Path, vocab_size: int) -> None:
    """The demo's UMT5 text encoder (random weights, built by transformers from a config)."""
    from transformers import UMT5Config, UMT5EncoderModel

    config = UMT5Config(vocab_size=vocab_size, **DEMO_TEXT_ENCODER)
    torch.manual_seed(DEMO_SEED + 1)
    UMT5EncoderModel(config).save_pretrained(str(folder))
