"""Qwen-Image: its MMDiT transformer (our own), Wan's VAE architecture, the Qwen2.5-VL text path, cards, loading,
loop and program (text to image with true CFG)."""

from __future__ import annotations

from vidloom.core.family import Family

FAMILY = Family(
    package=__name__,
    card_families=("qwen_image",),
    demos={"qwen-image-demo": ".demo"},
    pipelines={"QwenImagePipeline": ".cards:card_from_checkpoint"},
    parity=None,
)
