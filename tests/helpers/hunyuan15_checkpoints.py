"""Tiny HunyuanVideo-1.5 pieces for parity tests: transformer configs that differ in what an implementation could
get wrong (patch sizes, heads, depth, meanflow), built with diffusers' own classes and saved like a checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

TINY_TRANSFORMERS: dict[str, dict[str, Any]] = {
    # one temporal x spatial patch of 1, two heads, rope axes of unequal widths
    "p1": dict(in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=2,
               num_refiner_layers=1, mlp_ratio=4.0, patch_size=1, patch_size_t=1, text_embed_dim=24,
               text_embed_2_dim=20, image_embed_dim=12, rope_axes_dim=(4, 6, 6), target_size=64, task_type="t2v"),
    # spatial patch 2, temporal patch 2, three heads, three blocks, two refiner blocks, meanflow
    "p2": dict(in_channels=5, out_channels=2, num_attention_heads=3, attention_head_dim=8, num_layers=3,
               num_refiner_layers=2, mlp_ratio=2.0, patch_size=2, patch_size_t=2, text_embed_dim=16,
               text_embed_2_dim=12, image_embed_dim=10, rope_axes_dim=(2, 2, 4), target_size=64, task_type="i2v",
               use_meanflow=True),
}


def perturb(module: torch.nn.Module, seed: int) -> None:
    """diffusers zero-initialises some projections; a small random offset keeps every path live while activations
    stay far from float32 denormals."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def build_transformer(name: str, seed: int = 0):
    """diffusers' HunyuanVideo15Transformer3DModel for TINY_TRANSFORMERS[name], every weight perturbed."""
    from diffusers import HunyuanVideo15Transformer3DModel

    torch.manual_seed(seed)
    model = HunyuanVideo15Transformer3DModel(**TINY_TRANSFORMERS[name]).eval()
    perturb(model, seed + 1)
    return model


def save_transformer(name: str, folder: Path, seed: int = 0):
    """The reference transformer, saved to `folder` (config.json + safetensors); returns it."""
    model = build_transformer(name, seed)
    model.save_pretrained(str(folder))
    return model


def text_encoders(text_hidden: int, glyph_dim: int, seed: int = 0) -> dict[str, Any]:
    """The four text components of a HunyuanVideo15Pipeline: an offline Qwen2 tokenizer with a chat template, a
    random Qwen2.5-VL text model (loud embeddings, so the prompt moves the output), ByT5's byte tokenizer and a
    random T5 encoder of width `glyph_dim`."""
    from transformers import ByT5Tokenizer, Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel, T5Config, T5EncoderModel

    from tests.helpers.flux2_checkpoints import train_qwen_tokenizer

    torch.manual_seed(seed)
    tokenizer = train_qwen_tokenizer()
    half = text_hidden // 4  # two heads: head_dim // 2 rotary pairs, split over (t, h, w)
    mrope = [half - 2 * (half // 3), half // 3, half // 3]
    model = Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(
        hidden_size=text_hidden, intermediate_size=2 * text_hidden, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=len(tokenizer),
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": mrope})).eval()
    glyph_tokenizer = ByT5Tokenizer()
    glyph = T5EncoderModel(T5Config(vocab_size=len(glyph_tokenizer), d_model=glyph_dim, d_kv=8, d_ff=2 * glyph_dim,
                                    num_layers=2, num_heads=2, feed_forward_proj="gated-gelu")).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(10.0)
    return dict(tokenizer=tokenizer, text_encoder=model, tokenizer_2=glyph_tokenizer, text_encoder_2=glyph)


def save_text_encoders(folder: Path, text_hidden: int, glyph_dim: int, seed: int = 0) -> dict[str, Any]:
    parts = text_encoders(text_hidden, glyph_dim, seed)
    for name, part in parts.items():
        part.save_pretrained(str(folder / name))
    return parts


# Two tiny pipelines: transformer config, text widths, VAE latent layout, scheduler shift and guider settings.
TINY_PIPELINES: dict[str, dict[str, Any]] = {
    "p1": dict(transformer="p1", latent_channels=4, spatial=8, shift=5.0,
               guider=dict(guidance_scale=6.0)),
    "p2": dict(transformer="p2", latent_channels=2, spatial=8, shift=7.0,
               guider=dict(guidance_scale=3.5, guidance_rescale=0.7, start=0.25)),
}


def build_pipeline(name: str, seed: int = 0):
    """A tiny random HunyuanVideo15Pipeline (diffusers' own classes throughout)."""
    from diffusers import (
        AutoencoderKLHunyuanVideo15, ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler, HunyuanVideo15Pipeline,
    )

    spec = TINY_PIPELINES[name]
    dit = TINY_TRANSFORMERS[spec["transformer"]]
    transformer = build_transformer(spec["transformer"], seed)
    blocks = {8: (8, 8, 8, 8), 16: (8, 8, 8, 8, 8)}[spec["spatial"]]
    vae = AutoencoderKLHunyuanVideo15(latent_channels=spec["latent_channels"], block_out_channels=blocks,
                                      layers_per_block=1, spatial_compression_ratio=spec["spatial"]).eval()
    texts = text_encoders(dit["text_embed_dim"], dit["text_embed_2_dim"], seed)
    return HunyuanVideo15Pipeline(transformer=transformer, vae=vae,
                                  scheduler=FlowMatchEulerDiscreteScheduler(shift=spec["shift"]),
                                  guider=ClassifierFreeGuidance(**spec["guider"]), **texts)


def write_pipeline(folder: Path, name: str, seed: int = 0):
    pipe = build_pipeline(name, seed)
    pipe.save_pretrained(str(folder))
    return pipe


def run_until_latents(program, request) -> torch.Tensor:
    """Every node of `program` that runs for `request` but decode, the loop driven step by step as the runtime
    drives it (under inference mode, as the runtime runs nodes and steps): the final latents."""
    from types import SimpleNamespace

    from vidloom.core.loop import DONE

    ctx = SimpleNamespace(progress=lambda *a: None, captures_steps=False)  # a plain (eager) run
    slots: dict = {"request": request}
    with torch.inference_mode():
        _run_nodes(program, request, slots, ctx, DONE)
    return slots["latents"]


def _run_nodes(program, request, slots: dict, ctx, done) -> None:
    for node in program.nodes:
        if node.name == "decode" or (node.when is not None and not node.when(request)):
            continue
        if node.loop is None:
            slots.update(node.run(slots, ctx))
            continue
        state = node.loop.init(slots, ctx)
        while (plan := node.loop.next(state)) is not done:
            state = node.loop.advance(state, plan.call(**plan.inputs))
        slots.update(node.loop.finalize(state))


def image_encoder(hidden: int, seed: int = 0) -> dict[str, Any]:
    """A random SigLIP vision tower of width `hidden` (32 px, 8 px patches: 16 tokens) and its PIL processor."""
    from transformers import SiglipImageProcessorPil, SiglipVisionConfig, SiglipVisionModel

    torch.manual_seed(seed)
    model = SiglipVisionModel(SiglipVisionConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                                                 num_attention_heads=2, image_size=32, patch_size=8)).eval()
    return dict(image_encoder=model, feature_extractor=SiglipImageProcessorPil(size={"height": 32, "width": 32}))


def write_i2v_pipeline(folder: Path, name: str, seed: int = 0):
    """A tiny random HunyuanVideo15ImageToVideoPipeline: the T2V parts of TINY_PIPELINES[name] plus SigLIP."""
    from diffusers import HunyuanVideo15ImageToVideoPipeline

    t2v = build_pipeline(name, seed)
    parts = {key: getattr(t2v, key) for key in ("transformer", "vae", "scheduler", "guider", "tokenizer",
                                                "text_encoder", "tokenizer_2", "text_encoder_2")}
    images = image_encoder(TINY_TRANSFORMERS[TINY_PIPELINES[name]["transformer"]]["image_embed_dim"], seed)
    pipe = HunyuanVideo15ImageToVideoPipeline(**parts, **images)
    pipe.save_pretrained(str(folder))
    return pipe


def system_turn_tokens(tokenizer) -> int:
    """The tiny tokenizer's count of the template's system turn and user header: the crop the pipeline hard-codes
    as 108 (Qwen2.5-VL's count), to set on a reference pipeline built with the tiny tokenizer."""
    from vidloom.families.hunyuan15.text import SYSTEM_MESSAGE

    return len(tokenizer(f"<|im_start|>system\n{SYSTEM_MESSAGE}<|im_end|>\n<|im_start|>user\n")["input_ids"])
