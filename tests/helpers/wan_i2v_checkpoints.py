"""Tiny Wan image-to-video checkpoints (Wan2.1 I2V / first-last-frame) written by diffusers + transformers.

The CLIP vision tower and its processor are built by transformers at a tiny size; the image
path's weights are scaled up so a dropped or wrong image conditioning moves frames visibly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from tests.helpers.wan_checkpoints import TINY_A, TinyWan, _scheduler_kwargs, reference_parts, reference_transformer

CLIP_SIZE = 32  # processor output side; with patch 8 -> 16 patches + CLS = 17 tokens
CLIP = dict(hidden_size=24, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
            image_size=CLIP_SIZE, patch_size=8, projection_dim=16)
CLIP_TOKENS = (CLIP_SIZE // 8) ** 2 + 1


def i2v_transformer_kwargs(spec: TinyWan, first_last: bool) -> dict:
    """The spec's DiT as an I2V DiT: noise + 4 mask + condition channels in, CLIP cross-attention."""
    t = dict(spec.transformer)
    z = spec.vae["z_dim"]
    inner = t["num_attention_heads"] * t["attention_head_dim"]
    t.update(in_channels=2 * z + 4, out_channels=z, image_dim=CLIP["hidden_size"], added_kv_proj_dim=inner)
    if first_last:
        t["pos_embed_seq_len"] = 2 * CLIP_TOKENS
    return t


def _clip(seed: int):
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    torch.manual_seed(seed)
    model = CLIPVisionModel(CLIPVisionConfig(**CLIP)).eval()
    processor = CLIPImageProcessor(size={"shortest_edge": CLIP_SIZE}, crop_size={"height": CLIP_SIZE, "width": CLIP_SIZE})
    return model, processor


def _amplify_image_path(transformer: torch.nn.Module, factor: float = 4.0) -> None:
    # Random init makes the image tokens a small part of cross-attention; scale their path up.
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "image_embedder" in name or "add_k_proj" in name or "add_v_proj" in name:
                p.mul_(factor)


def write_tiny_wan_i2v(folder: Path, spec: TinyWan = TINY_A, first_last: bool = False, seed: int = 0) -> Path:
    """Save a WanImageToVideoPipeline folder (Wan2.1 layout: CLIP encoder + I2V DiT)."""
    from diffusers import UniPCMultistepScheduler, WanImageToVideoPipeline

    transformer = reference_transformer(i2v_transformer_kwargs(spec, first_last), seed)
    _amplify_image_path(transformer)
    parts = reference_parts(spec, seed)
    image_encoder, image_processor = _clip(seed + 2)
    pipe = WanImageToVideoPipeline(
        **parts, scheduler=UniPCMultistepScheduler(**_scheduler_kwargs()),
        image_processor=image_processor, image_encoder=image_encoder, transformer=transformer,
    )
    pipe.save_pretrained(str(folder))
    return folder


def make_image(width: int, height: int, seed: int) -> Image.Image:
    """A smooth colour image with structure (gradients + blobs), so resizing and CLIP see content."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    channels = [np.sin(6.0 * (a * x + b * y) + c) for a, b, c in rng.uniform(-1, 1, (3, 3))]
    pixels = (np.stack(channels, axis=-1) * 0.5 + 0.5) * 255.0
    return Image.fromarray(pixels.astype(np.uint8), "RGB")
