"""Tiny Cosmos3 Omni checkpoints (random weights, offline tokenizer) and the matching transformers reasoner.

The folder is written by `Cosmos3OmniPipeline.save_pretrained` (safety checker disabled: `cosmos_guardrail`
is not installable here), so loading it tests our checkpoint reader too. The reasoner
(`Cosmos3OmniForConditionalGeneration`) gets the transformer's understanding-pathway weights under
transformers' names; its vision tower keeps random weights (the diffusers checkpoint carries none).
The transformer's vocabulary is padded past the tokenizer's, as in the released checkpoints.
"""

from __future__ import annotations

import inspect
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vidloom.families.cosmos3.demo import CHAT_TEMPLATE  # the demo's: the released template's rendering

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|image_pad|>", "<|video_pad|>"]
# Cosmos3-Nano's scheduler/scheduler_config.json (Cosmos3-Edge's is identical): the published values the
# issue quotes (Karras sigmas over flow sigmas, 0.147..200, shift 1, bh2 order 2, final sigma zero), with
# the flow-matching settings every Cosmos3 checkpoint needs (flow prediction over 1000 training steps).
COSMOS3_NANO_SCHEDULER: dict[str, Any] = {
    "_class_name": "UniPCMultistepScheduler",
    "num_train_timesteps": 1000,
    "prediction_type": "flow_prediction",
    "use_flow_sigmas": True,
    "use_karras_sigmas": True,
    "sigma_min": 0.147,
    "sigma_max": 200.0,
    "flow_shift": 1.0,
    "final_sigmas_type": "zero",
    "solver_order": 2,
    "solver_type": "bh2",
}
# The scheduler cosmos3-a keeps (Wan's flow UniPC at shift 5); COSMOS3_NANO_SCHEDULER is the real one.
WAN_STYLE_SCHEDULER: dict[str, Any] = {"_class_name": "UniPCMultistepScheduler", "prediction_type": "flow_prediction",
                                       "use_flow_sigmas": True, "flow_shift": 5.0}
CORPUS = [
    "a red fox jumps over the lazy dog in the snow",
    "what is in this picture? tell me a story about robots",
    "the quick brown fox. hello world! 1 2 3 4 5 6 7 8 9 0",
    "system user assistant you are a helpful assistant",
    "cosmos predicts the future of the physical world",
]


@dataclass(frozen=True)
class TinyCosmos3:
    """One tiny configuration of the Cosmos3 Omni transformer (text pathway sizes matter here)."""

    name: str
    transformer: dict[str, Any]
    vocab_pad: int = 37  # transformer rows past the tokenizer's vocabulary
    vae: dict[str, Any] = field(default_factory=lambda: dict(
        base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
        temperal_downsample=[False, True, True], dropout=0.0, is_residual=True, patch_size=2, in_channels=12,
        out_channels=12, scale_factor_spatial=16, scale_factor_temporal=4))
    scheduler: dict[str, Any] = field(default_factory=lambda: dict(WAN_STYLE_SCHEDULER))


COSMOS3_A = TinyCosmos3(
    name="cosmos3-a",
    transformer=dict(hidden_size=32, head_dim=8, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                     num_hidden_layers=2, rope_theta=10000.0, rope_axes_dim=(2, 1, 1), latent_channel=4,
                     patch_latent_dim=16, rms_norm_eps=1e-6),
)
COSMOS3_B = TinyCosmos3(
    name="cosmos3-b",
    transformer=dict(hidden_size=48, head_dim=16, num_attention_heads=6, num_key_value_heads=3,
                     intermediate_size=80, num_hidden_layers=3, rope_theta=5000000.0, rope_axes_dim=(4, 2, 2),
                     latent_channel=4, patch_latent_dim=16, rms_norm_eps=1e-5, attention_bias=True),
    vocab_pad=5,
    # The released VAE (Wan2.2's) decodes wider than it encodes (decoder_base_dim 256 vs base_dim 160).
    vae=dict(base_dim=8, decoder_base_dim=16, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
             temperal_downsample=[False, True, True], dropout=0.0, is_residual=True, patch_size=2, in_channels=12,
             out_channels=12, scale_factor_spatial=16, scale_factor_temporal=4),
    scheduler=COSMOS3_NANO_SCHEDULER,  # the released checkpoints' scheduler: Karras sigmas over flow sigmas
)
COSMOS3_CONFIGS = (COSMOS3_A, COSMOS3_B)


def train_tokenizer():
    """A byte-level BPE trained offline, saved as a Qwen2 tokenizer with Cosmos3's special tokens."""
    from tests.helpers.flux2_checkpoints import train_qwen_tokenizer

    return train_qwen_tokenizer(tuple(SPECIALS), CORPUS, vocab_size=320, chat_template=CHAT_TEMPLATE)


def build_transformer(spec: TinyCosmos3, vocab_size: int, seed: int = 0):
    """The diffusers transformer with random weights; norms and embeddings perturbed so none is inert."""
    from diffusers import Cosmos3OmniTransformer

    torch.manual_seed(seed)
    transformer = Cosmos3OmniTransformer(vocab_size=vocab_size, **spec.transformer).eval()
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "norm" in name:  # RMSNorm weights start at 1: a missing norm weight would go unnoticed
                p.add_(0.2 * torch.randn(p.shape, generator=g))
            elif name.startswith("embed_tokens") or name.startswith("lm_head"):
                p.mul_(0).add_(torch.randn(p.shape, generator=g))  # unit-scale logits: greedy ids differ per step
            elif p.ndim == 2:
                p.mul_(0).add_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
            else:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    return transformer


def build_pipeline(spec: TinyCosmos3, seed: int = 0, scheduler_config: dict[str, Any] | None = None,
                   **settings: Any):
    """The tiny pipeline; `settings` are Cosmos3OmniPipeline's model_index.json settings (e.g.
    default_use_system_prompt=False, use_native_flow_schedule=True)."""
    from diffusers import AutoencoderKLWan, Cosmos3OmniPipeline, UniPCMultistepScheduler

    tokenizer = train_tokenizer()
    transformer = build_transformer(spec, len(tokenizer) + spec.vocab_pad, seed)
    torch.manual_seed(seed + 1)
    # Real VAEs ship non-trivial latent statistics (the class defaults are Wan2.1's); 0 / 1 would let a
    # missing (de)normalisation pass unnoticed.
    z_dim, defaults = spec.vae["z_dim"], inspect.signature(AutoencoderKLWan.__init__).parameters
    vae = AutoencoderKLWan(**spec.vae, latents_mean=defaults["latents_mean"].default[:z_dim],
                           latents_std=defaults["latents_std"].default[:z_dim]).eval()
    scheduler = UniPCMultistepScheduler.from_config(scheduler_config or spec.scheduler)
    return Cosmos3OmniPipeline(transformer=transformer, text_tokenizer=tokenizer, vae=vae, scheduler=scheduler,
                               enable_safety_checker=False, **settings)


def write_tiny_cosmos3(folder: Path, spec: TinyCosmos3 = COSMOS3_A, seed: int = 0,
                       scheduler_config: dict[str, Any] | None = None, **settings: Any) -> Path:
    """Save a tiny Cosmos3OmniPipeline folder (model_index.json, transformer/, text_tokenizer/, vae/, scheduler/)."""
    build_pipeline(spec, seed, scheduler_config, **settings).save_pretrained(folder)
    return folder


def strip_generation(folder: Path) -> Path:
    """Make a written folder chat-only (the CHAT_ONLY card): its vae/ and scheduler/ removed, and recorded absent."""
    index = json.loads((folder / "model_index.json").read_text())
    for name in ("vae", "scheduler"):
        shutil.rmtree(folder / name)
        index[name] = [None, None]  # diffusers' record of an absent optional component
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


def reasoner_text_name(name: str) -> str:
    """transformers' name for a diffusers understanding-pathway weight (the oracle's side of the 1:1 map)."""
    renames = {".self_attn.to_q.": ".self_attn.q_proj.", ".self_attn.to_k.": ".self_attn.k_proj.",
               ".self_attn.to_v.": ".self_attn.v_proj.", ".self_attn.to_out.": ".self_attn.o_proj.",
               ".self_attn.norm_q.": ".self_attn.q_norm.", ".self_attn.norm_k.": ".self_attn.k_norm."}
    if name.startswith("lm_head."):
        return name
    for old, new in renames.items():
        name = name.replace(old, new)
    return "model.language_model." + name


def build_reasoner(transformer: Any, tokenizer: Any):
    """transformers' Cosmos3OmniForConditionalGeneration sharing `transformer`'s text-pathway weights."""
    from transformers import Cosmos3OmniConfig, Cosmos3OmniForConditionalGeneration

    c = transformer.config
    text = dict(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
                attention_bias=c.attention_bias, hidden_act=c.hidden_act, max_position_embeddings=512,
                rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta,
                                 "mrope_section": list(c.rope_axes_dim), "mrope_interleaved": True})
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=c.hidden_size,
                  patch_size=4, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16,
                  deepstack_visual_indexes=[0])
    ids = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    config = Cosmos3OmniConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **ids)
    config.text_config.eos_token_id = tokenizer.eos_token_id
    reasoner = Cosmos3OmniForConditionalGeneration(config).eval()
    ours = {k: v for k, v in transformer.state_dict().items() if _is_text_weight(k)}
    mapped = {reasoner_text_name(k): v for k, v in ours.items()}
    missing, unexpected = reasoner.load_state_dict(mapped, strict=False)
    assert not unexpected, unexpected
    assert all(k.startswith("model.visual.") for k in missing), [k for k in missing if "visual" not in k]
    reasoner.generation_config.eos_token_id = tokenizer.eos_token_id
    reasoner.generation_config.pad_token_id = tokenizer.pad_token_id
    return reasoner


def _is_text_weight(name: str) -> bool:
    if name.startswith(("embed_tokens.", "norm.", "lm_head.")):
        return True
    if not name.startswith("layers."):
        return False
    return not any(s in name for s in ("add_", "_moe_gen", "norm_added", "k_norm_und_for_gen"))
